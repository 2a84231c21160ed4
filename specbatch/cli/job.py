"""`specbatch submit` and `status`: run (or resume) a job, here or on a deployment, and watch it."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbatch.cli.common import EXIT_INTERNAL, EXIT_STOPPED, EXIT_USAGE, console, err, fail, usage_errors
from specbatch.storage import is_url, join, location_name

if TYPE_CHECKING:
    from specbatch.config import JobConfig
    from specbatch.job.finalize import JobSummary
    from specbatch.job.flow import LocalHooks
    from specbatch.job.worker import WorkerProgress

commands = typer.Typer()


@commands.command()
def submit(
    dataset: Annotated[str, typer.Argument(
        help="JSONL, OpenAI batch JSONL, Parquet, or a HF dataset; a path or an object-store URL (s3://...)")],
    config: Annotated[Path | None, typer.Option(help="job config YAML (default: bundled pair on CPU)")] = None,
    job_id: Annotated[str | None, typer.Option(help="job directory name; reuse it to resume")] = None,
    output: Annotated[str | None, typer.Option(
        help="where job directories go: a folder or an object-store URL such as s3://bucket/jobs "
             "(default: outputs; with --deployment, the deployment's)")] = None,
    drafter: Annotated[str | None, typer.Option(help="draft | eagle | ngram | suffix | none")] = None,
    lookahead: Annotated[str | None, typer.Option(help="fixed:K | adaptive | slack")] = None,
    order: Annotated[str | None, typer.Option(help="fcfs | sjf | laps-sd | specbatch")] = None,
    prefill_chunk: Annotated[str | None, typer.Option(help="fixed:N | deadline")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override any config field: key=value")] = [],  # noqa: B006
    dataset_format: Annotated[str | None, typer.Option("--format", help="force the input format")] = None,
    column: Annotated[list[str], typer.Option(help="column mapping field=source_column")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(
        help="resume even if the dataset, or a config field that changes outputs, changed")] = False,
    deployment: Annotated[str | None, typer.Option(
        help="start a run of this deployment (NAME or specbatch-job/NAME) on the Prefect API in "
             "PREFECT_API_URL instead of running here; paths must exist where its worker runs")] = None,
    wait: Annotated[bool, typer.Option(help="with --deployment: watch the run until it ends")] = False,
) -> None:
    """Run a whole job and write everything under OUTPUT/JOB_ID/.

    Runs the `specbatch-job` Prefect flow in this process, on Prefect's temporary local server with its
    state in OUTPUT/.prefect (or on the server in PREFECT_API_URL, when set). Exit codes: 0 the job ran,
    2 unusable input or config (or the job is running elsewhere), 1 internal failure, 130 stopped or
    requests left cancelled (run the same command to resume).
    """
    from specbatch.job.inputs import check_job_id, default_job_id

    with _sigterm_interrupts():  # from the first line: a SIGTERM while config, inputs or Prefect load is Ctrl-C
        job_dir: str | None = None
        try:
            overrides = _flag_overrides(set_, drafter=drafter, lookahead=lookahead, order=order,
                                        prefill_chunk=prefill_chunk)
            try:
                job_config = _job_config(config, overrides)  # validated here too: exit 2 before anything starts
                job_id = check_job_id(default_job_id() if job_id is None else job_id)
                column_map = _column_map(column)
                dataset, output = _expand_home(dataset), None if output is None else _expand_home(output)
                _check_output(output)
            except usage_errors() as error:
                fail(str(error))
            parameters = {"dataset": _absolute(dataset), "config": str(config.resolve()) if config else None,
                          "overrides": overrides, "job_id": job_id, "force": force,
                          "dataset_format": dataset_format, "column_map": column_map}
            if deployment is not None:
                _submit_deployment(deployment, {**parameters, "output": _absolute(output) if output else None}, wait)
                return
            output = output or "outputs"
            parameters["output"] = output
            job_dir = join(output, job_id)
            server = _start_prefect_and_check(parameters, job_config, job_dir,
                                              Path("outputs") if is_url(output) else Path(output))
            _convert_gguf_models(job_config)  # while the server boots
            state = _run_flow(parameters, server)
        except KeyboardInterrupt:
            if job_dir is None:
                err.print("interrupted before the job started; nothing was run")
            else:
                err.print(f"interrupted; run the same command to resume {location_name(job_dir)}")
            raise typer.Exit(EXIT_STOPPED) from None
    assert job_dir is not None
    _exit_as(state, job_dir)


def _run_flow(parameters: dict[str, Any], server: Any) -> Any:
    """The flow, in this process, with the progress bar; returns its final state."""
    from specbatch.job.flow import LocalHooks, local_hooks, specbatch_job

    hooks = LocalHooks(on_notice=lambda message: err.print(f"[yellow]warning:[/] {message}"))
    try:
        with _progress_bar(hooks), local_hooks(hooks):
            if server is not None:
                server.wait_ready()
            return specbatch_job(**parameters, return_state=True)  # the flow, in this process
    except KeyboardInterrupt:
        raise
    except Exception as error:  # Prefect itself failed (e.g. its local server did not start)
        fail(f"internal failure: {error!r}", EXIT_INTERNAL)


def _convert_gguf_models(job_config: JobConfig) -> None:
    """Convert the job's GGUF models into their cached folders now (once per file; a later load finds
    them): a file transformers cannot load is refused here, exit 2, instead of after Prefect's start
    and the flow's first task. Nothing for a job without GGUF models (no import of torch here)."""
    from specbatch.engine.model_paths import ModelLoadError, gguf_file

    models = job_config.models
    names = [models.target, models.tokenizer,
             models.draft if job_config.drafter.model_kind == "draft" else None]
    try:
        files = [file for name in names if name and (file := gguf_file(name)) is not None]
        if not files:
            return
        from specbatch.engine.gguf_models import converted_dir, is_converted

        for file in dict.fromkeys(files):
            if not is_converted(file):
                console.print(f"converting {file} into a cached Hugging Face folder (once per file)")
            converted_dir(file)
    except ModelLoadError as error:
        fail(str(error))


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a submit as Ctrl-C does, at any stage (exit 130, with a message): before and after
    the worker stage it interrupts; during it, the flow's own handler lets the workers commit first."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _absolute(location: str) -> str:
    """A local path made absolute (a deployment's worker runs elsewhere); a URL as it is."""
    return location if is_url(location) else str(Path(location).resolve())


