"""Benchmark workloads with structured output (issue 42), for an instruct target such as SmolLM2.

- `extraction`: the `json` workload's prompts (one extraction instruction over many short held-out
  texts, `lab/instruct_workloads.py`) with its schema as a JSON-schema constraint: the same prompts
  run unconstrained (`--workload json`) and constrained, so the two rates compare directly;
- `classification`: "code or prose?" over held-out texts, answered under a choice constraint.

References are the target's own greedy decoding under the same llguidance masks, one prompt at a
time (`masked_greedy_references`); `valid_share` checks finished outputs against their constraint
(JSON schema with `jsonschema`, a choice by membership).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import llguidance
import llguidance.torch
import torch

from specbatch.config import ConfigError
from specbatch.core import Row
from specbatch.data.constraints import Constraint, llguidance_tokenizer, parse_constraint
from specbatch.engine.build import Models, eos_token_ids, grammar_eos
from specbatch.engine.constraints import apply_bitmask
from specbatch.engine.forward import cache_argument
from specbatch.lab.instruct_workloads import instruct_workload_prompts
from specbatch.lab.prompts import BenchPrompt
from specbatch.models.corpus import Domain, documents

CONSTRAINED_WORKLOADS = ("extraction", "classification")
_TEXT = {"type": "string", "maxLength": 80}
EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {"title": _TEXT, "kind": {"enum": ["code", "prose"]}, "topic": _TEXT,
                   "keywords": {"type": "array", "items": _TEXT, "maxItems": 5},
                   "num_sentences": {"type": "integer"}, "mentions_numbers": {"type": "boolean"}},
    "required": ["title", "kind", "topic", "keywords", "num_sentences", "mentions_numbers"],
    "additionalProperties": False,
}
LABELS: list[Domain] = ["code", "prose"]
CLASSIFY_INSTRUCTION = "Is the text below source code or prose? Answer with one word: code or prose.\n\nText:\n"


def constrained_workload_prompts(kind: str, tokenizer: Any, num_prompts: int, max_new_tokens: int,
                                 seed: int = 0) -> list[BenchPrompt]:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"workload {kind!r} needs a target with a chat template (an instruct model)")
    if kind == "extraction":
        constraint = parse_constraint({"json_schema": EXTRACTION_SCHEMA})
        assert constraint is not None
        return [BenchPrompt(f"extraction-{i:05d}", "json", prompt.prompt_ids, max_new_tokens, constraint.to_json())
                for i, prompt in enumerate(instruct_workload_prompts("json", tokenizer, num_prompts, max_new_tokens,
                                                                     seed))]
    if kind == "classification":
        constraint = parse_constraint({"choice": LABELS})
        assert constraint is not None
        rng = random.Random(f"specbatch.workload:classification:{seed}")
        docs = {domain: sorted(documents(domain, "heldout"), key=lambda doc: doc.doc_id) for domain in LABELS}
        prompts = []
        for index in range(num_prompts):
            pool = docs[LABELS[index % 2]]
            message = [{"role": "user", "content": CLASSIFY_INSTRUCTION + pool[rng.randrange(len(pool))].text[:400]}]
            rendered = tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=False)
            ids = tuple(tokenizer(str(rendered), add_special_tokens=False)["input_ids"])
            prompts.append(BenchPrompt(f"classification-{index:05d}", LABELS[index % 2], ids, max_new_tokens,
                                       constraint.to_json()))
        return prompts
    raise ValueError(f"unknown constrained workload {kind!r}; one of {', '.join(CONSTRAINED_WORKLOADS)}")


@torch.no_grad()
def masked_greedy_references(models: Models, prompts: list[BenchPrompt]) -> dict[str, list[int]]:
    """The target's own greedy decoding of each prompt alone, under its constraint's llguidance masks
    (plain greedy decoding for a prompt without one)."""
    model = models.target
    vocab = model.get_output_embeddings().weight.shape[0]
    eos, stops = grammar_eos(models), eos_token_ids(models)
    tokenizer = llguidance_tokenizer(models.tokenizer, vocab, eos)
    argument = cache_argument(model)  # `cache` or `past_key_values`, by transformers version
    refs = {}
    for prompt in prompts:
        matcher = None if prompt.constraint is None else llguidance.LLMatcher(
            tokenizer, Constraint.from_json(prompt.constraint).grammar(), log_level=0)
        ids, past, out = torch.tensor([prompt.prompt_ids], device=model.device), None, []
        for _ in range(prompt.max_new_tokens):
            output = model(input_ids=ids, use_cache=True, **{argument: past})
            past, logits = output.past_key_values, output.logits[0, -1, :vocab]
            if matcher is not None:
                bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
                if not bool(bitmask.any()):  # the grammar stopped: only the end token
                    bitmask[0, eos // 32] = 1 << (eos % 32) if eos % 32 < 31 else -(1 << 31)
                logits = apply_bitmask(logits[None], bitmask.to(logits.device))[0]
            token = int(logits.argmax())
            out.append(token)
            if token in stops:
                break
            if matcher is not None:
                matcher.consume_token(token)
            ids = torch.tensor([[token]], device=model.device)
        refs[prompt.request_id] = out
    return refs


def valid_share(prompts: list[BenchPrompt], rows: list[Row], tokenizer: Any) -> float | None:
    """Of the constrained rows that finished (EOS), the share whose text satisfies the constraint;
    None without any."""
    return valid_share_of(prompts, {row.request_id: row.output_ids for row in rows if row.finish_reason == "eos"},
                          tokenizer)


def valid_share_of(prompts: list[BenchPrompt], finished: dict[str, list[int]], tokenizer: Any) -> float | None:
    """`valid_share` over the token ids of the requests that finished by EOS (a peer's outputs too)."""
    constraints = {prompt.request_id: prompt.constraint for prompt in prompts if prompt.constraint is not None}
    checked = [(Constraint.from_json(constraints[request_id]), ids) for request_id, ids in finished.items()
               if request_id in constraints]
    if not checked:
        return None
    valid = sum(is_valid(constraint, str(tokenizer.decode(ids, skip_special_tokens=True)))
                for constraint, ids in checked)
    return valid / len(checked)


def is_valid(constraint: Constraint, text: str) -> bool:
    """Whether `text` satisfies `constraint` (checked apart from the grammar library)."""
    if constraint.kind == "choice":
        return text in json.loads(constraint.text)
    if constraint.kind == "regex":
        return re.fullmatch(constraint.text, text) is not None
    if constraint.kind in ("json_schema", "json_object"):
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), json.loads(constraint.text))
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return True  # a Lark grammar has no second checker here
