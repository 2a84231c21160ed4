"""`specbatch report`: DuckDB tables, report.md, plots and report.html over finished jobs."""

from __future__ import annotations

from typing import Annotated

import typer

from specbatch.cli.common import console, fail

commands = typer.Typer()


@commands.command()
def report(job_dirs: Annotated[list[str], typer.Argument(
               help="one or more job directories, or jobs' object-store URLs (s3://bucket/jobs/ID)")],
           baseline: Annotated[str | None, typer.Option(help="job id to compare against")] = None) -> None:
    """Throughput-versus-cost tables, report.md, plots and report.html (in the first job directory, or
    reports/JOB_ID/ for a job on an object store)."""
    from specbatch.report import ReportError, build_report

    try:
        path = build_report(list(job_dirs), baseline=baseline, console=console)
    except ReportError as error:
        fail(str(error))
    console.print(f"report written to {path}")
