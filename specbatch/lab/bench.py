"""`specbatch bench`: the same held-out prompts through HF `generate` (as its users batch it),
specbatch with each drafter (in each graph mode asked for), and HF assisted generation, side by side
in one process. An engine's start-up (its slot caches) and graph capture are timed apart (warmup_s,
each graph-mode row compiled anew into an empty cache, as a new job's worker does) and charged back
in `tokens_per_s_job`: the rate of a job of `job_prompts` such prompts that pays them once.

Speed claims live here, never in timed unit tests. Every row also reports the work behind its
speed (target passes and rows per token, padding apart, acceptance), its model FLOP utilisation
against the machine's GEMM peak at the target's dtype (`engine/gemm_peak.py`; measured once per run,
before anything is timed, or read from the cache) and `exact_match` against the target's own greedy
decoding of each prompt alone. `Work`, `run_engine` and `print_rows` are shared
with the policy suite (`lab.policy_suite`), so both report the same quantities under the same names.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rich.console import Console
from rich.table import Table
from transformers.utils import logging as hf_logging

from specbatch.config import ConfigError, JobConfig, LookaheadSpec, load_config
from specbatch.core import Row
from specbatch.data.ingest import DatasetError
from specbatch.data.prefix_groups import key_tree_positions, shared_prefix_keys
from specbatch.engine.build import Models, build_hf_engine, eos_token_ids, load_models
from specbatch.engine.eagle import load_head
from specbatch.engine.gemm_peak import GemmPeak, gemm_peak, mfu
from specbatch.engine.graphs import use_compile_cache
from specbatch.lab.constrained_workloads import (
    CONSTRAINED_WORKLOADS,
    constrained_workload_prompts,
    masked_greedy_references,
    valid_share,
    valid_share_of,
)
from specbatch.lab.instruct_workloads import INSTRUCT_WORKLOADS, instruct_workload_prompts
from specbatch.lab.peer import PEER_MODES, PeerError, check_venv, run_vllm
from specbatch.lab.prompts import BenchPrompt, file_prompts, heldout_prompts
from specbatch.lab.workloads import WORKLOADS, WorkloadSize, shared_prefix_prompts
from specbatch.loop import Engine, MemoryRecorder
from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CostModel

NO_REUSE = "-noreuse"  # a row's name suffix with cache.prefix off


@dataclass(frozen=True)
class Work:
    """A run's raw target work in DESIGN §2 words; the rates both suites report derive from it.

    Target rows never include padding: padded rows are counted apart, as in the `rounds` table and
    sql/throughput_vs_cost.sql (target_rows_per_1k, padded_target_rows_per_1k). All positions the
    target computed per token are target_rows_per_token + padded_target_rows_per_token.
    """

    num_committed: int
    num_target_passes: int
    num_target_rows: int  # Σ(1 + k) over decode rows + prefill chunk tokens
    num_padded_target_rows: int  # positions computed only for shapes: buckets, ragged k, left padding
    num_decode_rows: int  # verified rows; each commits its accepted drafts + one more token
    num_proposed: int = 0
    num_accepted: int = 0
    num_prefill_tokens: int = 0  # prompt positions computed
    num_reused_tokens: int = 0  # prompt positions copied from a shared prefix
    num_padded_prefill_rows: int = 0  # of num_padded_target_rows, in prefill passes

    @classmethod
    def of_rounds(cls, rounds: list[RoundRecord]) -> Work:
        return cls(**{f.name: sum(getattr(r, f.name) for r in rounds) for f in fields(cls)})

    def rates(self) -> dict[str, float | None]:
        tokens = max(self.num_committed, 1)
        computed = self.num_target_rows + self.num_padded_target_rows
        return {
            "target_passes_per_token": self.num_target_passes / tokens,
            "target_rows_per_token": self.num_target_rows / tokens,
            "padded_target_rows_per_token": self.num_padded_target_rows / tokens,
            "padded_share": self.num_padded_target_rows / max(computed, 1),
            "acceptance": self.num_accepted / self.num_proposed if self.num_proposed else None,
            "prefill_padding_share": (self.num_padded_prefill_rows / prefill if (prefill := self.num_prefill_tokens
                                      + self.num_padded_prefill_rows) else None),
        }


@dataclass(kw_only=True)
class BenchResult:
    name: str
    tokens_per_s: float
    batch_rows: int | None = None
    mfu: float | None = None  # tokens_per_s × 2 × the target's parameters ÷ gemm_peak_gflops (engine/gemm_peak.py)
    # the same over every position the target computed (prompts, verify windows; padding apart): the
    # share of the peak its passes kept busy. A job of long prompts and short answers has a low `mfu`
    # however busy: at 4.4 positions a token (SmolLM2's instruct job) `mfu` stays under 23%
    mfu_positions: float | None = None
    gemm_peak_gflops: float | None = None  # the machine's GEMM peak at the target's dtype
    ratio_vs_hf_generate: float | None = None  # at the same batch size
    ratio_vs_none: float | None = None  # to specbatch-none (eager) at the same batch size
    # the work behind the speed (Work.rates); None where the library does not expose it
    target_passes_per_token: float | None = None
    target_rows_per_token: float | None = None  # padding apart (see Work)
    padded_target_rows_per_token: float | None = None
    padded_share: float | None = None
    acceptance: float | None = None  # accepted / proposed
    prefilled_share: float | None = None  # prompt positions computed / prompt positions (the rest copied or pending)
    prefill_padding_share: float | None = None  # padded positions / positions of the prefill passes
    ratio_vs_no_reuse: float | None = None  # to the same row with cache.prefix off (--prefix-cache on,off)
    alpha: float | None = None  # per-token α: of the drafts the rule reached, the share accepted
    # the speedup over plain decoding the measured α and costs allowed, and the share of it the plans got
    # (rounds' limit_speedup, sql/speculation_limit.sql)
    limit_speedup: float | None = None
    realised_of_limit: float | None = None
    prefill_time_share: float | None = None  # of round time, prefill's: what no drafter shortens (job limit)
    tokens_per_pass: float | None = None
    tokens_per_pass_theory: float | None = None
    exact_match: float
    num_prompts: int
    num_tokens: int
    wall_s: float  # graph capture apart
    warmup_s: float | None = None  # start-up timed apart: slot caches and graph capture (specbatch), the engine (peer)
    tokens_per_s_job: float | None = None  # warm-up paid once by a job of job_prompts such prompts
    ratio_vs_eager: float | None = None  # a graph mode's tokens_per_s_job over the same drafter's eager rate
    ratio_vs_peer: float | None = None  # to the peer's fastest mode at the same batch size (--peer)
    same_as_specbatch: float | None = None  # a peer row: share of outputs identical to specbatch-none's
    error: str | None = None  # a peer mode that could not run, and why
    valid_share: float | None = None  # structured output: finished outputs that satisfy their constraint
    mask_overhead_share: float | None = None  # structured output: of round time, waiting on masks (not hidden)
    graphs: str = "eager"  # a specbatch row's graph mode
    num_runs: int = 1  # runs of which this row is the median (--repeats)
    outputs: dict[str, list[int]] = field(default_factory=dict, repr=False)  # token ids per request; not written


def load_models_for(config: JobConfig, drafters: Iterable[str]) -> Models:
    """The target with the draft model and the EAGLE head that `drafters` run, whatever drafter the
    config names: one load serves every configuration of a side-by-side run."""
    drafters = {kind for mix in drafters for kind in mix.split("+")}  # suffix+ngram+draft: one job of three
    kind = "draft" if "draft" in drafters and config.models.draft else "none"
    models = load_models(config.model_copy(update={"drafter": config.drafter.model_copy(update={"kind": kind})}))
    if "eagle" in drafters and config.models.eagle:
        models.eagle = load_head(config.models.eagle, models.target)
    return models


class EngineRun(NamedTuple):
    rows: list[Row]
    recorder: MemoryRecorder
    wall_s: float  # from the first round to the end
    startup_s: float  # building the engine: its slot caches allocated and zeroed
    planned_from: CostModel  # the round-time model its scheduler started from (measured or configured)


def run_engine(config: JobConfig, models: Models, prompts: list[BenchPrompt],
               clock: Callable[[], float] = time.perf_counter,
               prepare: Callable[[Engine], None] | None = None) -> EngineRun:
    """One engine over all prompts at once; every time the engine records (arrivals, finishes,
    round_ms) is read from `clock`; `prepare(engine)` may adjust it before the rows run (a benchmark's
    A/B of a policy setting). Its start-up is timed apart, as vLLM's is (its KV cache is
    allocated there too) and as graph capture is: a worker pays it once per job, and zeroing
    gigabytes of slot caches took 0.4-2.6 s here for the same engine, run to run, which alone
    swung a short batch-128 row by 2×."""
    started = clock()
    recorder = MemoryRecorder()
    need = max(prompt.num_positions for prompt in prompts)  # slots and prefix room sized as a job's
    shared = key_tree_positions(shared_prefix_keys([prompt.prompt_ids for prompt in prompts]))
    engine = build_hf_engine(config, models, recorder, max_request_tokens=need, shared_prefix_tokens=shared)
    engine.clock = clock
    if prepare is not None:
        prepare(engine)
    built = clock()
    planned_from = engine.scheduler.ctx.round_cost.cost
    rows = [prompt.to_row() for prompt in prompts]
    for row in rows:
        engine.add(row)
    engine.run()
    return EngineRun(rows, recorder, clock() - built, built - started, planned_from)


@torch.no_grad()
def greedy_references(models: Models, prompts: list[BenchPrompt]) -> dict[str, list[int]]:
    """The target's own greedy decoding of each prompt alone (batch size 1)."""
    eos, pad = sorted(eos_token_ids(models)), models.tokenizer.pad_token_id
    refs = {}
    for prompt in prompts:
        out = models.target.generate(  # type: ignore[operator]  # transformers types generate loosely
            torch.tensor([prompt.prompt_ids], device=models.target.device), max_new_tokens=prompt.max_new_tokens,
            do_sample=False, eos_token_id=eos, pad_token_id=pad)
        refs[prompt.request_id] = out[0, len(prompt.prompt_ids):].tolist()
    return refs


