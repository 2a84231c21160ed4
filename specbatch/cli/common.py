"""What every command shares: the consoles, the exit-code table and the one way to fail.

Cheap to import on purpose: the usage errors are imported when asked for, so `specbatch --help`
loads neither torch nor prefect.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# The exit-code table (README "Exit codes"); every command exits with one of these.
EXIT_OK = 0  # the job ran; dropped records are reported, not errors
EXIT_INTERNAL = 1  # internal failure; the job can be resumed
EXIT_USAGE = 2  # unusable input or config, a refused config change, or the job is running; nothing was run
EXIT_STOPPED = 130  # stopped by Ctrl-C / SIGTERM, or requests left cancelled; run the same command to resume

console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one error line on stderr (no traceback) and exit with `code`."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def usage_errors() -> tuple[type[Exception], ...]:
    """The errors that mean the input or config is unusable (exit EXIT_USAGE), imported only when needed."""
    from specbatch.config import ConfigError
    from specbatch.data.ingest import DatasetError
    from specbatch.engine.model_paths import ModelLoadError
    from specbatch.job.inputs import JobError
    from specbatch.job.manifest import ManifestError

    return ConfigError, DatasetError, ModelLoadError, JobError, ManifestError
