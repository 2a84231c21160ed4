"""Time the model in use over the shapes a job will run, once per model, dtype and machine (issue 43).

Before a worker's first round (no row has KV yet, as for graph capture), `measure_passes` runs
verify-shaped target passes of 1..k + 1 positions at the row counts the job batches, at a short
and a long KV length, and the draft model's steps and one fill, each through the models' public
`PagedModel.forward`, untimed once (a graph mode compiles or captures there) and then timed
`repeats` times (the median counts). A few dozen passes: seconds, not minutes. The result is
cached on disk (`sched.pass_profile`), so a resumed job or another worker of the same model on
the same machine reads it instead. What the timings mean and how they become the scheduler's
cost model is `sched/pass_profile.py`.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
from collections.abc import Callable

import torch

from specbatch.config import JobConfig
from specbatch.engine import c_library
from specbatch.engine.forward import PagedModel
from specbatch.engine.host import machine
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import job_buckets, resolve_cost_model
from specbatch.sched.pass_profile import PassProfile, PassTiming, cached_profile, save_profile

log = logging.getLogger(__name__)

REPEATS = 3
FILL_TOKENS = 64  # a draft fill's length: one pass over many positions tells a pass's price from a row's


def wants_measured_costs(config: JobConfig) -> bool:
    """A job whose lookahead is decided from predicted round times, with no cost model named."""
    s = config.scheduler
    return (s.measure_cost and s.cost_model is None and config.max_lookahead > 0
            and config.effective_lookahead.kind in ("adaptive", "slack"))


def row_counts(max_rows: int) -> list[int]:
    """1, the job's batch and a few between (powers of 4): where its rounds will run."""
    counts, rows = {1, max_rows}, 4
    while rows < max_rows:
        counts.add(rows)
        rows *= 4
    return sorted(counts)


def query_lens(max_lookahead: int) -> list[int]:
    """1 (plain decoding), 2, the middle and k + 1 positions."""
    return sorted({1, min(2, max_lookahead + 1), (max_lookahead + 2) // 2, max_lookahead + 1})


def profile_key(config: JobConfig, target: PagedModel, draft: PagedModel | None) -> str:
    """What a profile's numbers depend on: the models' weights (fingerprint), dtype, device, graph
    mode, threads, the machine, the shapes measured, the library versions and the kernels' sources."""
    parts = [model_fingerprint(target.model), model_fingerprint(draft.model) if draft else "-",
             str(next(target.model.parameters()).dtype), config.models.device, config.models.graphs,
             config.models.attn_implementation, str(torch.get_num_threads()), machine(), torch.__version__,
             c_library.sources_digest(),
             repr(row_counts(config.scheduler.max_batch_rows)), repr(query_lens(config.max_lookahead)),
             repr(job_buckets(config)), str(target.max_len)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def model_fingerprint(model: torch.nn.Module) -> str:
    """The model's class, config and a sample of its weights: another checkpoint of the same
    architecture reads as another model (the weights' sample), in microseconds."""
    digest = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    digest.update((config.to_json_string() if config is not None else "").encode())
    for name, parameter in list(model.named_parameters())[:4]:
        digest.update(name.encode())
        digest.update(parameter.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def job_cost_model(config: JobConfig, target: PagedModel, draft: PagedModel | None,
                   repeats: int = REPEATS) -> CostModel | None:
    """The measured cost model for this job (cached), or None where the job keeps the configured one."""
    if not wants_measured_costs(config):
        return None
    key = profile_key(config, target, draft)
    fallback = resolve_cost_model(None, config)  # the draft's price where no draft model is timed
    profile = cached_profile(key)
    if profile is None:
        started = time.perf_counter()
        profile = measure_passes(target, draft, row_counts(config.scheduler.max_batch_rows),
                                 query_lens(config.max_lookahead), repeats, key)
        dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
        profile.description = f"{type(target.model).__name__}, {dtype}, {config.models.device}"
        path = save_profile(profile, fallback=fallback)
        log.info("timed %d passes in %.1f s: %s", len(profile.timings), time.perf_counter() - started, path)
    return profile.fit(fallback)


def measure_passes(target: PagedModel, draft: PagedModel | None, rows: list[int], query_lengths: list[int],
                   repeats: int = REPEATS, key: str = "") -> PassProfile:
    """Time the passes (module docstring); the KV they write is overwritten later (call before any row's)."""
    profile = PassProfile(key)
    long_start = max(0, min(target.max_len - max(query_lengths), 512))
    for num_rows in rows:
        for query_len in query_lengths:
            for start in {0, long_start} if num_rows == max(rows) else {0}:
                profile.timings.append(time_pass(target, num_rows, query_len, start, repeats, "target"))
    if draft is not None:
        for num_rows in rows:
            profile.timings.append(time_pass(draft, num_rows, 1, 0, repeats, "draft"))
        fill = min(FILL_TOKENS, draft.max_len - 1)
        profile.timings.append(time_pass(draft, 1, fill, 0, repeats, "draft", keep_logits=False))
    return profile


def time_pass(model: PagedModel, num_rows: int, query_len: int, start: int, repeats: int, role: str,
              keep_logits: bool = True) -> PassTiming:
    """The median of `repeats` passes of `num_rows` rows × `query_len` positions from `start` (scratch
    tables), the first pass before them not counted."""
    tables, chunks = model.scratch_tables(num_rows, start + query_len), [[0] * query_len for _ in range(num_rows)]
    sync = _synchronizer(model)
    times, shape = [], None
    for index in range(repeats + 1):
        sync()
        started = time.perf_counter()
        _, shape = model.forward(tables, [start] * num_rows, chunks, keep_logits=keep_logits,
                                 last_only=role == "draft")
        sync()
        if index:  # the first compiles, captures or warms caches
            times.append((time.perf_counter() - started) * 1000)
    assert shape is not None
    return PassTiming(role, shape.num_bucket_rows, shape.query_len, shape.kv_len, statistics.median(times))


def _synchronizer(model: PagedModel) -> Callable[[], None]:
    return torch.cuda.synchronize if next(model.model.parameters()).is_cuda else (lambda: None)
