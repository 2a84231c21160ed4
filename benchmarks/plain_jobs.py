"""Plain decoding's job speed per batch size: the engine alone (`run_engine`, warm), the median of
`--repeats` runs, as JSON {batch rows: tokens/s}. To compare two revisions on equal terms, run it
from each revision's tree in turn, alternating, with nothing else running:

    git worktree add /tmp/old REV
    for i in 1 2 3; do
        (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/benchmarks/plain_jobs.py --set models.dtype=float32)
        python benchmarks/plain_jobs.py --set models.dtype=float32
    done
"""

from __future__ import annotations

import argparse
import json
import statistics

from specbatch.config import load_config
from specbatch.lab.bench import load_models_for, run_engine
from specbatch.lab.workloads import workload_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--workload", default="heldout")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated; prompts: 12 at 1 row, else 4 per row")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rates = {}
    for batch in (int(size) for size in args.batch_sizes.split(",")):
        config = load_config(None, [*args.overrides, "drafter.kind=none", f"scheduler.max_batch_rows={batch}"])
        models = load_models_for(config, ["none"])
        prompts = workload_prompts(args.workload, models.tokenizer, 12 if batch == 1 else 4 * batch,
                                   args.max_new_tokens, config.seed)
        run_engine(config, models, prompts)  # warm: allocator, kernels, the cached pass profile
        runs = []
        for _ in range(args.repeats):
            run = run_engine(config, models, prompts)
            runs.append(sum(len(row.output_ids) for row in run.rows) / run.wall_s)
        rates[batch] = round(statistics.median(runs), 1)
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