def cut(tokens: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


@torch.no_grad()
def run_hf_generate(models: Models, prompts: list[BenchPrompt], batch_size: int) -> tuple[dict, Work]:
    """Fixed-size batches in dataset order, left padding, greedy, the batch's largest max_new_tokens.
    A row's target rows are its prompt and one position per output token after the first; the rest
    of each batch's positions (left padding, rows already finished) are padded rows."""
    eos = eos_token_ids(models)
    pad = models.tokenizer.pad_token_id if models.tokenizer.pad_token_id is not None else sorted(eos)[0]
    outputs, passes, computed, target_rows = {}, 0, 0, 0
    device = models.target.device
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p.prompt_ids) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p.prompt_ids)) + list(p.prompt_ids) for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p.prompt_ids)) + [1] * len(p.prompt_ids) for p in batch], device=device)
        out = models.target.generate(  # type: ignore[operator]  # transformers types generate loosely
            ids, attention_mask=mask, max_new_tokens=max(p.max_new_tokens for p in batch),
            do_sample=False, eos_token_id=sorted(eos), pad_token_id=pad)
        steps = out.shape[1] - width
        passes += steps
        computed += len(batch) * width + len(batch) * max(steps - 1, 0)
        for row, prompt in enumerate(batch):
            outputs[prompt.request_id] = cut(out[row, width:].tolist(), prompt.max_new_tokens, eos)
            target_rows += len(prompt.prompt_ids) + max(len(outputs[prompt.request_id]) - 1, 0)
    tokens = sum(len(v) for v in outputs.values())
    return outputs, Work(tokens, passes, target_rows, computed - target_rows, num_decode_rows=tokens)


