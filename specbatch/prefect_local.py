"""Prefect settings for `specbatch submit` without a deployment: nothing to set up, nothing printed.

Applied to `os.environ` *before* prefect is imported (prefect reads its logging setup and analytics
switches at import). Two cases:

- `PREFECT_API_URL` is set in the environment: the run reports to that server, as any Prefect user
  expects; only Prefect's console logging is silenced (the CLI prints the progress and summary).
- otherwise the run is isolated: Prefect's temporary local server (a subprocess, stopped at exit)
  with its state in `OUTPUT/.prefect` (a SQLite database of flow runs, logs and artifacts; the job
  itself never depends on it, so it may be deleted at any time), the user's own profiles ignored,
  server analytics and SDK telemetry off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

QUIET = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",  # Prefect's console handler (root logger too)
    "PREFECT_LOGGING_LOG_PRINTS": "false",
}


def prefect_home(output: Path) -> Path:
    return Path(output).resolve() / ".prefect"


def local_prefect_env(output: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to set for a local run whose job directories go under `output`."""
    environ = os.environ if environ is None else environ
    quiet = {key: environ.get(key, value) for key, value in QUIET.items()}
    if environ.get("PREFECT_API_URL"):
        return quiet
    home = prefect_home(output)
    return {
        **quiet,
        "PREFECT_HOME": str(home),
        "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
        "PREFECT_API_URL": "",
        "PREFECT_SERVER_EPHEMERAL_ENABLED": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
        "DO_NOT_TRACK": "1",
    }


def apply_local_prefect_env(output: Path, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the variables (before `import prefect`); returns what was set."""
    environ = os.environ if environ is None else environ
    env = local_prefect_env(output, environ)
    for key, value in env.items():
        if value:
            environ[key] = value
        else:
            environ.pop(key, None)
    return env
