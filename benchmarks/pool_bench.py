"""The same job run locally and through a Prefect work pool on an object store (issue 14).

Starts an S3-compatible server (moto) and a Prefect server on 127.0.0.1, a process work pool and two
Prefect workers (`--limit 1`, each in its own empty directory), writes a JSONL of held-out prompts of
the bundled pair, then runs `specbatch submit` once per configuration, one after another:

    local-1    local disk, one worker in the flow's process
    local-2    local disk, two worker processes
    s3-1       job and dataset on the object store, one worker in the flow's process
    pool-1     object store, workers.placement=pool, one slot
    pool-2     object store, workers.placement=pool, two slots
    pool-2-t1  as pool-2, one CPU thread per worker run (both "machines" share this machine's cores)

Per run: wall time of the submit command, records/s over it, the work span (the longest worker's
first round start to last round end, each on its own clock) and the overhead (wall minus work span:
Prefect, ingest, model loads, flow-run starts, finalize). Needs the test extras (moto). Run with
nothing else on the machine:

    .venv/bin/python benchmarks/pool_bench.py [--prompts 2000] [--max-new-tokens 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.engine.loading import load_tokenizer
from specbatch.job.processes import stop_groups
from specbatch.lab.prompts import heldout_prompts
from specbatch.lab.services import make_bucket, prefect_server, s3_server
from specbatch.ledger import read_table

POOL = "bench"
RUNS = {  # name -> (on the object store, --set overrides)
    "local-1": (False, []),
    "local-2": (False, ["workers.num_processes=2"]),
    "s3-1": (True, []),
    "pool-1": (True, ["workers.placement=pool", "workers.slots=1", f"workers.pool={POOL}"]),
    "pool-2": (True, ["workers.placement=pool", "workers.slots=2", f"workers.pool={POOL}"]),
    # both "machines" are this one: one thread per worker run, as local-2 splits the cores
    "pool-2-t1": (True, ["workers.placement=pool", "workers.slots=2", f"workers.pool={POOL}", "models.num_threads=1"]),
}


def write_dataset(path: Path, num_prompts: int, max_new_tokens: int) -> None:
    tokenizer = load_tokenizer(JobConfig().models)
    prompts = heldout_prompts(tokenizer, num_prompts, max_new_tokens, min_new_tokens=max_new_tokens)
    with path.open("w") as out:
        for prompt in prompts:
            text = tokenizer.decode(list(prompt.prompt_ids))
            out.write(json.dumps({"id": prompt.request_id, "prompt": text, "max_new_tokens": max_new_tokens,
                                  "domain": prompt.domain}) + "\n")


def work_span_s(job_dir: str) -> float:
    rounds = read_table(job_dir, "rounds").select(["worker_id", "started_s", "round_ms"]).to_pylist()
    spans: dict[int, list[float]] = {}
    for r in rounds:
        span = spans.setdefault(r["worker_id"], [r["started_s"], r["started_s"]])
        span[0] = min(span[0], r["started_s"])
        span[1] = max(span[1], r["started_s"] + r["round_ms"] / 1000)
    return max((end - start for start, end in spans.values()), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    prefect = str(Path(sys.executable).with_name("prefect"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "prompts.jsonl"
        write_dataset(dataset, args.prompts, args.max_new_tokens)
        with s3_server(tmp / "moto.log") as s3_env, prefect_server(tmp / "prefect") as prefect_env:
            from s3fs import S3FileSystem

            bucket = make_bucket("bench")
            S3FileSystem().put_file(str(dataset), f"{bucket}/prompts.jsonl")
            env = {**os.environ, **s3_env, **prefect_env, "COLUMNS": "200"}
            subprocess.run([prefect, "--no-prompt", "work-pool", "create", POOL, "--type", "process"], env=env,
                           check=True, capture_output=True)
            workers = []
            for name in ("machine-a", "machine-b"):
                home = tmp / name
                home.mkdir()
                with (tmp / f"{name}.log").open("ab") as log:
                    workers.append(subprocess.Popen(
                        [prefect, "worker", "start", "--pool", POOL, "--limit", "1", "--name", name], cwd=home,
                        env={**env, "PREFECT_HOME": str(home / ".prefect")}, stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True))
            try:
                for name, (remote, overrides) in RUNS.items():
                    source = f"{bucket}/prompts.jsonl" if remote else str(dataset)
                    output = f"{bucket}/jobs" if remote else str(tmp / "jobs")
                    sets = [item for o in [f"drafter.kind={args.drafter}", *overrides] for item in ("--set", o)]
                    started = time.perf_counter()
                    run = subprocess.run([sys.executable, "-m", "specbatch.cli", "submit", source, "--job-id", name,
                                          "--output", output, *sets], cwd=tmp, env=env, capture_output=True,
                                         text=True)
                    wall_s = time.perf_counter() - started
                    if run.returncode != 0:
                        raise SystemExit(f"{name} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
                    job_dir = f"{output}/{name}"
                    records = read_table(job_dir, "results").num_rows
                    work_s = work_span_s(job_dir)
                    rows.append({"run": name, "records": records, "wall_s": round(wall_s, 2),
                                 "records_per_s": round(records / wall_s, 2), "work_span_s": round(work_s, 2),
                                 "overhead_s": round(wall_s - work_s, 2)})
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                stop_groups(workers, grace_s=30)
    base = rows[0]["records_per_s"]
    print(f"\n{'run':8} {'records':>7} {'wall s':>7} {'rec/s':>7} {'x local-1':>9} {'work s':>7} {'overhead s':>10}")
    for row in rows:
        print(f"{row['run']:8} {row['records']:7d} {row['wall_s']:7.1f} {row['records_per_s']:7.1f} "
              f"{row['records_per_s'] / base:9.2f} {row['work_span_s']:7.1f} {row['overhead_s']:10.1f}")
    if args.out:
        args.out.write_text(json.dumps({"prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                                        "drafter": args.drafter, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