@torch.no_grad()
def run_hf_assisted(models: Models, prompts: list[BenchPrompt]) -> dict:
    eos = eos_token_ids(models)
    outputs = {}
    for prompt in prompts:
        out = models.target.generate(  # type: ignore[operator]  # transformers types generate loosely
            torch.tensor([prompt.prompt_ids], device=models.target.device), assistant_model=models.draft,
            max_new_tokens=prompt.max_new_tokens, do_sample=False,
                                     eos_token_id=sorted(eos), pad_token_id=models.tokenizer.pad_token_id)
        outputs[prompt.request_id] = cut(out[0, len(prompt.prompt_ids):].tolist(), prompt.max_new_tokens, eos)
    return outputs


def exact_share(outputs: dict, refs: dict) -> float:
    return sum(outputs[key] == refs[key] for key in outputs) / max(len(outputs), 1)


def theory_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected committed tokens per verified row, (1 − α^(k+1)) / (1 − α), for per-token acceptance α
    and lookahead k (rows proposing fewer than k drafts, as n-gram lookup does, fall below it)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def bench_result(name: str, outputs: dict, refs: dict, wall_s: float, work: Work | None = None,
                 theory: float | None = None) -> BenchResult:
    """One row of the table; without `work` (a library that does not expose it) its rates are None."""
    tokens = sum(len(v) for v in outputs.values())
    rates: dict[str, Any] = {}  # BenchResult's rate fields
    if work is not None:
        rates = {**work.rates(), "tokens_per_pass": work.num_committed / max(work.num_decode_rows, 1)}
    return BenchResult(name=name, tokens_per_s=tokens / wall_s, **rates, tokens_per_pass_theory=theory,
                       exact_match=exact_share(outputs, refs), num_prompts=len(outputs), num_tokens=tokens,
                       wall_s=wall_s, outputs=outputs)