def _flag_overrides(overrides: list[str], **flags: str | None) -> list[str]:
    """The shortcut flags as `--set` overrides; explicit `--set` values come last, so they win."""
    mapping = {"drafter": "drafter.kind", "lookahead": "scheduler.lookahead", "order": "scheduler.order",
               "prefill_chunk": "scheduler.prefill_chunk"}
    return [*(f"{mapping[name]}={value}" for name, value in flags.items() if value is not None), *overrides]


def _job_config(config: Path | None, overrides: list[str]) -> JobConfig:
    from specbatch.config import load_config

    return load_config(config, overrides)


def _column_map(column: list[str]) -> dict[str, str] | None:
    """field -> source column; a field mapped twice is refused, not settled by the last one given:
    which of two columns holds the prompts is for the user to say."""
    from specbatch.config import ConfigError

    if any("=" not in item for item in column):
        raise ConfigError(f"--column expects field=source_column, got {column}")
    pairs = [item.split("=", 1) for item in column]
    fields = [field for field, _ in pairs]
    twice = sorted({field for field in fields if fields.count(field) > 1})
    if twice:
        raise ConfigError(f"--column maps {', '.join(twice)} more than once: {column}")
    return dict(pairs) if pairs else None


def _expand_home(location: str) -> str:
    """A local path's leading `~` as the shell would expand it (a quoted one, from a script or a config,
    reached here as it is): the job was written under ./~ while the Parquet readers, expanding it, read
    the home folder, and the job failed on its first shard."""
    return location if is_url(location) else os.path.expanduser(location)


