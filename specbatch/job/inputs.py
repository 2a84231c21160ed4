"""What a job is asked to run on, checked before any work: its id, its dataset, its model paths.

Nothing here imports torch, transformers or Prefect, so `specbatch submit` refuses unusable input
(exit 2) in about a second, before it boots a Prefect server or loads a model.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.data.ingest import resolve_dataset
from specbatch.engine.model_paths import resolve_model_path

MAX_JOB_ID_CHARS = 128
_JOB_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_JOB_ID_CHARS - 1}}}")


class JobError(ValueError):
    """A job that cannot start as asked (changed dataset or config, bad job id, running); exit code 2."""


def default_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}"


def check_job_id(job_id: str) -> str:
    """A job id names a directory that DuckDB globs (`JOB/results/*.parquet`) and shells and part
    names quote: only [A-Za-z0-9._-], starting with a letter or digit, so no glob or list character
    (`*?[]{},`), no NUL, no path separator, no leading `-` or `.`. An empty id is refused by name: it is
    given (`--job-id ""`, a script's unset variable), not left out, so no generated id stands in for it."""
    if not job_id:
        raise JobError("job id is empty; give one of letters, digits, '.', '_' and '-', or none for a generated one")
    if not _JOB_ID.fullmatch(job_id):
        raise JobError(f"job id {job_id!r} may use only letters, digits, '.', '_' and '-', must start with a "
                       f"letter or digit and be at most {MAX_JOB_ID_CHARS} characters")
    return job_id


def check_inputs(dataset: str | Path, config: JobConfig, dataset_format: str | None = None,
                 column_map: dict[str, str] | None = None) -> None:
    """Cheap checks that fail before any work (and not in every worker process of every retry)."""
    resolve_dataset(str(dataset), dataset_format, column_map)
    resolve_model_path(config.models.target)
    if config.drafter.model_kind == "draft" and config.models.draft:
        resolve_model_path(config.models.draft)
    if config.drafter.model_kind == "eagle" and config.models.eagle:
        resolve_model_path(config.models.eagle)