def summarize_engine(name: str, rows: list[Row], recorder: MemoryRecorder, refs: dict, wall_s: float,
                     k: int, job_prompts: int | None = None, startup_s: float = 0.0) -> BenchResult:
    """A row for an engine run; its graph capture (warmup_ms in its rounds) is taken out of wall_s
    and, with its start-up, charged once to a job of `job_prompts` prompts like these."""
    work = Work.of_rounds(recorder.rounds)
    # per-token α: of the drafts the rule reached, the share it accepted (a rejection ends a block)
    rejections = sum(1 for s in recorder.steps if s.num_accepted < s.num_proposed)
    alpha = work.num_accepted / (work.num_accepted + rejections) if work.num_proposed else None
    theory = theory_tokens_per_pass(alpha, k) if alpha is not None and k > 0 else None  # k varies: no one theory
    capture_s = sum(r.warmup_ms for r in recorder.rounds) / 1000
    warmup_s = capture_s + startup_s
    result = bench_result(name, {row.request_id: row.output_ids for row in rows}, refs, wall_s - capture_s, work,
                          theory)
    result.warmup_s, result.alpha = warmup_s, alpha
    result.limit_speedup, result.realised_of_limit = speculation_limit(recorder.rounds)
    result.prefilled_share = work.num_prefill_tokens / max(sum(row.num_prompt_tokens for row in rows), 1)
    result.prefill_time_share = (sum(r.prefill_ms for r in recorder.rounds)
                                 / max(sum(r.round_ms - r.warmup_ms for r in recorder.rounds), 1e-9))
    if any(r.mask_ms > 0 for r in recorder.rounds):  # as sql/structured_output.sql's overhead_share
        result.mask_overhead_share = (sum(r.mask_wait_ms for r in recorder.rounds)
                                      / max(sum(r.round_ms for r in recorder.rounds), 1e-9))
    if job_prompts:
        scale = job_prompts / len(rows)
        result.tokens_per_s_job = result.num_tokens * scale / (result.wall_s * scale + warmup_s)
    return result


def speculation_limit(rounds: list[RoundRecord]) -> tuple[float | None, float | None]:
    """(limit, realised / limit) of a run's decode rounds, as sql/speculation_limit.sql derives them."""
    decode = [r for r in rounds if r.num_decode_rows and r.plain_ms > 0]
    if not decode:
        return None, None
    plain_ms = sum(r.plain_ms for r in decode)
    limit = plain_ms / sum(r.plain_ms / r.limit_speedup for r in decode)
    planned = (sum(r.num_committed for r in decode) / sum(r.predicted_ms for r in decode)
               / (sum(r.num_decode_rows for r in decode) / plain_ms))
    return limit, planned / limit