def _check_output(output: str | None) -> None:
    """`--output ""` is given, not left out: refused, not read as outputs/ (or a deployment's folder),
    where the job's results would land unlooked-for. A local output under a file (the folder, or one
    above it, is a file) is refused before anything starts, not met as a traceback on the first write."""
    from specbatch.config import ConfigError

    if output is not None and not output.strip():
        raise ConfigError("--output is empty; give a folder or an object-store URL, or leave it out for outputs/")
    if output is not None and not is_url(output):
        folder = Path(output)
        existing = next((path for path in (folder, *folder.parents) if path.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ConfigError(f"--output {output}: {existing} is a file, not a folder")


def _start_prefect_and_check(parameters: dict[str, Any], job_config: JobConfig, job_dir: str,
                             prefect_dir: Path) -> Any:
    """Fail fast on unusable input or a job that is running (before torch, transformers or Prefect
    import), then boot Prefect's local server (state under PREFECT_DIR, while torch and prefect
    import); returns the server to wait for, or None when PREFECT_API_URL names one."""
    from specbatch.job.inputs import check_inputs
    from specbatch.job.lock import check_not_running
    from specbatch.job.prefect_local import start_local_prefect

    try:
        check_not_running(job_dir)  # the flow takes the lock; this only fails before Prefect starts
        check_inputs(parameters["dataset"], job_config, parameters["dataset_format"], parameters["column_map"])
    except usage_errors() as error:
        fail(str(error))
    server = start_local_prefect(prefect_dir)
    console.print(f"[bold]specbatch[/] job [cyan]{location_name(job_dir)}[/] → {job_dir}")
    return server


def _exit_as(state: Any, job_dir: str) -> None:
    """Print the job's summary and exit with its code (0 when it ran to the end)."""
    from specbatch.job.flow import UNUSABLE_INPUT, summary_from_dict

    if state.name == UNUSABLE_INPUT:
        fail(state.message or "unusable input")
    if state.is_completed() or state.is_cancelled():
        _print_summary(summary_from_dict(state.result(raise_on_failure=False)))
    if state.is_cancelled():  # stopped, or ended with requests left cancelled (not a success either way)
        stopped = state.result(raise_on_failure=False).get("stopped")
        err.print(f"stopped: in-flight requests were recorded as cancelled; run the same command to resume "
                  f"{location_name(job_dir)}" if stopped else state.message)
        raise typer.Exit(EXIT_STOPPED)
    if not state.is_completed():
        fail(f"internal failure: {state.message} (details in {join(job_dir, 'error.log')} if written; "
             "the job can be resumed)", EXIT_INTERNAL)


@contextmanager
def _progress_bar(hooks: LocalHooks) -> Iterator[Progress]:
    """Show the hooks' progress: a spinner while Prefect starts and ingest runs, then the records bar."""
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]} tok/s  acceptance {task.fields[acceptance]}  "
                          "dropped {task.fields[dropped]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("preparing", total=None, rate="-", acceptance="-", dropped=0)
        state = {"already": 0, "started": time.perf_counter()}

        def on_start(num_records: int, num_already: int) -> None:
            state.update(already=num_already, started=time.perf_counter())
            bar.update(task, description="records", total=num_records, completed=num_already)

        def on_round(p: WorkerProgress) -> None:
            elapsed = max(time.perf_counter() - state["started"], 1e-9)
            acceptance = f"{p.num_accepted / p.num_proposed:.2f}" if p.num_proposed else "-"
            bar.update(task, completed=state["already"] + p.num_done, acceptance=acceptance,
                       rate=f"{p.num_committed_tokens / elapsed:.0f}", dropped=p.num_dropped)

        hooks.on_start, hooks.on_round = on_start, on_round
        yield bar


