"""EAGLE-3's training-time test: the head run as it drafts, over whole sequences at once.

Step 1 reads the target's fused features; step s reads the head's own step s − 1 output at the
previous position and attends to the keys of earlier steps where a chain would have them, so later
draft positions are trained on the inputs they see at inference. Losses compare the head with the
target's next-token law, either whole logits (`chain_losses`, the bundled recipe) or the top-k
recorded while the target answered (`record_losses`, the instruct recipe).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from transformers import PreTrainedModel

from specbatch.engine.eagle import Attend, EagleHead
from specbatch.models.eagle_records import RecordBatch


def target_outputs(target: PreTrainedModel, layers: tuple[int, ...], windows: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused-to-be features [batch, len, 3·hidden] (inputs of `layers`) and logits [batch, len, vocab]."""
    with torch.no_grad():
        out = target(input_ids=windows, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits


def chain_outputs(head: EagleHead, features: torch.Tensor, token_ids: torch.Tensor, num_steps: int
                  ) -> Iterator[torch.Tensor]:
    """The head's outputs [batch, T, hidden] of chain steps 1..num_steps; position p reads features
    [batch, T, 3·hidden] at p and token_ids [batch, T] at p (the token after p)."""
    positions = torch.arange(token_ids.shape[1]).expand(token_ids.shape[0], -1)
    hidden = head.fuse(features)
    history: list[tuple[torch.Tensor, torch.Tensor]] = []
    for step in range(1, num_steps + 1):
        output = head(token_ids, hidden, positions, _chain_attend(history, step, head))
        yield output
        hidden = torch.cat([torch.zeros_like(output[:, :1]), output[:, :-1]], dim=1)  # step s + 1 reads p − 1


def chain_losses(head: EagleHead, features: torch.Tensor, windows: torch.Tensor, target_logits: torch.Tensor,
                 num_steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Soft cross-entropy and argmax agreement per chain step over windows [batch, T + 1].

    Position p reads token p + 1 and predicts token p + 2, whose target law is target_logits[:, p + 1].
    Step s at p reads the step s − 1 output at p − 1 and attends to step-1 keys at positions
    ≤ p − s + 1 and to the step-t key at p − (s − t) for t = 2..s, as a chain of s drafts would."""
    labels = torch.softmax(target_logits[:, 1:].float(), dim=-1)
    draft_ids = torch.arange(head.draft_vocab_size) + head.d2t  # target id of each draft id
    losses, agreement = [], []
    outputs = chain_outputs(head, features[:, :-1], windows[:, 1:], num_steps)
    for step, output in enumerate(outputs, start=1):
        valid = slice(step - 1, windows.shape[1] - 1)  # earlier positions have no step-s input
        logits = head.draft_logits(output[:, valid]).float()
        draft_labels = labels[:, valid][..., draft_ids]  # the target's mass on the draft vocabulary
        losses.append(-(draft_labels * torch.log_softmax(logits, dim=-1)).sum(-1).mean())
        agreement.append(float((draft_ids[logits.argmax(-1)] == labels[:, valid].argmax(-1)).float().mean()))
    return losses, agreement


def record_losses(head: EagleHead, batch: RecordBatch, num_steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Per chain step, soft cross-entropy to the target's recorded top-k (its mass on the draft
    vocabulary) and argmax agreement with the target's greedy token, over the positions a served
    chain of that many steps predicts from: step s at p needs a chain started at p − s + 1 ≥ P − 1."""
    draft_ids = torch.arange(head.draft_vocab_size) + head.d2t  # [draft vocab]: target id of each draft id
    to_draft = torch.full((head.config.vocab_size,), -1, dtype=torch.long)  # [vocab]: draft id or −1
    to_draft[draft_ids] = torch.arange(head.draft_vocab_size)
    positions = torch.arange(batch.token_ids.shape[1])
    losses, agreement = [], []
    for step, output in enumerate(chain_outputs(head, batch.features, batch.token_ids, num_steps), start=1):
        mask = (positions >= (batch.first + step - 1)[:, None]) & (positions < batch.lengths[:, None])  # [b, T]
        logits = head.draft_logits(output[mask]).float()  # [N, draft vocab]
        label_ids, label_probs = batch.label_ids[mask], batch.label_probs[mask]  # [N, k]
        drafted = to_draft[label_ids.clamp(min=0)]
        weights = label_probs * (drafted >= 0) * (label_ids >= 0)
        log_q = torch.log_softmax(logits, dim=-1).gather(-1, drafted.clamp(min=0))
        losses.append(-(weights * log_q).sum(-1).mean())
        agreement.append(float((draft_ids[logits.argmax(-1)] == label_ids[:, 0]).float().mean()))
    return losses, agreement


def _chain_attend(history: list[tuple[torch.Tensor, torch.Tensor]], step: int, head: EagleHead) -> Attend:
    """Attention of chain step `step` over the keys of steps 1..step (see `chain_losses`)."""
    groups = head.config.num_attention_heads // head.num_kv_heads

    def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        history.append((key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)))
        length, scale = query.shape[2], query.shape[-1] ** -0.5
        first_keys, first_values = history[0]
        scores = [torch.einsum("bhqd,bhkd->bhqk", query, first_keys) * scale]
        visible = torch.ones(length, length, dtype=torch.bool).tril(-(step - 1))
        scores[0] = scores[0].masked_fill(~visible, float("-inf"))
        shifted_values = []
        for t in range(2, step + 1):
            shift = step - t
            keys, values = (torch.roll(x, shift, dims=2) for x in history[t - 1])
            score = (query * keys).sum(-1, keepdim=True) * scale  # [b, h, q, 1]
            score[:, :, :shift] = float("-inf")
            scores.append(score)
            shifted_values.append(values)
        weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1).nan_to_num(0.0)
        out = weights[..., :length] @ first_values
        for index, values in enumerate(shifted_values):
            out = out + weights[..., length + index : length + index + 1] * values
        return out

    return attend
