"""Benchmark workloads whose prompts share prefixes, as offline batch jobs do.

Three shapes, each a long shared block followed by a short unique part and a short answer:
- `fewshot`: an instruction and labelled examples, then one snippet to label (`max_new_tokens` ~8);
- `chat`: a long system prompt, then one user turn;
- `document`: one document, then a question about it.
`shared-prefix` mixes the three, `num_prefixes` distinct prefixes per kind, rows interleaved (row i
takes prefix i mod P), the hardest order for a cache that only keeps the last prefix. Every text is
held-out corpus text (`models/corpus.py`), so no workload repeats what the bundled pair trained on.
Prompts are token ids: each prompt is its prefix's ids followed by its suffix's, so rows sharing a
prefix share exactly those ids (tokenizing the joined text could merge tokens at the seam).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbatch.data.shards import PromptEncoder
from specbatch.lab.instruct_workloads import INSTRUCT_WORKLOADS, instruct_workload_prompts
from specbatch.lab.prompts import BenchPrompt, heldout_prompts
from specbatch.models.corpus import documents

LABELS = ("code", "prose")
WORKLOADS = ("heldout", "shared-prefix", "fewshot", "chat", "document")


@dataclass(frozen=True)
class WorkloadSize:
    prefix_tokens: int = 560  # the shared block, about
    suffix_tokens: int = 24  # the unique part, at most
    num_prefixes: int = 3  # distinct shared blocks per kind, rows interleaved over them
    max_new_tokens: int = 8


def shared_prefix_prompts(kind: str, tokenizer: Any, num_prompts: int, size: WorkloadSize = WorkloadSize(),
                          seed: int = 0) -> list[BenchPrompt]:
    """`num_prompts` prompts of workload `kind` (not `heldout`), deterministic for a seed."""
    if kind not in WORKLOADS[1:]:
        raise ValueError(f"unknown workload {kind!r}; one of {', '.join(WORKLOADS[1:])}")
    rng = random.Random(f"specbatch.workload:{kind}:{seed}")
    encode = PromptEncoder(tokenizer).encode
    snippets = [doc.text for domain in ("prose", "code") for doc in documents(domain, "heldout")]
    snippets.sort()
    kinds = ("fewshot", "chat", "document") if kind == "shared-prefix" else (kind,)
    prefixes = [(name, index) for index in range(size.num_prefixes) for name in kinds]
    prefix_ids = [_prefix_ids(name, rng, snippets, encode, size.prefix_tokens) for name, _ in prefixes]
    prompts = []
    for index in range(num_prompts):
        name = prefixes[index % len(prefixes)][0]
        suffix = encode([_SUFFIXES[name](rng, snippets)])[0][: size.suffix_tokens]
        prompts.append(BenchPrompt(f"{name}-{index:05d}", name, tuple(prefix_ids[index % len(prefixes)] + suffix),
                                   size.max_new_tokens))
    return prompts


def workload_prompts(workload: str, tokenizer: Any, num_prompts: int, max_new_tokens: int,
                     seed: int) -> list[BenchPrompt]:
    """A bench workload's prompts by name: `heldout`, an instruct workload, or a shared-prefix kind
    at its default size (the benchmark scripts' `--workload`)."""
    if workload == "heldout":
        return heldout_prompts(tokenizer, num_prompts, max_new_tokens, seed=seed)
    if workload in INSTRUCT_WORKLOADS:
        return instruct_workload_prompts(workload, tokenizer, num_prompts, max_new_tokens, seed=seed)
    return shared_prefix_prompts(workload, tokenizer, num_prompts, WorkloadSize(max_new_tokens=max_new_tokens),
                                 seed=seed)


def _excerpt(rng: random.Random, snippets: list[str], max_chars: int) -> str:
    text = rng.choice(snippets)
    start = rng.randrange(max(1, len(text) - max_chars))
    return " ".join(text[start : start + max_chars].split())


def _prefix_ids(kind: str, rng: random.Random, snippets: list[str], encode: Callable[[list[str]], list[list[int]]],
                num_tokens: int) -> list[int]:
    """The kind's heading, then its pieces (labelled examples, notes, document text) until the
    block holds `num_tokens` tokens."""
    heading, piece = _PREFIXES[kind]
    text = heading
    while len(ids := encode([text])[0]) < num_tokens:
        text += piece(rng, snippets)
    return ids[:num_tokens]


_PREFIXES: dict[str, tuple[str, Callable[[random.Random, list[str]], str]]] = {
    "fewshot": ("Label each text as code or prose. Answer with one word.\n\n",
                lambda rng, snippets: f"Text: {_excerpt(rng, snippets, 160)}\nLabel: {rng.choice(LABELS)}\n\n"),
    "chat": ("<|system|>\nYou are a careful assistant. Follow these notes when you answer:\n",
             lambda rng, snippets: f"- {_excerpt(rng, snippets, 240)}\n"),
    "document": ("Read the document, then answer the question.\n\nDocument:\n",
                 lambda rng, snippets: _excerpt(rng, snippets, 600) + "\n"),
}
_SUFFIXES: dict[str, Callable[[random.Random, list[str]], str]] = {
    "fewshot": lambda rng, snippets: f"Text: {_excerpt(rng, snippets, 60)}\nLabel:",
    "chat": lambda rng, snippets: f"<|user|>\nWhat does this mean: {_excerpt(rng, snippets, 50)}\n<|assistant|>\n",
    "document": lambda rng, snippets: f"Question: where does it say '{_excerpt(rng, snippets, 30)}'?\nAnswer:",
}
