"""Where a job's time goes, per drafter configuration: the engine alone (`run_engine`, warm) over a
bench workload, its rounds' recorded phases summed (plan, prefill, draft, verify, commit) beside the
work they did (draft rows, lookups, tokens indexed, drafts proposed and accepted), and its speed
against plain decoding run in the same process. Configurations run interleaved, `--repeats` times.

    .venv/bin/python benchmarks/job_phases.py --workload fewshot --batch-size 32 --prompts 64 \
        --drafters none,draft,suffix+ngram+draft [--set models.dtype=bfloat16] [--catch-up-samples 0]

`--catch-up-samples` sets how often a drafter must have been measured before every row may catch up
to it on the estimate's upper bound (`AdaptiveLookahead.min_job_samples`; 0: always, the rule before
issue 43's fourth session).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import fields

from specbatch.config import load_config
from specbatch.lab.bench import load_models_for, run_engine
from specbatch.lab.workloads import workload_prompts
from specbatch.loop import Engine
from specbatch.sched.lookahead import AdaptiveLookahead

PHASES = ("plan_ms", "prefill_ms", "draft_ms", "verify_ms", "commit_ms")
WORK = ("num_draft_rows", "num_lookup_rows", "num_indexed_tokens", "num_proposed", "num_accepted")
POLICY_CATCH_UP_SAMPLES = next(f.default for f in fields(AdaptiveLookahead) if f.name == "min_job_samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--workload", default="fewshot", help="heldout | fewshot | chat | document | instruct | json")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--drafters", default="none,draft,suffix+ngram+draft", help="drafter.kind per configuration")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--catch-up-samples", type=int, default=POLICY_CATCH_UP_SAMPLES)
    args = parser.parse_args()

    def catch_up_rule(engine: Engine) -> None:
        if isinstance(engine.scheduler.lookahead, AdaptiveLookahead):
            engine.scheduler.lookahead.min_job_samples = args.catch_up_samples
    kinds = args.drafters.split(",")
    configs = {kind: load_config(None, [*args.overrides, f"drafter.kind={kind}", "scheduler.lookahead=adaptive",
                                        f"scheduler.max_batch_rows={args.batch_size}"]) for kind in kinds}
    models = load_models_for(configs[kinds[0]], [part for kind in kinds for part in kind.split("+")])
    prompts = workload_prompts(args.workload, models.tokenizer, args.prompts, args.max_new_tokens,
                               configs[kinds[0]].seed)
    for kind in kinds:  # warm: allocator, kernels, the cached pass profile
        run_engine(configs[kind], models, prompts, prepare=catch_up_rule)
    tokens_per_s: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind in kinds:
            run = run_engine(configs[kind], models, prompts, prepare=catch_up_rule)
            tokens = sum(len(row.output_ids) for row in run.rows)
            tokens_per_s[kind].append(tokens / run.wall_s)
            sums = {field: sum(getattr(record, field) for record in run.recorder.rounds) for field in PHASES + WORK}
            print(f"{kind:<22} {run.wall_s * 1000:8.1f} ms {tokens / run.wall_s:8.1f} tok/s "
                  f"{len(run.recorder.rounds):4d} rounds  " + " ".join(f"{f}={sums[f]:.1f}" for f in PHASES)
                  + "  " + " ".join(f"{f.removeprefix('num_')}={sums[f]}" for f in WORK), flush=True)
    if "none" in tokens_per_s:
        plain = statistics.median(tokens_per_s["none"])
        print("median tok/s x none: " + ", ".join(f"{kind} {statistics.median(values) / plain:.3f}"
                                                  for kind, values in tokens_per_s.items()))


if __name__ == "__main__":
    main()
