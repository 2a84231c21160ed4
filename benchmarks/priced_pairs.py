"""Configurations compared drift-free: alternating engine runs on the same held-out prompts, one cost
model fitted on every round of all runs (round time less planning), and each run priced at the sum of
its rounds' predicted work plus its measured planning and time outside rounds (refits, records).
Runs doing the same work price the same; what differs is what a policy chose and what its
bookkeeping cost. On a VM whose round times swing 2x this separates 2% where wall time cannot.

    python benchmarks/priced_pairs.py BATCH PROMPTS PAIRS SPEC [SPEC ...] [--rounds FILE]
    (SPEC: drafter/lookahead, e.g. none/ draft/fixed:2 draft/adaptive; --rounds writes every run's
    rounds, tagged with spec and run, to a Parquet file so other fits can be tried on them)
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import typer
from transformers.utils import logging as hf_logging

from specbatch.config import JobConfig, load_config
from specbatch.lab.bench import load_models_for, run_engine
from specbatch.lab.prompts import heldout_prompts
from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CostModel


def config(spec: str, batch: int) -> JobConfig:
    drafter, lookahead = spec.split("/")
    return load_config(None, [f"scheduler.max_batch_rows={batch}", f"drafter.kind={drafter}",
                              *([f"scheduler.lookahead={lookahead}"] if lookahead else [])])


def main(batch: int, num_prompts: int, num_pairs: int, specs: list[str],
         rounds_file: Path | None = typer.Option(None, "--rounds")) -> None:
    hf_logging.set_verbosity_error()
    # the draft model always: it runs the warm-up
    models = load_models_for(load_config(), ["draft", *(spec.split("/")[0] for spec in specs)])
    prompts = heldout_prompts(models.tokenizer, num_prompts, 128, seed=0)
    run_engine(config("draft/fixed:2", batch), models, prompts[:batch])  # warm-up
    runs: dict[str, list] = {spec: [] for spec in specs}
    for pair in range(num_pairs):
        for spec in specs if pair % 2 == 0 else specs[::-1]:
            runs[spec].append(run_engine(config(spec, batch), models, prompts))
    rounds = [r for spec in specs for run in runs[spec] for r in run.recorder.rounds if r.warmup_ms == 0]
    if rounds_file:
        pq.write_table(pa.Table.from_pylist([{"spec": spec, "run": i, **asdict(r)} for spec in specs
                                             for i, run in enumerate(runs[spec]) for r in run.recorder.rounds]),
                       rounds_file)
    model = CostModel.fit(pa.Table.from_pylist([asdict(replace(r, round_ms=r.round_ms - r.plan_ms)) for r in rounds]))

    def work_ms(r: RoundRecord) -> float:
        return model.predict_ms(r.num_target_passes, r.num_target_rows + r.num_padded_target_rows, r.num_draft_passes,
                                r.num_draft_rows + r.num_padded_draft_rows, r.num_kv_tokens_read,
                                r.num_wide_kv_tokens_read)

    rates = {}
    for spec in specs:
        priced = []
        for run in runs[spec]:
            tokens, rs = sum(row.num_output_tokens for row in run.rows), run.recorder.rounds
            work, plan = sum(map(work_ms, rs)), sum(r.plan_ms for r in rs)
            outside = run.wall_s * 1000 - sum(r.round_ms for r in rs)
            residual = statistics.median((r.round_ms - r.plan_ms) / work_ms(r) for r in rs if r.warmup_ms == 0)
            priced.append(tokens / (work + plan + outside))
            print(f"{spec}: measured {tokens / run.wall_s / 1000:.3f} tok/ms, priced {priced[-1]:.3f} "
                  f"(work {work:.0f} ms, planning {plan:.1f}, outside rounds {outside:.1f}, {len(rs)} rounds; "
                  f"median round measured / priced {residual:.3f})")
        rates[spec] = statistics.median(priced)
    print("priced, x", specs[0], {spec: round(rates[spec] / rates[specs[0]], 4) for spec in specs})


if __name__ == "__main__":
    typer.run(main)
