"""The summary of benchmarks/speculation_grid.sh (issue 43): per cell and drafter, the speed over plain
decoding, the limit the measured α and costs allowed, the shares of it reached, and the issue's goals.

    .venv/bin/python benchmarks/speculation_grid_summary.py benchmarks/results/issue43

`x none` is measured (tokens per second over specbatch-none's in the same cell); `limit` is the decode
rounds' limit_speedup (sql/speculation_limit.sql); `job limit` is the job's: plain decoding's time with
its decode part at that limit and its prefill part (`prefill_time_share` of specbatch-none's rounds, work
no drafter shortens) as it was, 1 / (p + (1 - p) / limit); `of limit` is x none / job limit (the clock's;
x none / limit where a cell's files predate the prefill share), `planned` the share the plans reached at
the model's prices (realised_of_limit: the policy and α, not the clock). Outputs are compared with the
target's own greedy decoding in float32 cells only: bfloat16's differ by design
(benchmarks/low_precision_divergence.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("*-*-*-b*.json")):  # the grid's cells: TARGET-DTYPE-WORKLOAD-bBATCH
        target, dtype, workload, batch = path.stem.rsplit("-", 3)
        results = json.loads(path.read_text())["results"]
        plain: dict = next((r for r in results if r["name"] == "specbatch-none"), {})
        for result in results:
            if result["name"].startswith("specbatch-") and result["name"] != "specbatch-none":
                out.append({"cell": path.stem, "target": target, "dtype": dtype, "workload": workload,
                            "batch": int(batch.removeprefix("b")), **result,
                            "job_limit": job_limit(result.get("limit_speedup"), plain.get("prefill_time_share"))})
    return out


def job_limit(limit: float | None, prefill_share: float | None) -> float | None:
    """The speedup a job could get with its decode rounds at `limit` and its prefill unchanged."""
    if limit is None or prefill_share is None:
        return limit
    return 1 / (prefill_share + (1 - prefill_share) / limit)


def main(directory: Path) -> int:
    results = rows(directory)
    failures = []
    print(f"{'cell':<34} {'drafter':<34} {'x none':>7} {'limit':>7} {'job limit':>9} {'of limit':>8} "
          f"{'planned':>8} {'exact':>6}")
    for r in results:
        ratio, limit = r.get("ratio_vs_none"), r["job_limit"]
        of_limit = ratio / limit if ratio and limit else None
        print(f"{r['cell']:<34} {r['name'].removeprefix('specbatch-'):<34} {_f(ratio):>7} "
              f"{_f(r.get('limit_speedup')):>7} {_f(limit):>9} {_f(of_limit):>8} {_f(r.get('realised_of_limit')):>8} "
              f"{_f(r.get('exact_match')):>6}")
        if ratio is not None and ratio < 0.98:
            failures.append(f"{r['cell']} {r['name']}: {ratio:.3f}x plain decoding (goal >= 0.98)")
        if limit is not None and limit > 1.1 and of_limit is not None and of_limit < 0.9:
            failures.append(f"{r['cell']} {r['name']}: {of_limit:.3f} of its job limit {limit:.2f} (goal >= 0.9)")
        if r["dtype"] == "float32" and r.get("exact_match") != 1.0:
            failures.append(f"{r['cell']} {r['name']}: exact_match {r.get('exact_match')}")
    goals = [("smollm2-bfloat16-instruct-b1", None, 1.3), ("smollm2-float32-json-b8", "specbatch-suffix-adaptive", 2.0),
             ("smollm2-bfloat16-json-b8", "specbatch-suffix-adaptive", 2.0)]
    for cell, name, goal in goals:
        ratios = [r["ratio_vs_none"] or 0.0 for r in results
                  if r["cell"] == cell and (name is None or r["name"] == name)]
        if ratios and max(ratios) < goal:
            failures.append(f"{cell} {name or 'best drafter'}: {max(ratios):.3f}x plain decoding (goal >= {goal})")
    print("\ngoals: " + ("all met" if not failures else f"{len(failures)} missed"))
    for failure in failures:
        print(f"  {failure}")
    return 0


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/issue43")))
