"""`specbatch bench`, `calibrate`, `simulate` and `queue-lab`: the commands that measure or model rather than run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from specbatch.cli.common import console, fail, usage_errors

commands = typer.Typer()


@commands.command()
def bench(
    prompts: Annotated[int, typer.Option(min=1, help="held-out prompts (half code, half prose)")] = 64,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="largest max_new_tokens (drawn per request from 16..N)")]
    = 128,
    batch_size: Annotated[str, typer.Option(help="batch rows for hf-generate and specbatch; several make a "
                                                  "grid, e.g. 1,8,32,128")] = "32",
    json_path: Annotated[Path | None, typer.Option("--json", help="write results as JSON")] = None,
    config: Annotated[Path | None, typer.Option(help="job config YAML")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override any config field: key=value")] = [],  # noqa: B006
    assisted_prompts: Annotated[int | None, typer.Option(help="prompts for hf-assisted (slow, batch 1)")] = None,
    suite: Annotated[str, typer.Option(help="engine (vs HF) or policies")] = "engine",
    graphs: Annotated[str, typer.Option(help="graph modes to run specbatch in, comma-separated: "
                                             "eager,compile,cuda-graphs")] = "eager",
    job_prompts: Annotated[int, typer.Option(min=1, help="job size over which graph capture is charged")] = 2000,
    prompts_file: Annotated[Path | None, typer.Option(
        help="a dataset a job could run (JSONL, Parquet, ...): its first --prompts records instead of held-out ones",
    )] = None,
    drafters: Annotated[str, typer.Option(help="drafters to run specbatch with, comma-separated: "
                                               "none,draft,eagle,ngram,suffix")] = "none,eagle,draft,ngram,suffix",
    lookahead: Annotated[str, typer.Option(help="lookahead policies, comma-separated (e.g. fixed:4,adaptive); "
                                                "default: the config's")] = "",
    peer: Annotated[str | None, typer.Option(help="run a peer engine on the same token ids: vllm")] = None,
    peer_venv: Annotated[Path, typer.Option(help="the peer's venv (benchmarks/peer/setup_vllm.sh makes it)")]
    = Path(".peer/vllm"),
    repeats: Annotated[int, typer.Option(min=1, help="runs of every configuration, interleaved; each row is "
                                         "the median run")] = 1,
    workload: Annotated[str, typer.Option(help="heldout | shared-prefix (few-shot, system prompt + chat turn, "
                                               "document + question, interleaved) | fewshot | chat | document; "
                                               "for an instruct target: instruct (held-out code and chat "
                                               "requests) | json (one extraction schema over many texts) | "
                                               "extraction (json's prompts under its schema, structured output) | "
                                               "classification (code or prose, a choice constraint)")]
    = "heldout",
    prefix_tokens: Annotated[int, typer.Option(min=1, help="a shared-prefix workload's shared block")] = 560,
    suffix_tokens: Annotated[int, typer.Option(min=1, help="a shared-prefix workload's own part per prompt, "
                                                     "at most")] = 24,
    num_prefixes: Annotated[int, typer.Option(min=1, help="distinct shared blocks per kind, rows interleaved")] = 3,
    prefix_cache: Annotated[str, typer.Option(help="run specbatch (and the peer) with prefix reuse on, off, "
                                                   "or both: on,off")] = "on",
) -> None:
    """Benchmark specbatch against HF generate and HF assisted generation, or its own policies."""
    if suite == "policies":
        from specbatch.config import load_config
        from specbatch.lab.policy_suite import run_policy_suite

        try:
            run_policy_suite(load_config(config, set_), json_path=json_path, num_prompts=prompts, console=console)
        except usage_errors() as error:
            fail(str(error))
        return
    if suite != "engine":
        fail("--suite must be engine or policies")
    from specbatch.lab.bench import run_bench, write_json
    from specbatch.lab.workloads import WorkloadSize

    try:
        batch_sizes = tuple(int(size) for size in batch_size.split(","))
    except ValueError:
        fail(f"--batch-size takes whole numbers separated by commas, not {batch_size!r}")
    if min(batch_sizes) < 1:
        fail("--batch-size: every batch size must be at least 1")
    if peer not in (None, "vllm"):
        fail(f"--peer: the only peer is vllm, not {peer!r}")
    if json_path is not None and (json_path.is_dir() or not json_path.parent.is_dir()):  # not after the runs
        fail(f"--json: cannot write {json_path} (a folder, or its folder does not exist)")
    try:
        results = run_bench(prompts, max_new_tokens, batch_sizes, config, set_, assisted_prompts, console,
                            tuple(mode.strip() for mode in graphs.split(",")), job_prompts, prompts_file,
                            _names(drafters), _names(lookahead), peer, peer_venv, repeats, workload,
                            WorkloadSize(prefix_tokens, suffix_tokens, num_prefixes, max_new_tokens),
                            _names(prefix_cache))
    except usage_errors() as error:
        fail(str(error))
    if json_path is not None:
        write_json(results, json_path)


def _names(listed: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in listed.split(",") if name.strip())


@commands.command()
def calibrate(
    job_dir: Annotated[Path, typer.Argument(help="a finished job directory")],
    out: Annotated[Path | None, typer.Option(help="where to save (default JOB_DIR/cost_model.json)")] = None,
) -> None:
    """Fit the round-time cost model on a job's rounds and save it (with its own error) for a config."""
    from specbatch.lab.calibrate import calibrate as fit

    if not job_dir.is_dir():  # else "0 committed rounds", as if a job had run and committed none
        fail(f"no job directory at {job_dir}")
    try:
        model = fit(job_dir)
    except (ValueError, FileNotFoundError) as error:
        fail(str(error))
    path = out or job_dir / "cost_model.json"
    model.save(path)
    mape = f"{model.mape:.1%}" if model.mape is not None else "-"
    console.print(f"cost model from {model.num_rounds} rounds, MAPE {mape} → {path}")
    console.print(f"use it with: --set scheduler.cost_model={path}")


