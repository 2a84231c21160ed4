"""One pass of the bundled pair, eager against captured graphs (`models.graphs`), side by side.

Times what issue 12's goals name: a target pass of 1 query position at context 160 (batch 1 and 32),
a verify pass of 5 positions (k = 4), and a draft step at batch 1, each through the engine's
`PagedModel` as a round runs it (padding to the graph mode's buckets included). Capture time is
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
from specbatch.engine.forward import PagedModel
from specbatch.engine.graphs import use_compile_cache

CONTEXT = 160
PASSES = (("target", 1, 1), ("target", 32, 1), ("target", 1, 5), ("target", 32, 5), ("draft", 1, 1),
          ("draft", 32, 1))


def one_pass(model: PagedModel, tables: list[list[int]], query_len: int) -> None:
    """A pass of each table's row, `query_len` positions after CONTEXT - query_len cached ones."""
    model.forward(tables, [CONTEXT - query_len] * len(tables), [[7] * query_len] * len(tables))


def mean_ms(model: PagedModel, num_rows: int, query_len: int, repeats: int) -> float:
    tables = model.scratch_tables(num_rows, CONTEXT)
    for _ in range(3):
        one_pass(model, tables, query_len)
    started = time.perf_counter()
    for _ in range(repeats):
        one_pass(model, tables, query_len)
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
        draft = backend.drafter.draft  # type: ignore[attr-defined]  # through the grammar's `ForcedDrafter`
        assert isinstance(draft, PagedModel)
        roles = {"target": backend.target, "draft": draft}
        for role, num_rows, query_len in PASSES:  # the first pass of each shape captures its graph
            one_pass(roles[role], roles[role].scratch_tables(num_rows, CONTEXT), query_len)
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