def run_bench(num_prompts: int, max_new_tokens: int, batch_sizes: tuple[int, ...], config_path: Path | None = None,
              overrides: list[str] | None = None, assisted_prompts: int | None = None,
              console: Console | None = None, graphs: tuple[str, ...] = ("eager",),
              job_prompts: int = 2000, prompts_file: Path | None = None,
              drafters: tuple[str, ...] = ("none", "eagle", "draft", "ngram", "suffix"),
              lookaheads: tuple[str, ...] = (),
              peer: str | None = None, peer_venv: Path = Path(".peer/vllm"), repeats: int = 1,
              workload: str = "heldout", workload_size: WorkloadSize | None = None,
              prefix_cache: tuple[str, ...] = ("on",)) -> list[BenchResult]:
    """Every configuration (drafter × lookahead × prefix reuse on/off; `lookaheads` empty: the config's)
    at every batch size (a grid), on the same prompts and references: the held-out ones, a workload
    whose prompts share prefixes (`lab/workloads.py`), or the first `num_prompts` records of
    `prompts_file` that a job would run; each row the median of `repeats` interleaved runs."""
    if not prefix_cache or set(prefix_cache) - {"on", "off"}:
        raise ConfigError(f"--prefix-cache takes on, off or on,off, not {','.join(prefix_cache)!r}")
    known = WORKLOADS + INSTRUCT_WORKLOADS + CONSTRAINED_WORKLOADS
    if workload not in known:
        raise ConfigError(f"unknown workload {workload!r}; one of {', '.join(known)}")
    console = console or Console()
    for mode, drafter, lookahead in product(graphs, drafters, lookaheads or ("",)):  # bad input fails first
        load_config(config_path, [*(overrides or []), f"models.graphs={mode}", f"drafter.kind={drafter}",
                                  *([f"scheduler.lookahead={lookahead}"] if lookahead else [])])
    base = load_config(config_path, [*(overrides or []), f"scheduler.max_batch_rows={max(batch_sizes)}"])
    if peer is not None:
        check_venv(peer_venv)
    models = load_models_for(base, drafters)
    if prompts_file is not None:
        prompts, num_dropped = file_prompts(prompts_file, base, models.tokenizer)
        prompts = prompts[:num_prompts]
        if not prompts:
            raise DatasetError(f"{prompts_file}: no record a job would run ({num_dropped} dropped)")
        source = f"{prompts_file} ({num_dropped} records dropped as a job would drop them)"
    elif workload in CONSTRAINED_WORKLOADS:
        prompts = constrained_workload_prompts(workload, models.tokenizer, num_prompts, max_new_tokens, seed=base.seed)
        source = f"workload {workload} (chat template, structured output), max_new_tokens {max_new_tokens}"
    elif workload in INSTRUCT_WORKLOADS:
        prompts = instruct_workload_prompts(workload, models.tokenizer, num_prompts, max_new_tokens, seed=base.seed)
        source = f"workload {workload} (chat template applied), max_new_tokens <= {max_new_tokens}"
    elif workload != "heldout":
        size = workload_size or WorkloadSize(max_new_tokens=max_new_tokens)
        prompts = shared_prefix_prompts(workload, models.tokenizer, num_prompts, size, seed=base.seed)
        source = (f"workload {workload}: {size.num_prefixes} prefix(es) per kind of ~{size.prefix_tokens} tokens, "
                  f"interleaved, then <= {size.suffix_tokens} of each prompt's own, "
                  f"max_new_tokens {size.max_new_tokens}")
    else:
        prompts = heldout_prompts(models.tokenizer, num_prompts, max_new_tokens, seed=base.seed)
        source = f"held-out code and prose, max_new_tokens 16..{max_new_tokens}"
    console.print(f"[bold]bench[/] {len(prompts)} prompts from {source}, batch rows {', '.join(map(str, batch_sizes))}")
    hf_logging.set_verbosity_error()
    num_params = sum(p.numel() for p in models.target.parameters())
    peak = gemm_peak(next(models.target.parameters()).dtype, str(models.target.device))  # before anything is timed
    # the target's own greedy decoding (under its masks where constrained); also warms the target up
    constrained = any(prompt.constraint is not None for prompt in prompts)
    refs = masked_greedy_references(models, prompts) if constrained else greedy_references(models, prompts)
    if models.draft is not None:  # warm the draft and engine paths up (graph modes are timed apart)
        run_engine(base.model_copy(update={"drafter": base.drafter.model_copy(update={"kind": "draft"}),
                                           "models": base.models.model_copy(update={"graphs": "eager"})}),
                   models, prompts[: max(batch_sizes)])
    runs = [(drafter, lookahead, reuse) for drafter in drafters for lookahead in (lookaheads or ("",))
            for reuse in prefix_cache
            if drafter != "none" or lookahead == (lookaheads or ("",))[0]]  # without drafts lookahead is moot
    results: list[BenchResult] = []
    for batch_size in sorted(batch_sizes):
        results += _bench_batch(batch_size, models, prompts, refs, config_path, overrides or [], graphs, runs,
                                job_prompts, repeats)
    if models.draft is not None:
        subset = prompts[: assisted_prompts or len(prompts)]
        started = time.perf_counter()
        outputs = run_hf_assisted(models, subset)
        results.append(bench_result("hf-assisted", outputs, refs, time.perf_counter() - started))
        results[-1].batch_rows = 1  # against hf-generate at the smallest batch size run
        results[-1].ratio_vs_hf_generate = results[-1].tokens_per_s / results[0].tokens_per_s
    add_mfu(results, num_params, peak)
    print_rows(console, "specbatch bench", [asdict(r) for r in results], COLUMNS)
    console.print(mfu_basis(num_params, peak))
    if peer is not None:  # after the table: a peer that fails late loses none of specbatch's rows
        fixed = [LookaheadSpec.parse(la).k for la in lookaheads if la.startswith("fixed:")]
        k = next((k for k in fixed if k), base.scheduler.lookahead.k or 4)
        console.print(f"[bold]peer[/] vLLM, modes {', '.join(d for d in PEER_MODES if d in drafters or d == 'none')}, "
                      f"k = {k}, one engine per batch size and mode (start-up timed apart)")
        try:
            peer_results = run_vllm(base, models, prompts, tuple(sorted(batch_sizes)), drafters, k, peer_venv,
                                    prefix_caching=tuple(reuse == "on" for reuse in prefix_cache))
        except (PeerError, subprocess.TimeoutExpired) as error:
            console.print(f"[red]peer failed[/]: {error}")
            return results
        judge = partial(_peer_valid_share, prompts=prompts, tokenizer=models.tokenizer) if constrained else None
        rows = _peer_rows(peer_results, refs, results, k, judge)
        results += add_mfu(rows, num_params, peak)  # run at the same dtype
        print_rows(console, "specbatch bench, with the peer", [asdict(r) for r in results], COLUMNS)
        console.print(mfu_basis(num_params, peak))
    return results


