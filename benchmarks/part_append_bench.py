"""Time per part append as a job's part count grows: the old way vs the journal, in one process.

old: `update_manifest(job_dir, lambda m: m.parts.append(name))`, which loads, rewrites and fsyncs
the whole manifest per part (quadratic in parts over a job). new: `append_part`, one fsynced line
on `manifest.parts.log` (flat). Also timed, once per run rather than per part: `load_manifest`
folding an n-line journal, and the compaction of the next `update_manifest`. Run:

    .venv/bin/python benchmarks/part_append_bench.py [--parts 1000 100000 200000] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from specbatch.job.manifest import (
    JOURNAL_NAME,
    DatasetInfo,
    Manifest,
    append_part,
    load_manifest,
    save_manifest,
    update_manifest,
)
from specbatch.ledger import part_name

MIN_SECONDS = 2.0  # time each way for at least this long (and at least 3 appends)


def job_with_parts(job_dir: Path, num_parts: int, in_journal: bool) -> list[str]:
    """A job directory whose manifest lists `num_parts` parts: in manifest.json, or in the journal."""
    names = [part_name(i % 4, "r1", i // 4) for i in range(num_parts)]
    dataset = DatasetInfo(path="d.jsonl", format="jsonl", fingerprint="sha256:0")
    manifest = Manifest(job_id=job_dir.name, created_at="2024-01-01T00:00:00+00:00", dataset=dataset,
                        config={}, versions={}, parts=[] if in_journal else names)
    save_manifest(job_dir, manifest)
    if in_journal:
        (job_dir / JOURNAL_NAME).write_text("".join(name + "\n" for name in names))
    return names


def ms_per_call(call: Callable[[int], None]) -> tuple[float, int]:
    """Mean milliseconds of `call(i)` over at least MIN_SECONDS and 3 calls; and the call count."""
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < MIN_SECONDS:
        call(count)
        count += 1
    return (time.perf_counter() - start) * 1000 / count, count


def measure(root: Path, num_parts: int) -> dict[str, float]:
    old_dir, new_dir = root / f"old-{num_parts}", root / f"new-{num_parts}"
    job_with_parts(old_dir, num_parts, in_journal=False)
    job_with_parts(new_dir, num_parts, in_journal=True)

    def old(i: int) -> None:
        update_manifest(old_dir, lambda m: m.parts.append(part_name(9, "bench", i)))

    old_ms, old_count = ms_per_call(old)
    new_ms, new_count = ms_per_call(lambda i: append_part(new_dir, part_name(9, "bench", i)))
    start = time.perf_counter()
    assert len(load_manifest(new_dir).parts) == num_parts + new_count
    load_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    update_manifest(new_dir, lambda m: None)
    compact_ms = (time.perf_counter() - start) * 1000
    assert not (new_dir / JOURNAL_NAME).exists() and len(load_manifest(new_dir).parts) == num_parts + new_count
    return {"old_ms": old_ms, "old_n": old_count, "new_ms": new_ms, "new_n": new_count,
            "load_ms": load_ms, "compact_ms": compact_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, nargs="+", default=[1_000, 100_000, 200_000])
    parser.add_argument("--dir", type=Path, default=None, help="where the job directories go (a real disk)")
    args = parser.parse_args()
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) at start: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="part-append-") as tmp:
        print(f"job directories under {tmp} (fsync on every append, both ways)\n")
        header = ("parts", "old ms/append", "(n)", "new ms/append", "(n)", "old/new",
                  "load_manifest ms", "compaction ms")
        print("{:>8} {:>14} {:>5} {:>14} {:>6} {:>8} {:>17} {:>14}".format(*header))
        for num_parts in args.parts:
            r = measure(Path(tmp), num_parts)
            print(f"{num_parts:>8} {r['old_ms']:>14.2f} {r['old_n']:>5} {r['new_ms']:>14.3f} {r['new_n']:>6} "
                  f"{r['old_ms'] / r['new_ms']:>7.0f}x {r['load_ms']:>17.1f} {r['compact_ms']:>14.1f}",
                  flush=True)
    print("\nload average at end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("old = update_manifest per part (rewrite + fsync of all parts); new = append_part (one journal line).")
    print("load_manifest and compaction (the next update_manifest) run a few times per run, not per part.")


if __name__ == "__main__":
    main()
