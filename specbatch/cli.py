"""The `specbatch` command line: parse, call into the package, print. Nothing else lives here."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Offline batch inference with exact, well-scheduled speculative decoding.")
models_app = typer.Typer(no_args_is_help=True, help="The bundled demo model pair.")
app.add_typer(models_app, name="models")
console = Console()
err = Console(stderr=True)

USAGE_ERRORS: tuple[type[Exception], ...] = ()


def _usage_errors() -> tuple[type[Exception], ...]:
    from specbatch.config import ConfigError
    from specbatch.data.ingest import DatasetError
    from specbatch.engine.loading import ModelLoadError
    from specbatch.job import JobError
    from specbatch.manifest import ManifestError

    return ConfigError, DatasetError, ModelLoadError, JobError, ManifestError


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _job_config(config: Path | None, overrides: list[str], **flags: str | None):
    from specbatch.config import load_config

    mapping = {"drafter": "drafter.kind", "lookahead": "scheduler.lookahead", "order": "scheduler.order",
               "prefill_chunk": "scheduler.prefill_chunk"}
    extra = [f"{mapping[name]}={value}" for name, value in flags.items() if value is not None]
    return load_config(config, [*extra, *overrides])


@app.command()
def submit(
    dataset: Annotated[Path, typer.Argument(help="JSONL, OpenAI batch JSONL, Parquet, or a HF dataset")],
    config: Annotated[Path | None, typer.Option(help="job config YAML (default: bundled pair on CPU)")] = None,
    job_id: Annotated[str | None, typer.Option(help="job directory name; reuse it to resume")] = None,
    output: Annotated[Path, typer.Option(help="where job directories go")] = Path("outputs"),
    drafter: Annotated[str | None, typer.Option(help="draft | ngram | none")] = None,
    lookahead: Annotated[str | None, typer.Option(help="fixed:K | adaptive | slack")] = None,
    order: Annotated[str | None, typer.Option(help="fcfs | sjf | laps-sd | specbatch")] = None,
    prefill_chunk: Annotated[str | None, typer.Option(help="fixed:N | deadline")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override any config field: key=value")] = [],  # noqa: B006
    dataset_format: Annotated[str | None, typer.Option("--format", help="force the input format")] = None,
    column: Annotated[list[str], typer.Option(help="column mapping field=source_column")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="resume even if the dataset changed")] = False,
) -> None:
    """Run a whole job and write everything under OUTPUT/JOB_ID/."""
    from specbatch import job as jobs

    try:
        job_config = _job_config(config, set_, drafter=drafter, lookahead=lookahead, order=order,
                                 prefill_chunk=prefill_chunk)
        job_id = jobs.check_job_id(job_id or f"job-{time.strftime('%Y%m%d-%H%M%S')}")
        column_map = dict(item.split("=", 1) for item in column) if column else None
        job_dir = output / job_id
        console.print(f"[bold]specbatch[/] job [cyan]{job_id}[/] → {job_dir}")
        manifest = jobs.prepare(dataset, job_dir, job_config, force, dataset_format, column_map)
    except _usage_errors() as error:
        _fail(str(error))
    try:
        summary = _run_with_progress(job_dir, job_config, manifest.dataset.num_records)
    except typer.Exit:
        raise
    except Exception as error:  # an internal failure: short message here, traceback in the job dir
        import traceback

        (job_dir / "error.log").write_text(traceback.format_exc())
        _fail(f"internal failure: {error!r} (traceback in {job_dir / 'error.log'}; the job can be resumed)", 1)
    _print_summary(summary)


def _run_with_progress(job_dir: Path, job_config, num_records: int):
    from specbatch import job as jobs
    from specbatch.engine.build import load_models
    from specbatch.ledger import committed_request_ids
    from specbatch.worker import run_worker

    try:
        models = load_models(job_config)
    except _usage_errors() as error:
        _fail(str(error))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    already = len(committed_request_ids(job_dir))
    started = time.perf_counter()
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]} tok/s  acceptance {task.fields[acceptance]}  dropped {task.fields[dropped]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("records", total=num_records, completed=already, rate="-", acceptance="-", dropped=0)

        def on_round(p) -> None:
            elapsed = max(time.perf_counter() - started, 1e-9)
            acceptance = f"{p.num_accepted / p.num_proposed:.2f}" if p.num_proposed else "-"
            bar.update(task, completed=already + p.num_done, rate=f"{p.num_committed_tokens / elapsed:.0f}",
                       acceptance=acceptance, dropped=p.num_dropped)

        try:
            run_worker(job_dir, job_config, models=models, stop_requested=stop, on_round=on_round)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    summary = jobs.finalize(job_dir)
    if stop.is_set():
        _print_summary(summary)
        err.print(f"stopped: in-flight requests were recorded as cancelled; run the same command to resume {job_dir.name}")
        raise typer.Exit(130)
    return summary


def _print_summary(summary) -> None:
    table = Table(title=f"job {summary.job_dir.name}", show_header=False)
    rows = [("records", summary.num_records), ("completed", summary.num_completed), ("dropped", summary.num_dropped),
            ("cancelled", summary.num_cancelled), ("output tokens", summary.num_output_tokens)]
    rows += [(f"  dropped: {reason}", count) for reason, count in sorted(summary.drop_reasons.items())]
    for name, value in rows:
        table.add_row(name, str(value))
    table.add_row("outputs", str(summary.job_dir))
    console.print(table)


@app.command()
def status(job: Annotated[str, typer.Argument(help="job id or job directory")],
           output: Annotated[Path, typer.Option(help="where job directories go")] = Path("outputs")) -> None:
    """Show a job's progress from its manifest and committed parts."""
    from specbatch.job import summarize
    from specbatch.manifest import load_manifest

    job_dir = Path(job) if Path(job).is_dir() else output / job
    try:
        manifest = load_manifest(job_dir)
    except (FileNotFoundError, *_usage_errors()) as error:
        _fail(f"no job at {job_dir}: {error}")
    summary = summarize(job_dir)
    shards = Table(title=f"job {manifest.job_id}: {manifest.status}")
    for column in ("shard", "records", "dropped at ingest", "status", "worker"):
        shards.add_column(column)
    for shard in manifest.shards:
        shards.add_row(shard.name, str(shard.num_records), str(shard.num_dropped), shard.status, str(shard.worker_id))
    console.print(shards)
    _print_summary(summary)
    console.print(_throughput_line(job_dir))


