"""Ingest + shard benchmark: a 1,000,000-record JSONL (with ~1% bad lines) into Parquet shards.

Goal (issue 3): >= 50,000 records/s and < 1 GiB peak RSS. Each measured run is a fresh child
process, so its peak RSS (`resource.getrusage`) is its own. Run:

    .venv/bin/python benchmarks/ingest_bench.py [--records N] [--shard-size N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specbatch.config import JobConfig

DEMO_TOKENIZER = Path(__file__).resolve().parents[1] / "specbatch" / "models" / "demo" / "target"
WORDS = [
    "the", "a", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as", "they",
    "def", "return", "import", "class", "self", "if", "else", "elif", "while", "yield", "lambda", "None",
    "print", "range", "len", "river", "mill", "light", "stone", "quietly", "morning", "evening", "window",
    "garden", "letter", "road", "city", "water", "fire", "(", ")", ":", "=", "+", "0", "1", "42", ",", ".",
]
DOMAINS = ("code", "prose", "math", "chat")
BAD_LINES = (
    b"{not json",
    b'{"prompt": ""}',
    b'{"prompt": "x", "temperature": NaN}',
    b'{"prompt": "x", "max_new_tokens": true}',
    b"[1, 2]",
    b'{"id": "dup", "prompt": "again"}',
    b'{"prompt": "bad bytes \xc3\x28"}',
)


def generate(path: Path, num_records: int, seed: int = 0) -> None:
    """JSONL with varied prompt lengths and fields; every 100th line is a bad one."""
    rng = random.Random(seed)
    with path.open("wb") as file:
        for index in range(num_records):
            if index % 100 == 99:
                file.write(BAD_LINES[(index // 100) % len(BAD_LINES)] + b"\n")
                continue
            record = {
                "id": f"q-{index}",
                "prompt": " ".join(rng.choices(WORDS, k=rng.randint(5, 60))),
                "domain": DOMAINS[index % len(DOMAINS)],
                "max_new_tokens": rng.randint(16, 256),
            }
            if index % 3 == 0:
                record.update(temperature=0.7, top_p=0.9, seed=index, stop=["\n\n"])
            file.write(json.dumps(record).encode() + b"\n")


def build_tokenizer(out_dir: Path) -> Path:
    """The demo target's tokenizer when trained, else a byte-level BPE trained on similar text."""
    if DEMO_TOKENIZER.exists():
        return DEMO_TOKENIZER
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(5, 60))) for _ in range(20_000)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    eos = "<|endoftext|>"
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=[eos], initial_alphabet=alphabet)
    backend.train_from_iterator(texts, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos).save_pretrained(out_dir)
    return out_dir


def measure(dataset: Path, job_dir: Path, shard_size: int, tokenizer_dir: str | None, profile: bool) -> dict:
    """One shard_dataset run in this process (a child): wall time and peak RSS."""
    from specbatch.data.shards import shard_dataset

    tokenizer = None
    if tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = JobConfig.model_validate({"io": {"shard_size": shard_size}})
    profiler = cProfile.Profile() if profile else None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    max_prompt_tokens = 1024 if tokenizer is not None else None
    shards = shard_dataset(dataset, job_dir, config, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, incl. the tokenizer's
    cpu_s = usage.ru_utime + usage.ru_stime - cpu_before
    num_records = sum(shard.num_records for shard in shards)
    return {
        "tokenizer": bool(tokenizer_dir),
        "num_records": num_records,
        "num_dropped": sum(shard.num_dropped for shard in shards),
        "num_shards": len(shards),
        "seconds": round(seconds, 2),
        "records_per_s": round(num_records / seconds),
        "cpu_s": round(cpu_s, 2),  # wall time is inflated when other jobs share the cores
        "records_per_cpu_s": round(num_records / cpu_s),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
    }


def run_child(dataset: Path, job_dir: Path, shard_size: int, tokenizer_dir: Path | None,
              profile: bool) -> dict:
    command = [sys.executable, __file__, "--child", str(dataset), str(job_dir)]
    command += ["--shard-size", str(shard_size)]
    if tokenizer_dir:
        command += ["--tokenizer", str(tokenizer_dir)]
    if profile:
        command.append("--profile")
    completed = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shard-size", type=int, default=JobConfig().io.shard_size)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each run to stderr")
    parser.add_argument("--child", nargs=2, metavar=("DATASET", "JOB_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        dataset, job_dir = (Path(arg) for arg in args.child)
        print(json.dumps(measure(dataset, job_dir, args.shard_size, args.tokenizer, args.profile)))
        return
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        root = Path(tmp)
        dataset = root / "bench.jsonl"
        start = time.perf_counter()
        generate(dataset, args.records)
        seconds, size_mib = time.perf_counter() - start, dataset.stat().st_size / 2**20
        print(f"generated {args.records:,} records ({size_mib:.0f} MiB) in {seconds:.1f} s")
        tokenizer_dir = build_tokenizer(root / "tokenizer")
        for tokenizer in (None, tokenizer_dir):
            job_dir = root / f"job-{bool(tokenizer)}"
            print(json.dumps(run_child(dataset, job_dir, args.shard_size, tokenizer, args.profile)))


if __name__ == "__main__":
    main()