@commands.command()
def simulate(
    config: Annotated[Path | None, typer.Option(help="job config YAML (policies are varied on top of it)")] = None,
    requests: Annotated[int, typer.Option(help="simulated requests per policy")] = 2000,
    arrival: Annotated[str, typer.Option(help="offline | poisson:RATE | onoff:R,ON,OFF | gamma:R,CV | replay:PATH")]
    = "offline",
    # `\[` keeps Rich from reading the brackets as markup in --help
    policies: Annotated[str, typer.Option(
        help=r"comma-separated: order\[/lookahead\[/prefill]], e.g. fcfs,sjf/adaptive")] = "fcfs,sjf,laps-sd,specbatch",
    workers: Annotated[int, typer.Option(help="simulated workers")] = 1,
    output: Annotated[Path, typer.Option(help="where the simulated job directories go")] = Path("outputs/sim"),
    cost_model: Annotated[str | None, typer.Option(help="cpu-demo | PATH from `specbatch calibrate`")] = None,
    acceptance: Annotated[str, typer.Option(help="alpha | domain=mean:concentration,... | replay:JOB_DIR")]
    = "code=0.8:20,prose=0.55:10",
    seed: Annotated[int, typer.Option(help="random seed (same seed, same jobs)")] = 0,
    timing_noise: Annotated[float, typer.Option(min=0.0, help="σ of each round's log speed (a shared host's "
                                                "round-to-round swings); 0: every round takes its price")] = 0.0,
    shared_prefix: Annotated[str, typer.Option(help="TOKENS[:PREFIXES]: prompts open with one of PREFIXES shared "
                                               "blocks of TOKENS tokens (cache.prefix copies them); 0: none")] = "0",
    drafter_alpha: Annotated[str, typer.Option(help="KIND=SCALE,...: with several drafters (drafter.kind), a "
                                               "row's α under KIND is its α times SCALE (default 1)")] = "",
    lookup_match: Annotated[str, typer.Option(help="KIND=SHARE,...: the share of a lookup drafter's (ngram, "
                                              "suffix) lookups that find a match (default 1)")] = "",
    lookup_continue: Annotated[str, typer.Option(help="KIND=SHARE,...: the share of a matched lookup's drafts "
                                                 "after its first that it offers, up to k (default 1)")] = "",
    set_: Annotated[list[str], typer.Option("--set", help="override any config field: key=value")] = [],  # noqa: B006
) -> None:
    """Drive the real scheduler and policies on a virtual clock: one job per policy, then a report."""
    from specbatch.config import ConfigError, load_config
    from specbatch.lab.compare import simulate_policies
    from specbatch.sim.run import SimOptions

    try:
        if requests < 1:  # zero ran every policy's job, then failed its report: no committed parts
            raise ValueError(f"--requests must be at least 1, got {requests}")
        job_config = load_config(config, set_)
        tokens, _, num_prefixes = shared_prefix.partition(":")
        if not tokens.isdigit() or not (num_prefixes or "1").isdigit():
            raise ValueError(f"--shared-prefix takes TOKENS[:PREFIXES] in whole numbers, not {shared_prefix!r}")
        options = SimOptions(timing_noise=timing_noise, shared_prefix_tokens=int(tokens),
                             num_prefixes=int(num_prefixes or 1),
                             drafter_alpha_scale=_kind_values(drafter_alpha, "--drafter-alpha", "SCALE"),
                             lookup_match_rate=_kind_values(lookup_match, "--lookup-match", "SHARE", upper=1.0),
                             lookup_continue_rate=_kind_values(lookup_continue, "--lookup-continue", "SHARE",
                                                               upper=1.0))
        study = simulate_policies(job_config, requests, arrival, [p for p in policies.split(",") if p], workers,
                                  output, seed=seed, acceptance=acceptance, cost_model=cost_model,
                                  options=options, console=console)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        fail(str(error))
    console.print(f"comparison: {study.comparison_md}")


def _kind_values(listed: str, option: str, name: str, upper: float = math.inf) -> tuple[tuple[str, float], ...]:
    """`suffix=1,ngram=0.5` → (("suffix", 1.0), ("ngram", 0.5)), each value in [0, upper]."""
    values = []
    for item in _names(listed):
        kind, _, text = item.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not kind.strip() or not 0 <= value <= upper:
            bound = "" if upper == math.inf else f" <= {upper:g}"
            raise ValueError(f"{option} takes KIND={name} (0 <= {name}{bound}) separated by commas, not {item!r}")
        values.append((kind.strip(), value))
    return tuple(values)


@commands.command("queue-lab")
def queue_lab(
    arrival: Annotated[float, typer.Option(help="arrival rate λ (work units per second)")],
    service: Annotated[float, typer.Option(help="service rate μ (work units per second)")],
    backlog: Annotated[float, typer.Option(help="initial backlog B0 (work units)")] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of text")] = False,
) -> None:
    """The fluid backlog model (no batches, priorities or random arrivals): B(t) = max(0, B0 + (λ − μ)t)."""
    from specbatch.lab.queue_lab import format_queue_lab, queue_lab_report

    try:
        report = queue_lab_report(arrival, service, backlog)
    except ValueError as error:
        fail(str(error))
    typer.echo(json.dumps(report, indent=2) if json_out else format_queue_lab(report))