def add_mfu(results: list[BenchResult], num_params: int, peak: GemmPeak) -> list[BenchResult]:
    """Set every row's MFU, and over every computed position where the row counts them (rows that did
    not run keep None); returns `results`."""
    for result in results:
        if result.error is None:
            result.mfu, result.gemm_peak_gflops = mfu(result.tokens_per_s, num_params, peak.gflops), peak.gflops
            if result.target_rows_per_token is not None:
                result.mfu_positions = result.mfu * result.target_rows_per_token
    return results


def mfu_basis(num_params: int, peak: GemmPeak) -> str:
    """The line under the table that says what MFU divides by."""
    return (f"MFU: tokens/s × 2 × {num_params / 1e6:.3g}M target parameters ÷ {peak.describe()}; MFU pos: "
            "the same over every position the target computed (prompts and verify windows, padding apart)")


def _peer_valid_share(run: dict, prompts: list[BenchPrompt], tokenizer: Any) -> float | None:
    """Of the outputs a peer run finished by a stop token, the share that satisfy their constraint."""
    finished = {request_id: ids for request_id, ids in run["outputs"].items()
                if run["finish_reasons"][request_id] == "stop"}
    return valid_share_of(prompts, finished, tokenizer)


def _peer_rows(peer: dict, refs: dict, results: list[BenchResult], k: int,
               valid_share: Callable[[dict], float | None] | None = None) -> list[BenchResult]:
    """The peer's rows, with ratios at their batch size and agreement with specbatch-none's outputs
    there (and, for constrained workloads, `valid_share` of each run); every row's ratio_vs_peer
    (to the peer's fastest)."""
    none_outputs = {r.batch_rows: r.outputs for r in results if r.name == "specbatch-none"}
    rows = []
    for run in peer["results"]:
        name = (f"vllm-{run['mode']}" + (f"-k{k}" if run["mode"] != "none" else "")
                + ("" if run.get("prefix_caching", True) else NO_REUSE))
        batch = run["batch_rows"]
        if "error" in run:
            rows.append(BenchResult(name=name, batch_rows=batch, tokens_per_s=0.0, exact_match=0.0, num_prompts=0,
                                    num_tokens=0, wall_s=0.0, error=run["error"]))
            continue
        result = bench_result(name, run["outputs"], refs, run["wall_s"])
        result.batch_rows, result.warmup_s = batch, run["startup_s"]
        result.same_as_specbatch = exact_share(run["outputs"], none_outputs.get(batch, {}))
        if valid_share is not None:
            result.valid_share = valid_share(run)
        rows.append(result)
    for batch in {row.batch_rows for row in rows}:
        at_batch = [r for r in results if r.batch_rows == batch]
        hf = next((r.tokens_per_s for r in at_batch if r.name == "hf-generate"), None)
        none = next((r.tokens_per_s for r in at_batch if r.name.startswith("specbatch-none")), None)
        peers = [r for r in rows if r.batch_rows == batch and r.error is None]
        best = max((r.tokens_per_s for r in peers), default=None)
        for result in peers:
            result.ratio_vs_hf_generate = result.tokens_per_s / hf if hf else None
            result.ratio_vs_none = result.tokens_per_s / none if none else None
        for result in at_batch + peers:
            result.ratio_vs_peer = result.tokens_per_s / best if best else None
    return rows


