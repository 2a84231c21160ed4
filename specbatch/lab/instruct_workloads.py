"""Benchmark workloads for an instruct (chat-template) target such as SmolLM2-135M-Instruct.

- `instruct`: held-out user requests, code and chat alternating (`models/instruct_data.py`, the same
  builder the SmolLM2 drafters trained on, over the held-out split);
- `json`: one extraction instruction and JSON schema over many short held-out texts, the repetitive
  shape of a real batch job (every answer repeats the schema's keys), where a drafter that learns
  from the job's earlier outputs has the most to find.
Both apply the target's chat template, so a target without one is refused.
"""

from __future__ import annotations

import json
import random
from typing import Any

from specbatch.config import ConfigError
from specbatch.lab.prompts import BenchPrompt
from specbatch.models.corpus import documents
from specbatch.models.instruct_data import instruct_prompts

INSTRUCT_WORKLOADS = ("instruct", "json")
JSON_SCHEMA = {"title": "string", "kind": "code or prose", "topic": "string", "keywords": ["string"],
               "num_sentences": "integer", "mentions_numbers": "boolean"}
JSON_INSTRUCTION = ("Extract these fields from the text below. Answer with one JSON object and nothing else, "
                    "using exactly this schema:\n" + json.dumps(JSON_SCHEMA) + "\n\nText:\n")


def instruct_workload_prompts(kind: str, tokenizer: Any, num_prompts: int, max_new_tokens: int,
                              seed: int = 0) -> list[BenchPrompt]:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"workload {kind!r} needs a target with a chat template (an instruct model)")
    if kind == "instruct":
        code = instruct_prompts(tokenizer, "code", "heldout", (num_prompts + 1) // 2, seed)
        chat = instruct_prompts(tokenizer, "chat", "heldout", num_prompts // 2, seed)
        rng = random.Random(f"specbatch.workload:instruct:{seed}")
        ids = [(code if i % 2 == 0 else chat)[i // 2] for i in range(num_prompts)]
        return [BenchPrompt(f"{'code' if i % 2 == 0 else 'chat'}-{i:05d}", "code" if i % 2 == 0 else "chat",
                            tuple(prompt), rng.randint(min(16, max_new_tokens), max_new_tokens))
                for i, prompt in enumerate(ids)]
    if kind == "json":
        return [BenchPrompt(f"json-{i:05d}", "json", tuple(prompt), max_new_tokens)
                for i, prompt in enumerate(_json_prompts(tokenizer, num_prompts, seed))]
    raise ValueError(f"unknown instruct workload {kind!r}; one of {', '.join(INSTRUCT_WORKLOADS)}")


def _json_prompts(tokenizer: Any, num_prompts: int, seed: int) -> list[list[int]]:
    """The extraction instruction over the first ~400 characters of held-out documents, prose and code
    alternating, drawn with a seeded RNG from documents sorted by id."""
    rng = random.Random(f"specbatch.workload:json:{seed}")
    docs = {domain: sorted(documents(domain, "heldout"), key=lambda doc: doc.doc_id) for domain in ("prose", "code")}
    prompts = []
    for index in range(num_prompts):
        pool = docs["prose" if index % 2 == 0 else "code"]
        text = pool[rng.randrange(len(pool))].text[:400]
        message = [{"role": "user", "content": JSON_INSTRUCTION + text}]
        rendered = tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=False)
        prompts.append(list(tokenizer(str(rendered), add_special_tokens=False)["input_ids"]))
    return prompts
