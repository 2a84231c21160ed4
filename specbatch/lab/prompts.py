"""The prompts both benchmark suites run (`specbatch bench`, with or without `--suite policies`).

By default a prompt is the first tokens of a held-out corpus document, never one the bundled pair
trained on. Documents are tokenized as a job tokenizes its records (`PromptEncoder`: no special
tokens), so a benchmark feeds the models the same ids a job over the same text would. A user's own
dataset (`--prompts-file`) goes through a job's ingest itself.
"""

from __future__ import annotations

import math
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbatch.config import JobConfig
from specbatch.core import Row, SamplingParams
from specbatch.data.shards import PromptEncoder, read_shard_requests, shard_dataset
from specbatch.job.prepare import max_prompt_tokens
from specbatch.models.corpus import Domain, documents

DOMAINS: tuple[Domain, Domain] = ("code", "prose")


@dataclass(frozen=True)
class BenchPrompt:
    request_id: str
    domain: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    constraint: str | None = None  # structured output (`lab/constrained_workloads.py`), a Constraint as JSON

    @property
    def num_positions(self) -> int:
        """What the request can fill of a slot: its prompt and every token it may generate."""
        return len(self.prompt_ids) + self.max_new_tokens

    def to_row(self) -> Row:
        return Row(self.request_id, list(self.prompt_ids),
                   SamplingParams(max_new_tokens=self.max_new_tokens, constraint=self.constraint), self.domain)


def heldout_prompts(tokenizer: Any, num_prompts: int, max_new_tokens: int, *, min_new_tokens: int = 16,
                    prompt_tokens: int = 48, seed: int = 0) -> list[BenchPrompt]:
    """Code and prose alternating, each the first `prompt_tokens` tokens of a document drawn with a
    seeded RNG (from documents sorted by id, so the draw does not depend on corpus order), with
    max_new_tokens drawn uniformly in [min(min_new_tokens, max_new_tokens), max_new_tokens]."""
    rng = random.Random(seed)
    picks = {}
    for domain in DOMAINS:
        docs = sorted(documents(domain, "heldout"), key=lambda doc: doc.doc_id)
        picks[domain] = rng.sample(docs, min(len(docs), math.ceil(num_prompts / 2)))
    chosen = [picks[DOMAINS[i % 2]][(i // 2) % len(picks[DOMAINS[i % 2]])] for i in range(num_prompts)]
    ids = PromptEncoder(tokenizer).encode([doc.text for doc in chosen])
    low = min(min_new_tokens, max_new_tokens)
    return [BenchPrompt(f"{doc.domain}-{index:04d}", doc.domain, tuple(token_ids[:prompt_tokens]),
                        rng.randint(low, max_new_tokens))
            for index, (doc, token_ids) in enumerate(zip(chosen, ids, strict=True))]


def file_prompts(path: Path, config: JobConfig, tokenizer: Any) -> tuple[list[BenchPrompt], int]:
    """A user's dataset (any format a job reads), validated, tokenized and length-checked exactly as
    a job does it, in dataset order; returns the prompts and how many records were dropped. The
    bench decodes greedily: a record's sampling fields other than max_new_tokens are not used."""
    with tempfile.TemporaryDirectory(prefix="specbatch-bench-") as job_dir:
        shards = shard_dataset(path, Path(job_dir), config, tokenizer, max_prompt_tokens(config))
        requests = [r for shard in shards for r in read_shard_requests(Path(job_dir) / "shards" / shard.name)]
    kept = sorted((r for r in requests if not r.is_dropped), key=lambda r: r.position)
    prompts = [BenchPrompt(r.request_id, r.domain, tuple(r.prompt_token_ids or ()),
                           r.max_new_tokens or config.sampling.max_new_tokens) for r in kept]
    return prompts, len(requests) - len(kept)

