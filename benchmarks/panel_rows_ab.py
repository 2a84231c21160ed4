"""A whole engine job with the streamed GEMM's row bound set by hand, bounds interleaved in one process:
what the bound `engine/panel_rows.py` measured is worth on a job, against another bound.

    python benchmarks/panel_rows_ab.py --bounds 64,inf --batch-size 8 [--set models.target=smollm2-135m]

Prints each bound's tokens/s per repeat and the median ratio to the first bound (the bound is set for
the job's dtype). Run it alone: two torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import math
import statistics

from specbatch.config import load_config
from specbatch.engine import packed_linear
from specbatch.lab.bench import load_models_for, run_engine
from specbatch.lab.workloads import workload_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--bounds", default="64,inf", help="row bounds to compare (inf: every count)")
    parser.add_argument("--workload", default="heldout", help="heldout | instruct | json | fewshot | ...")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config(None, [*args.overrides, f"drafter.kind={args.drafter}",
                                f"scheduler.max_batch_rows={args.batch_size}"])
    models = load_models_for(config, [args.drafter])
    prompts = workload_prompts(args.workload, models.tokenizer, args.prompts, args.max_new_tokens, config.seed)
    measured = packed_linear.panel_rows
    bounds = [float(bound) for bound in args.bounds.split(",")]
    run_engine(config, models, prompts)  # warm
    tokens_per_s: dict[float, list[float]] = {bound: [] for bound in bounds}
    for _ in range(args.repeats):
        for bound in bounds:
            packed_linear.panel_rows = lambda dtype, bound=bound: bound  # type: ignore[assignment]
            run = run_engine(config, models, prompts)
            tokens_per_s[bound].append(sum(len(row.output_ids) for row in run.rows) / run.wall_s)
    packed_linear.panel_rows = measured
    first = statistics.median(tokens_per_s[bounds[0]])
    for bound, values in tokens_per_s.items():
        label = "every count" if bound == math.inf else f"{bound:.0f} rows"
        print(f"{label:>12}: tok/s {', '.join(f'{v:.1f}' for v in values)}  "
              f"median x first {statistics.median(values) / first:.3f}")


if __name__ == "__main__":
    main()
