"""The training recipe of the bundled EAGLE-3 head: `specbatch models train-eagle`.

The target is frozen; the head learns the target's next-token distribution (soft cross-entropy to
the target's own logits) from the target's hidden states on corpus windows of code and prose. It is
trained as it drafts ("training-time test", EAGLE-3): step 1 reads the target's fused features,
step s reads the head's own step s − 1 output at the previous position and attends to the keys of
earlier steps where a chain would have them, so later draft positions are trained on the inputs
they see at inference. Checkpoints every `checkpoint_every` steps make a run resumable: rerunning
the command continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from specbatch.engine.eagle import EagleHead, head_config, save_head
from specbatch.models.checkpoint import load_training_state, save_training_state
from specbatch.models.corpus import documents
from specbatch.models.train_demo import token_stream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagleRecipe:
    steps: int = 1500
    batch_size: int = 8
    seq_len: int = 256
    ttt_steps: int = 3  # chain positions trained as drafted
    step_decay: float = 0.8  # loss weight of chain step s: decay^(s − 1)
    peak_lr: float = 2e-3
    prose_share: float = 0.4
    aux_layers: tuple[int, int, int] = (1, 3, 5)
    checkpoint_every: int = 50
    seed: int = 0


def target_outputs(target: PreTrainedModel, layers: tuple[int, ...], windows: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused-to-be features [batch, len, 3·hidden] (inputs of `layers`) and logits [batch, len, vocab]."""
    with torch.no_grad():
        out = target(input_ids=windows, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits


def chain_losses(head: EagleHead, features: torch.Tensor, windows: torch.Tensor, target_logits: torch.Tensor,
                 num_steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Soft cross-entropy and argmax agreement per chain step over windows [batch, T + 1].

    Position p reads token p + 1 and predicts token p + 2, whose target law is target_logits[:, p + 1].
    Step s at p reads the step s − 1 output at p − 1 and attends to step-1 keys at positions
    ≤ p − s + 1 and to the step-t key at p − (s − t) for t = 2..s, as a chain of s drafts would."""
    tokens, labels = windows[:, 1:], torch.softmax(target_logits[:, 1:].float(), dim=-1)
    length = tokens.shape[1]
    positions = torch.arange(length).expand(tokens.shape[0], -1)
    hidden = head.fuse(features[:, :-1])
    draft_ids = torch.arange(head.draft_vocab_size) + head.d2t  # target id of each draft id
    history: list[tuple[torch.Tensor, torch.Tensor]] = []
    losses, agreement = [], []
    for step in range(1, num_steps + 1):
        output = head(tokens, hidden, positions, _chain_attend(history, step, head))
        valid = slice(step - 1, length)  # earlier positions have no step-s input
        logits = head.draft_logits(output[:, valid]).float()
        draft_labels = labels[:, valid][..., draft_ids]  # the target's mass on the draft vocabulary
        losses.append(-(draft_labels * torch.log_softmax(logits, dim=-1)).sum(-1).mean())
        agreement.append(float((draft_ids[logits.argmax(-1)] == labels[:, valid].argmax(-1)).float().mean()))
        hidden = torch.cat([torch.zeros_like(output[:, :1]), output[:, :-1]], dim=1)  # step s + 1 reads p − 1
    return losses, agreement


def _chain_attend(history: list[tuple[torch.Tensor, torch.Tensor]], step: int, head: EagleHead):
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


def new_head(target: PreTrainedModel, recipe: EagleRecipe) -> EagleHead:
    """A head for `target`, its output layer and norm started from the target's (it predicts the same
    tokens), its embedding the target's and frozen."""
    config = head_config(target, target.config.vocab_size, recipe.aux_layers)
    head = EagleHead(config, target.config.hidden_size)
    head.lm_head.weight.data.copy_(target.get_output_embeddings().weight.data)
    head.norm.weight.data.copy_(target.model.norm.weight.data)
    head.embed_tokens = target.get_input_embeddings()
    return head


def train_eagle(target_dir: Path, output_dir: Path, checkpoint_dir: Path, recipe: EagleRecipe = EagleRecipe()
                ) -> dict:
    """Train (or resume) the head for the target in `target_dir`, save it in the public layout."""
    torch.manual_seed(recipe.seed)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir).eval().requires_grad_(False)
    head = new_head(target, recipe)
    trainable = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens.")]
    optimizer = torch.optim.AdamW(trainable, lr=recipe.peak_lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, recipe.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (
        0.05 + 0.475 * (1 + math.cos(math.pi * min(step, recipe.steps) / recipe.steps))))
    streams = [(token_stream(documents("code", "train"), tokenizer), 1 - recipe.prose_share),
               (token_stream(documents("prose", "train"), tokenizer), recipe.prose_share)]
    rng, start_step, elapsed = random.Random(recipe.seed), 0, 0.0
    checkpoint = checkpoint_dir / "eagle-checkpoint.pt"
    if (resumed := load_training_state(checkpoint, optimizer, schedule, rng)) is not None:
        weights, start_step, elapsed = resumed
        head.load_state_dict(weights, strict=False)  # the target's embedding is not in it
        log.info("resumed at step %d", start_step)
    head.train()
    started = time.perf_counter() - elapsed
    for step in range(start_step, recipe.steps):
        windows = torch.stack([_window(rng, streams, recipe.seq_len) for _ in range(recipe.batch_size)])
        features, logits = target_outputs(target, recipe.aux_layers, windows)
        losses, agreement = chain_losses(head, features, windows, logits, recipe.ttt_steps)
        loss = torch.stack([recipe.step_decay ** s * step_loss for s, step_loss in enumerate(losses)]).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        if step % 10 == 0:
            log.info("step %d/%d loss %s agree %s (%.0f s)", step, recipe.steps,
                     [round(float(x), 3) for x in losses], [round(a, 3) for a in agreement],
                     time.perf_counter() - started)
        if (step + 1) % recipe.checkpoint_every == 0 or step + 1 == recipe.steps:
            weights = {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}
            save_training_state(checkpoint, weights, optimizer, schedule, rng, step + 1, time.perf_counter() - started)
    head.eval()
    save_head(head, output_dir, target)
    card = {"recipe": asdict(recipe), "training_s": round(time.perf_counter() - started),
            "heldout": evaluate(head, target, tokenizer, recipe)}
    (output_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def _window(rng: random.Random, streams: list[tuple[torch.Tensor, float]], seq_len: int) -> torch.Tensor:
    stream = rng.choices(streams, weights=[w for _, w in streams])[0][0]
    start = rng.randrange(0, len(stream) - seq_len - 2)
    return stream[start : start + seq_len + 1]


@torch.no_grad()
def evaluate(head: EagleHead, target: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, recipe: EagleRecipe,
             num_docs: int = 48, prompt_tokens: int = 48, new_tokens: int = 64) -> dict:
    """Greedy agreement with the target per chain step along the target's own greedy continuation of
    held-out prompts (step 1 is the per-token acceptance of the first draft)."""
    result = {}
    for domain in ("code", "prose"):
        docs = random.Random(recipe.seed).sample(documents(domain, "heldout"), num_docs)
        agree = [0.0] * recipe.ttt_steps
        count = 0
        for doc in docs:
            prompt = tokenizer(doc.text)["input_ids"][:prompt_tokens]
            sequence = target.generate(  # type: ignore[operator]  # transformers types generate looselytorch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                       pad_token_id=tokenizer.pad_token_id)
            features, logits = target_outputs(target, recipe.aux_layers, sequence)
            span = slice(len(prompt) - 2, sequence.shape[1] - 2)  # predictions of generated tokens
            _, steps = _span_agreement(head, features, sequence, logits, recipe.ttt_steps, span)
            count += 1
            agree = [a + s for a, s in zip(agree, steps, strict=True)]
        result[domain] = {f"step{s + 1}": round(a / count, 3) for s, a in enumerate(agree)}
    return result


def _span_agreement(head: EagleHead, features: torch.Tensor, sequence: torch.Tensor, logits: torch.Tensor,
                    num_steps: int, span: slice) -> tuple[None, list[float]]:
    """Per chain step, argmax agreement over `span` of head positions."""
    tokens = sequence[:, 1:]
    positions = torch.arange(tokens.shape[1]).expand(1, -1)
    hidden = head.fuse(features[:, :-1])
    history: list[tuple[torch.Tensor, torch.Tensor]] = []
    agreement = []
    for step in range(1, num_steps + 1):
        output = head(tokens, hidden, positions, _chain_attend(history, step, head))
        predicted = head.to_target_vocab(head.draft_logits(output)).argmax(-1)
        wanted = logits[:, 1:].argmax(-1)
        agreement.append(float((predicted[:, span] == wanted[:, span]).float().mean()))
        hidden = torch.cat([torch.zeros_like(output[:, :1]), output[:, :-1]], dim=1)
    return None, agreement