def _bench_batch(batch_size: int, models: Models, prompts: list[BenchPrompt], refs: dict, config_path: Path | None,
                 overrides: list[str], graphs: tuple[str, ...], runs: list[tuple[str, str, str]], job_prompts: int,
                 repeats: int = 1) -> list[BenchResult]:
    """One batch size's rows: hf-generate, then specbatch with each (drafter, lookahead) in each graph
    mode, each with its ratios to hf-generate and specbatch-none at this batch size. With `repeats`,
    every configuration runs that many times, the rounds interleaved (all once, then all again), and
    each row is its median run: this machine's speed drifts by a third over seconds, and a drift
    then falls on every configuration alike instead of on whichever ran during it."""
    configurations: list[tuple[str, Callable[[], BenchResult]]] = [
        ("hf-generate", lambda: _hf_generate_row(models, prompts, refs, batch_size))]
    for mode in graphs:
        for drafter, lookahead, reuse in runs:
            kinds = drafter.split("+")  # a mix (suffix+ngram+draft) is one job of several drafters
            if ("draft" in kinds and models.draft is None) or ("eagle" in kinds and models.eagle is None):
                continue
            config = load_config(config_path, [*overrides, f"scheduler.max_batch_rows={batch_size}",
                                               f"drafter.kind={drafter}", f"models.graphs={mode}",
                                               f"cache.prefix={reuse == 'on'}",
                                               *([f"scheduler.lookahead={lookahead}"] if lookahead else [])])
            label = drafter + (f"-{lookahead}" if lookahead and drafter != "none" else "")
            name = f"specbatch-{label}" + ("" if mode == "eager" else f"-{mode}") + ("" if reuse == "on" else NO_REUSE)
            configurations.append((name, partial(_engine_row, name, config, mode, models, prompts, refs, job_prompts)))
    runs_of: dict[str, list[BenchResult]] = {name: [] for name, _ in configurations}
    for _ in range(repeats):
        for name, run in configurations:
            runs_of[name].append(run())
    results = [_median(runs_of[name]) for name, _ in configurations]
    by_name = {result.name: result for result in results}
    for result in results:
        eager = by_name.get(result.name.removesuffix(f"-{result.graphs}")) if result.graphs != "eager" else None
        if eager is not None and result.tokens_per_s_job is not None:
            result.ratio_vs_eager = result.tokens_per_s_job / eager.tokens_per_s
    none_rate = by_name["specbatch-none"].tokens_per_s if "specbatch-none" in by_name else None
    for result in results:
        without = by_name.get(result.name + NO_REUSE)
        result.ratio_vs_no_reuse = result.tokens_per_s / without.tokens_per_s if without is not None else None
        result.batch_rows, result.num_runs = batch_size, repeats
        result.ratio_vs_hf_generate = result.tokens_per_s / results[0].tokens_per_s
        result.ratio_vs_none = result.tokens_per_s / none_rate if none_rate else None
    return results