def _throughput_line(job_dir: Path) -> str:
    from specbatch.ledger import read_table

    rounds = read_table(job_dir, "rounds").select(["started_s", "round_ms", "num_committed"]).to_pydict()
    if not rounds["started_s"]:
        return "no rounds committed yet"
    span = max(s + ms / 1000 for s, ms in zip(rounds["started_s"], rounds["round_ms"])) - min(rounds["started_s"])
    return f"throughput so far: {sum(rounds['num_committed']) / max(span, 1e-9):.1f} committed tokens/s over {span:.1f} s"


@app.command()
def report(job_dirs: Annotated[list[Path], typer.Argument(help="one or more job directories")],
           baseline: Annotated[str | None, typer.Option(help="job id to compare against")] = None) -> None:
    """Throughput-versus-cost tables, report.md, plots and report.html (in the first job directory)."""
    from specbatch.report import ReportError, build_report

    try:
        path = build_report(list(job_dirs), baseline=baseline, console=console)
    except ReportError as error:
        _fail(str(error))
    console.print(f"report written to {path}")


@app.command()
def bench(
    prompts: Annotated[int, typer.Option(help="held-out prompts (half code, half prose)")] = 64,
    max_new_tokens: Annotated[int, typer.Option(help="largest max_new_tokens (drawn per request from 16..N)")] = 128,
    batch_size: Annotated[int, typer.Option(help="batch size for hf-generate and specbatch")] = 32,
    json_path: Annotated[Path | None, typer.Option("--json", help="write results as JSON")] = None,
    config: Annotated[Path | None, typer.Option(help="job config YAML")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override any config field: key=value")] = [],  # noqa: B006
    assisted_prompts: Annotated[int | None, typer.Option(help="prompts for hf-assisted (slow, batch 1)")] = None,
) -> None:
    """Benchmark specbatch against HF generate and HF assisted generation, side by side."""
    from specbatch.bench import run_bench, write_json

    try:
        results = run_bench(prompts, max_new_tokens, batch_size, config, set_, assisted_prompts, console)
    except _usage_errors() as error:
        _fail(str(error))
    if json_path is not None:
        write_json(results, json_path)


@models_app.command("path")
def models_path(which: Annotated[str, typer.Argument(help="target | draft")]) -> None:
    """Print the directory of the bundled target or draft model."""
    from specbatch.engine.loading import ModelLoadError, resolve_model_path

    if which not in ("target", "draft"):
        _fail("expected 'target' or 'draft'")
    try:
        typer.echo(str(resolve_model_path(f"bundled:{which}")))
    except ModelLoadError as error:
        _fail(str(error))


@models_app.command("train-demo")
def train_demo(
    output: Annotated[Path, typer.Option(help="where to write target/, draft/ and the model card")] = Path(
        "specbatch/models/demo"),
    target_steps: Annotated[int | None, typer.Option(help="override the recipe's target steps")] = None,
    draft_steps: Annotated[int | None, typer.Option(help="override the recipe's draft steps")] = None,
) -> None:
    """Train the bundled pair from the standard library's code and pydoc topics (the recipe)."""
    from dataclasses import replace

    from specbatch.models.train_demo import Recipe, write_model_card
    from specbatch.models.train_demo import train_demo as train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    recipe = Recipe()
    recipe = replace(recipe, target_steps=target_steps or recipe.target_steps, draft_steps=draft_steps or recipe.draft_steps)
    card = train(output, recipe)
    write_model_card(output, card)
    console.print(f"trained pair written to {output}")


if __name__ == "__main__":
    app()
