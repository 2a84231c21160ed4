"""Jobs written to disk for the report tests.

The fake jobs are served by the real `Engine` and `Scheduler` over the simulated backend on a
virtual clock (`sim.worker.build_sim_engine`), recording through a real `ledger.PartWriter`: a plain
job (no drafts) on one worker, and a speculative job on two workers whose worker 0 is killed
mid-run and resumed by a second run. The real jobs run the HF engine on the tiny model pair.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from specbatch import ledger
from specbatch.config import load_config
from specbatch.core import Row, SamplingParams, Status
from specbatch.sched.costmodel import CostModel
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.backend import SIM_TOKEN_ID
from specbatch.sim.worker import SimWorker, build_sim_engine

COST = CostModel(intercept_ms=2.0, target_passes=3.0, target_rows=0.05, draft_passes=0.5, draft_rows=0.02,
                 kv_tokens_read=0.0005)  # the simulated truth: round times
# domain -> (mean α, concentration): each request's α is drawn close to its domain's mean
ALPHAS = {"chat": (0.5, 40.0), "code": (0.85, 40.0), "math": (0.7, 40.0)}
SETTINGS = ("capacity.max_context=64", "scheduler.max_batch_rows=3", "scheduler.prefill_chunk=fixed:8",
            "buckets.batch_rows=[2,4]", "buckets.kv_len_multiple=16")
CANCELLED_ID, DEADLINE_S = "q07", 0.03  # its deadline passes while it runs on worker 1
CRASH_AFTER_ROUNDS = 6  # worker 0's first run is killed after this many rounds


@dataclass(frozen=True)
class FakeRequest:
    request_id: str
    domain: str
    num_prompt_tokens: int
    max_new_tokens: int
    num_output_tokens: int  # what the simulated model generates before it stops
    ends_with_eos: bool

    def row(self, arrival_s: float) -> Row:
        params = SamplingParams(max_new_tokens=self.max_new_tokens)
        return Row(self.request_id, [SIM_TOKEN_ID] * self.num_prompt_tokens, params, self.domain, arrival_s)


def fake_requests(seed: int, num_requests: int = 10) -> list[FakeRequest]:
    """Requests in three domains; some end by EOS before their max_new_tokens, the rest by length."""
    rng, out = random.Random(seed), []
    for i in range(num_requests):
        request_id = f"q{i:02d}"
        domain, num_prompt_tokens, max_new_tokens = rng.choice(sorted(ALPHAS)), rng.randint(4, 20), rng.randint(3, 14)
        ends_with_eos = rng.random() < 0.4
        if request_id == CANCELLED_ID:  # long, so that its deadline cuts it mid-run
            max_new_tokens, ends_with_eos = 20, False
        num_output_tokens = rng.randint(2, max_new_tokens) if ends_with_eos else max_new_tokens
        out.append(FakeRequest(request_id, domain, num_prompt_tokens, max_new_tokens, num_output_tokens,
                               ends_with_eos))
    return out


def sim_worker(job_dir: Path, worker_id: int, run_id: str, every_requests: int, requests: list[FakeRequest],
               drafter: str, start_s: float) -> SimWorker:
    """A simulated worker whose clock starts at start_s, flushing a part every `every_requests` results."""
    lookahead = "fixed:0" if drafter == "none" else "adaptive"
    config = load_config(None, [*SETTINGS, f"drafter.kind={drafter}", f"scheduler.lookahead={lookahead}",
                                "scheduler.max_lookahead=4"])
    writer = ledger.PartWriter(job_dir, worker_id, run_id, every_requests, every_s=1e9, durable=False)
    outputs = {r.request_id: (r.num_output_tokens, r.ends_with_eos) for r in requests}
    engine, clock = build_sim_engine(config, COST, DomainAcceptance(ALPHAS, seed=1), outputs, writer, worker_id,
                                     shared_prefixes=True)
    clock.now_s = start_s
    return SimWorker(worker_id, engine, clock, writer)


def record_invalid(worker: SimWorker) -> None:
    """Two records the ingest drops: never scheduled, recorded as the job's worker records them."""
    for request_id, reason, message, domain in (("bad-0", "invalid_json", "line 11: Expecting value", ""),
                                                ("bad-1", "empty_prompt", "prompt is empty", "chat")):
        row = Row(request_id, [], SamplingParams(max_new_tokens=0), domain)
        row.status, row.drop_reason, row.drop_message = Status.DROPPED, reason, message
        worker.record(row)


