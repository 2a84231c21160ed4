"""One pass of the bundled pair, eager against captured graphs (`models.graphs`), side by side.

Times what issue 12's goals name: a target pass of 1 query position at context 160 (batch 1 and 32),
a verify pass of 5 positions (k = 4), and a draft step at batch 1, each through the engine's
`SlotModel` as a round runs it (padding to the graph mode's buckets included). Capture time is
printed apart, compiled from an empty cache.

Run on a quiet machine:

    .venv/bin/python benchmarks/graph_pass_times.py [--modes eager,compile] [--json F]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specbatch.config import load_config
from specbatch.engine.build import hf_backend, load_models
from specbatch.engine.drafters import DraftModelDrafter
from specbatch.engine.forward import SlotModel
from specbatch.engine.graphs import use_compile_cache

CONTEXT = 160
PASSES = (("target", 1, 1), ("target", 32, 1), ("target", 1, 5), ("target", 32, 5), ("draft", 1, 1),
          ("draft", 32, 1))


def mean_ms(model: SlotModel, num_rows: int, query_len: int, repeats: int) -> float:
    slots, starts = list(range(num_rows)), [CONTEXT - query_len] * num_rows
    chunks = [[7] * query_len] * num_rows
    for _ in range(3):
        model.forward(slots, starts, chunks)
    started = time.perf_counter()
    for _ in range(repeats):
        model.forward(slots, starts, chunks)
    return (time.perf_counter() - started) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    use_compile_cache(Path(tempfile.mkdtemp(prefix="graph-pass-times-")))
    results: dict[str, dict[str, float]] = {}
    models = load_models(load_config())
    for mode in args.modes.split(","):
        config = load_config(None, [f"models.graphs={mode}"])
        started = time.perf_counter()
        backend, _ = hf_backend(config, models)
        assert isinstance(backend.drafter, DraftModelDrafter)
        roles = {"target": backend.target, "draft": backend.drafter.draft}
        for role, num_rows, query_len in PASSES:  # the first pass of each shape captures its graph
            roles[role].warm_up([(num_rows, query_len)])
        results[mode] = {"capture_s": time.perf_counter() - started}
        for role, num_rows, query_len in PASSES:
            key = f"{role} rows={num_rows} q={query_len} ms"
            results[mode][key] = mean_ms(roles[role], num_rows, query_len, args.repeats)
    keys = list(next(iter(results.values())))
    print(f"{'pass':28}" + "".join(f"{mode:>14}" for mode in results))
    for key in keys:
        print(f"{key:28}" + "".join(f"{results[mode][key]:>14.3f}" for mode in results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