def _hf_generate_row(models: Models, prompts: list[BenchPrompt], refs: dict, batch_size: int) -> BenchResult:
    started = time.perf_counter()
    outputs, work = run_hf_generate(models, prompts, batch_size)
    return bench_result("hf-generate", outputs, refs, time.perf_counter() - started, work)


def _engine_row(name: str, config: JobConfig, mode: str, models: Models, prompts: list[BenchPrompt], refs: dict,
                job_prompts: int) -> BenchResult:
    spec = config.effective_lookahead
    k = spec.k if spec.kind == "fixed" and spec.k is not None else 0
    with tempfile.TemporaryDirectory(prefix="specbatch-bench-graphs-") as cache:
        if mode != "eager":  # each row pays a cold capture, as a new job's worker does
            torch._dynamo.reset()
            use_compile_cache(Path(cache))
        rows, recorder, wall_s, startup_s, _ = run_engine(config, models, prompts)
    result = summarize_engine(name, rows, recorder, refs, wall_s, k, job_prompts, startup_s)
    result.graphs = mode
    result.valid_share = valid_share(prompts, rows, models.tokenizer)
    return result


def _median(runs: list[BenchResult]) -> BenchResult:
    """The run with the median tokens/s (the lower middle one of an even number)."""
    return sorted(runs, key=lambda result: result.tokens_per_s)[(len(runs) - 1) // 2]


COLUMNS = {"batch_rows": ("batch", ""), "name": ("name", ""), "tokens_per_s": ("tok/s", ".1f"),
           "mfu": ("MFU", ".1%"), "mfu_positions": ("MFU pos", ".1%"), "ratio_vs_none": ("× none", ".3f"),
           "ratio_vs_hf_generate": ("× hf-gen", ".3f"),
           "target_passes_per_token": ("passes/tok", ".3f"), "target_rows_per_token": ("rows/tok", ".3f"),
           "padded_share": ("padded", ".3f"), "acceptance": ("accept", ".3f"), "alpha": ("α", ".3f"),
           "prefilled_share": ("prefilled", ".3f"), "prefill_padding_share": ("pf pad", ".3f"),
           "ratio_vs_no_reuse": ("× no reuse", ".3f"),
           "limit_speedup": ("limit", ".3f"), "realised_of_limit": ("of limit", ".3f"),
           "tokens_per_pass": ("tok/pass", ".3f"), "tokens_per_pass_theory": ("theory", ".3f"),
           "warmup_s": ("warm-up s", ".1f"), "tokens_per_s_job": ("job tok/s", ".1f"),
           "ratio_vs_eager": ("× eager", ".3f"), "ratio_vs_peer": ("× peer", ".3f"),
           "exact_match": ("exact", ".3f"), "valid_share": ("valid", ".3f"),
           "mask_overhead_share": ("masks", ".3f"),
           "same_as_specbatch": ("= sb", ".3f"), "num_prompts": ("n", ""),
           "num_runs": ("runs", "")}


def print_rows(console: Console, title: str, rows: list[dict], columns: dict[str, tuple[str, str]]) -> None:
    """One table: `columns` maps a key of each row to (header, format spec); None prints as '-'."""
    table = Table(title=title)
    for key, (header, _) in columns.items():
        table.add_column(header, justify="left" if key == "name" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*("-" if row[key] is None else format(row[key], spec) for key, (_, spec) in columns.items()))
    console.print(table)


def write_json(results: list[BenchResult], path: Path) -> None:
    rows = [{key: value for key, value in asdict(r).items() if key != "outputs"} for r in results]
    Path(path).write_text(json.dumps({"results": rows}, indent=2) + "\n")
