"""What an EAGLE-3 head for an instruct target trains on: the target's own greedy answers to
`instruct_prompts`, with the target's features and its top-k next-token law recorded while it
generates them (one pass, no second forward), cached on disk batch by batch so that a killed run
resumes where it stopped. The head then trains on the cache without running the target.

A record holds, for a sequence of n tokens (P prompt tokens, then the answer through EOS):
features at positions 0..n − 2 (the last token is never fed) and, for each answer token, the
target's top-k ids and probabilities at the position before it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specbatch.models.checkpoint import load_plain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    token_ids: torch.Tensor  # [n] prompt then answer
    num_prompt_tokens: int  # P
    features: torch.Tensor  # [n − 1, 3·hidden] float16: inputs of the aux layers
    top_ids: torch.Tensor  # [n − P, k] int32: the target's top-k for answer tokens P..n − 1
    top_probs: torch.Tensor  # [n − P, k] float16


@dataclass(frozen=True)
class Generation:
    aux_layers: tuple[int, ...]
    max_new_tokens: int
    batch_size: int = 16
    top_k: int = 16


def cached_records(target: PreTrainedModel, prompts: list[list[int]], generation: Generation, directory: Path
                   ) -> list[Record]:
    """Records of `prompts` (in order), generating only the batches `directory` does not hold yet."""
    directory.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    num_batches = -(-len(prompts) // generation.batch_size)
    for index in range(num_batches):
        path = directory / f"batch-{index:05d}.pt"
        if not path.exists():
            batch = prompts[index * generation.batch_size : (index + 1) * generation.batch_size]
            rows = [_as_dict(r) for r in generate_records(target, batch, generation)]
            torch.save(rows, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)
            log.info("%s: batch %d/%d generated", directory.name, index + 1, num_batches)
        records.extend(Record(**row) for row in load_plain(path))
    return records


@torch.no_grad()
def generate_records(target: PreTrainedModel, prompts: list[list[int]], generation: Generation) -> list[Record]:
    """Greedy answers of `target` to `prompts` (one left-padded batch) with features and top-k laws."""
    pad = target.generation_config.pad_token_id or 0
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = target.generate(  # type: ignore[operator]  # transformers types generate loosely
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=generation.max_new_tokens,
        do_sample=False, output_hidden_states=True, output_logits=True, return_dict_in_generate=True,
        pad_token_id=pad)
    layers = generation.aux_layers
    # [b, width + steps − 1, 3·hidden]: the prompt pass, then one position per fed answer token
    features = torch.cat([torch.cat([step[i] for i in layers], dim=-1) for step in out.hidden_states], dim=1)
    logits = torch.stack(out.logits, dim=1).float()  # [b, steps, vocab]
    top_logits, top_ids = logits.topk(generation.top_k, dim=-1)
    top_probs = (top_logits - logits.logsumexp(dim=-1, keepdim=True)).exp()
    eos = _eos_ids(target)
    records = []
    for row, prompt in enumerate(prompts):
        answer = out.sequences[row, width:].tolist()
        length = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))
        start = width - len(prompt)
        records.append(Record(
            token_ids=torch.tensor(prompt + answer[:length]), num_prompt_tokens=len(prompt),
            features=features[row, start : width + length - 1].to(torch.float16).clone(),
            top_ids=top_ids[row, :length].to(torch.int32).clone(),
            top_probs=top_probs[row, :length].to(torch.float16).clone()))
    return records


def _eos_ids(target: PreTrainedModel) -> set[int]:
    eos = target.generation_config.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()


def _as_dict(record: Record) -> dict:
    return {"token_ids": record.token_ids, "num_prompt_tokens": record.num_prompt_tokens,
            "features": record.features, "top_ids": record.top_ids, "top_probs": record.top_probs}


def draft_vocabulary(records: list[Record], vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """The `draft_vocab_size` target ids the target answers with most often (then those its prompts
    hold most often, then lower ids first), ascending: the head's lm_head covers only these
    (EAGLE-3's reduced draft vocabulary)."""
    answers, prompts = torch.zeros(vocab_size, dtype=torch.long), torch.zeros(vocab_size, dtype=torch.long)
    for record in records:
        answers += torch.bincount(record.token_ids[record.num_prompt_tokens :], minlength=vocab_size)
        prompts += torch.bincount(record.token_ids[: record.num_prompt_tokens], minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda token: (-int(answers[token]), -int(prompts[token]), token))
    return torch.tensor(sorted(order[:draft_vocab_size]))


def coverage(records: list[Record], draft_ids: torch.Tensor, vocab_size: int) -> float:
    """Share of the answer tokens of `records` inside the draft vocabulary: a bound on acceptance."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[draft_ids] = True
    answers = torch.cat([r.token_ids[r.num_prompt_tokens :] for r in records])
    return float(inside[answers].float().mean())


@dataclass(frozen=True)
class RecordBatch:
    """Records side by side for the head, right-padded: head position p reads the feature at p and
    token p + 1 and predicts token p + 2, whose law is the target's top-k row p + 2 − P."""

    features: torch.Tensor  # [b, T, 3·hidden] float32
    token_ids: torch.Tensor  # [b, T]
    label_ids: torch.Tensor  # [b, T, k] long, −1 where a position has no label
    label_probs: torch.Tensor  # [b, T, k]
    first: torch.Tensor  # [b]: P − 1, the first position a served head predicts from
    lengths: torch.Tensor  # [b]: n − 2 positions per record


def record_batch(records: list[Record]) -> RecordBatch:
    width, top_k = max(len(r.token_ids) - 2 for r in records), records[0].top_ids.shape[1]
    features = torch.zeros(len(records), width, records[0].features.shape[1])
    token_ids = torch.zeros(len(records), width, dtype=torch.long)
    label_ids = torch.full((len(records), width, top_k), -1, dtype=torch.long)
    label_probs = torch.zeros(len(records), width, top_k)
    for row, record in enumerate(records):
        n, first = len(record.token_ids), record.num_prompt_tokens - 1
        features[row, : n - 2] = record.features[: n - 2].float()
        token_ids[row, : n - 2] = record.token_ids[1 : n - 1]
        label_ids[row, first : n - 2] = record.top_ids[1:].long()
        label_probs[row, first : n - 2] = record.top_probs[1:].float()
    return RecordBatch(features, token_ids, label_ids, label_probs,
                       torch.tensor([r.num_prompt_tokens - 1 for r in records]),
                       torch.tensor([len(r.token_ids) - 2 for r in records]))