def serve(worker: SimWorker, requests: list[FakeRequest], deadlines_s: dict[str, float] | None = None,
          crash_after_rounds: int | None = None) -> dict[str, Row]:
    """Serve requests that all arrive now; a worker killed after `crash_after_rounds` rounds stops
    without its final flush, so whatever it buffered since its last part is lost."""
    rows = {r.request_id: r.row(worker.clock.now_s) for r in requests}
    for request_id, row in rows.items():
        worker.add(row, row.arrival_s, (deadlines_s or {}).get(request_id))
    while worker.has_work:
        if worker.engine.num_rounds == crash_after_rounds:
            return rows
        worker.cancel_due()
        worker.step()
        worker.writer.maybe_flush()
    worker.writer.flush()
    return rows


def write_speculative_job(job_dir: Path) -> None:
    """Two workers; worker 0 is killed, leaves a half-written part, and a second run resumes it."""
    requests = fake_requests(1)
    first = sim_worker(job_dir, 0, "run1", 1, requests[:6], "draft", start_s=1000.0)
    record_invalid(first)
    serve(first, requests[:6], crash_after_rounds=CRASH_AFTER_ROUNDS)
    second = sim_worker(job_dir, 1, "run1", 2, requests[6:], "draft", start_s=1000.002)
    cancelled = serve(second, requests[6:], {CANCELLED_ID: DEADLINE_S})[CANCELLED_ID]
    assert cancelled.status is Status.CANCELLED and cancelled.num_output_tokens > 0, "q07 should be cut mid-run"
    # what a kill during a flush leaves: a rounds file whose results file never landed, and a .tmp
    committed = ledger.committed_parts(job_dir)[0]
    shutil.copy(job_dir / "rounds" / f"{committed}.parquet", job_dir / "rounds" / "part-w00-run1-00099.parquet")
    (job_dir / "results" / "part-w00-run1-00099.parquet.tmp").write_bytes(b"half")
    done = ledger.committed_request_ids(job_dir)
    again = [r for r in requests[:6] if r.request_id not in done]
    assert again and len(again) < 6, "the crash should leave some requests done and some to redo"
    stepped = set(ledger.read_table(job_dir, "steps").column("request_id").to_pylist())
    assert stepped & {r.request_id for r in again}, "a committed part should hold steps of a request it lost"
    resumed = sim_worker(job_dir, 0, "run-2", 3, again, "draft", start_s=first.clock.now_s + 50.0)
    serve(resumed, again)


def write_plain_job(job_dir: Path) -> None:
    requests = fake_requests(1)
    worker = sim_worker(job_dir, 0, "run1", 4, requests, "none", start_s=2000.0)
    record_invalid(worker)
    serve(worker, requests, {CANCELLED_ID: DEADLINE_S})


def write_dropped_only_job(job_dir: Path) -> None:
    worker = sim_worker(job_dir, 0, "run1", 10, [], "none", start_s=0.0)
    record_invalid(worker)
    worker.writer.flush()


def write_real_jobs(root: Path, tiny_pair) -> list[Path]:
    """Two small real jobs (draft-model speculation and none) run by the engine on the tiny pair."""
    from engine_helpers import random_prompts, tiny_config

    from specbatch.engine.build import build_hf_engine, load_models
    from specbatch.loop import generate

    requests = random_prompts(tiny_pair[2], 12, seed=21)
    jobs = []
    for drafter in ("none", "draft"):
        config = tiny_config(tiny_pair, f"drafter.kind={drafter}", "scheduler.max_batch_rows=5")
        job_dir = root / f"real-{drafter}"
        writer = ledger.PartWriter(job_dir, 0, "run1", every_requests=4, every_s=1e9)
        engine = build_hf_engine(config, load_models(config), writer)
        generate(engine, [Row(f"r{i}", p, SamplingParams(max_new_tokens=m), ("code", "prose")[i % 2])
                          for i, (p, m) in enumerate(requests)])
        writer.flush()
        jobs.append(job_dir)
    return jobs