def _submit_deployment(name: str, parameters: dict[str, Any], wait: bool) -> None:
    """Start a run of deployment NAME on the configured Prefect API; with --wait, exit as the run ends."""
    from specbatch.job.flow import UNUSABLE_INPUT, deployment_name, run_deployment_job

    def on_state(flow_run: Any) -> None:
        state = flow_run.state
        console.print(f"flow run [cyan]{flow_run.name}[/] ({flow_run.id}): {state.name if state else '-'}"
                      + (f" - {state.message}" if state and state.message and state.is_final() else ""))

    parameters = {key: value for key, value in parameters.items() if value not in (None, [], False)}
    try:
        flow_run = run_deployment_job(name, parameters, wait, on_state)
    except KeyboardInterrupt:
        err.print("stopped watching; the flow run goes on (cancel it with `prefect flow-run cancel ID`)")
        raise typer.Exit(EXIT_STOPPED) from None
    except Exception as error:  # no API configured, server unreachable, no such deployment
        fail(f"could not start a run of deployment {deployment_name(name)!r}: {error}")
    state = flow_run.state
    if not wait or state.is_completed():
        return
    if state.name == UNUSABLE_INPUT:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_STOPPED if state.is_cancelled() else EXIT_INTERNAL)


def _print_summary(summary: JobSummary) -> None:
    table = Table(title=f"job {summary.job_id}", show_header=False)
    for name, value in summary.rows():
        table.add_row(name, str(value))
    table.add_row("outputs", str(summary.job_dir))
    console.print(table)


@commands.command()
def status(job: Annotated[str, typer.Argument(help="job id, job directory, or a job's object-store URL")],
           output: Annotated[str, typer.Option(help="where job directories go (a folder or a URL)")] = "outputs",
           ) -> None:
    """Show a job's progress from its manifest and committed parts."""
    from specbatch.job.finalize import summarize
    from specbatch.job.manifest import load_manifest

    job_dir = job if is_url(job) or Path(job).is_dir() else join(output, job)
    missing: tuple[type[Exception], ...] = (FileNotFoundError, *usage_errors())
    try:
        manifest = load_manifest(job_dir)
        with _warnings_on_terminal("specbatch.ledger"):
            summary = summarize(job_dir)
            throughput = _throughput_line(job_dir)
    except missing as error:
        fail(f"no job at {job_dir}: {error}")
    except Exception as error:  # an object store without credentials, unreachable, or refusing access
        fail(f"cannot read job {job_dir}: {type(error).__name__}: {error}")
    shards = Table(title=f"job {manifest.job_id}: {manifest.status}")
    for column in ("shard", "records", "dropped at ingest", "status", "worker"):
        shards.add_column(column)
    for shard in manifest.shards:
        shards.add_row(shard.name, str(shard.num_records), str(shard.num_dropped), shard.status, str(shard.worker_id))
    console.print(shards)
    _print_summary(summary)
    console.print(throughput)


class _TerminalWarnings(logging.Handler):
    """Each record as one `warning:` line: an error's own line breaks (pyarrow's thrift errors end in
    one) folded into spaces, and no wrapping at the terminal's width."""

    def emit(self, record: logging.LogRecord) -> None:
        message = " ".join(line.strip() for line in record.getMessage().splitlines() if line.strip())
        err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


@contextmanager
def _warnings_on_terminal(name: str) -> Iterator[None]:
    """Logger `name`'s warnings as one `warning:` line each on stderr while the block runs. The ledger
    skips a part file it cannot read with a warning, which no handler showed but logging's last resort
    (a bare line after the tables, where anything had configured no logging): `status` of a job whose
    results part is damaged printed `completed 0` with nothing saying why."""
    logger, handler = logging.getLogger(name), _TerminalWarnings(logging.WARNING)
    propagate, logger.propagate = logger.propagate, False  # said here: not again by another handler
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _throughput_line(job_dir: str) -> str:
    from specbatch.ledger import read_table

    rounds = read_table(job_dir, "rounds").select(["started_s", "round_ms", "num_committed"]).to_pydict()
    if not rounds["started_s"]:
        return "no rounds committed yet"
    ends_s = (s + ms / 1000 for s, ms in zip(rounds["started_s"], rounds["round_ms"], strict=True))
    span = max(ends_s) - min(rounds["started_s"])
    rate = sum(rounds["num_committed"]) / max(span, 1e-9)
    return f"throughput so far: {rate:.1f} committed tokens/s over {span:.1f} s"
