"""The distilled draft: `specbatch models distill-draft` (DistillSpec-style, resumable), and the
last stage of the bundled pair's recipe (`train-demo`).

The bundled draft learnt next tokens from text; a draft is accepted when it predicts what the
*target* would emit, so this recipe trains it on the target's own next-token distributions
(forward KL, every position of every window), over training text (code and prose) and over the
target's own greedy continuations of training prompts (the text a draft meets while serving).
Checkpoints every `checkpoint_every` steps; a run with the same checkpoint directory resumes.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specbatch.models.checkpoint import load_plain, load_training_state, save_training_state
from specbatch.models.corpus import documents
from specbatch.models.train_demo import (
    ModelShape,
    Recipe,
    build_model,
    greedy_acceptance,
    heldout_loss,
    token_stream,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillRecipe:
    draft: ModelShape = ModelShape(256, 1, 4, 768)  # chosen by α per draft cost (README of the demo pair)
    steps: int = 1200
    batch_size: int = 16
    seq_len: int = 256
    prose_share: float = 0.4
    continuation_share: float = 0.3  # windows taken from the target's own greedy continuations
    num_continuations: int = 256
    continuation_prompt: int = 64
    continuation_tokens: int = 192
    peak_lr: float = 3e-3
    checkpoint_every: int = 50
    seed: int = 0


@torch.no_grad()
def target_continuations(target: LlamaForCausalLM, stream: torch.Tensor, recipe: DistillRecipe,
                         rng: random.Random) -> torch.Tensor:
    """The target's greedy continuations of prompts cut from `stream`, prompt included [n, prompt + tokens]."""
    rows = []
    for _ in range(0, recipe.num_continuations, 32):
        starts = [rng.randrange(0, len(stream) - recipe.continuation_prompt) for _ in range(32)]
        prompts = torch.stack([stream[s : s + recipe.continuation_prompt] for s in starts])
        out = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                              max_new_tokens=recipe.continuation_tokens, min_new_tokens=recipe.continuation_tokens,
                              pad_token_id=0)
        rows.append(out)
    return torch.cat(rows)[: recipe.num_continuations]


def distill(target_dir: Path, output_dir: Path, checkpoint_dir: Path, recipe: DistillRecipe = DistillRecipe(),
            init_dir: Path | None = None) -> dict:
    """Train (or resume) a draft of `recipe.draft`'s shape on the target's distributions; save it
    with the target's tokenizer; returns its card (recipe, time, held-out greedy acceptance)."""
    torch.manual_seed(recipe.seed)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir).eval().requires_grad_(False)
    base = Recipe(vocab_size=target.config.vocab_size, seq_len=recipe.seq_len)
    draft = build_model(recipe.draft, base, tokenizer)
    if init_dir is not None:
        draft.load_state_dict(LlamaForCausalLM.from_pretrained(init_dir).state_dict())
    rng = random.Random(recipe.seed)
    code, prose = (token_stream(documents(domain, "train"), tokenizer) for domain in ("code", "prose"))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    continuations_path = checkpoint_dir / "continuations.pt"
    if continuations_path.exists():
        continuations = load_plain(continuations_path)  # a tensor: no code runs on load
    else:
        half = replace(recipe, num_continuations=recipe.num_continuations // 2)
        continuations = torch.cat([target_continuations(target, stream, half, rng) for stream in (code, prose)])
        torch.save(continuations, continuations_path)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=recipe.peak_lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, recipe.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (
        0.05 + 0.475 * (1 + math.cos(math.pi * min(step, recipe.steps) / recipe.steps))))
    checkpoint, start_step, elapsed = checkpoint_dir / "distill-checkpoint.pt", 0, 0.0
    if (resumed := load_training_state(checkpoint, optimizer, schedule, rng)) is not None:
        weights, start_step, elapsed = resumed
        draft.load_state_dict(weights)
        log.info("resumed at step %d", start_step)
    draft.train()
    started = time.perf_counter() - elapsed
    for step in range(start_step, recipe.steps):
        windows = torch.stack([_window(rng, code, prose, continuations, recipe) for _ in range(recipe.batch_size)])
        with torch.no_grad():
            teacher = torch.log_softmax(target(input_ids=windows, use_cache=False).logits.float(), dim=-1)
        student = torch.log_softmax(draft(input_ids=windows, use_cache=False).logits.float(), dim=-1)
        loss = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="none").sum(-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0:
            agree = float((student.argmax(-1) == teacher.argmax(-1)).float().mean())
            log.info("step %d/%d kl %.3f agree %.3f (%.0f s)", step, recipe.steps, loss.item(), agree,
                     time.perf_counter() - started)
        if (step + 1) % recipe.checkpoint_every == 0 or step + 1 == recipe.steps:
            save_training_state(checkpoint, draft.state_dict(), optimizer, schedule, rng, step + 1,
                                time.perf_counter() - started)
    draft.eval()
    draft.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    greedy = {}
    for domain in ("code", "prose"):
        docs = random.Random(0).sample(documents(domain, "heldout"), 48)
        greedy[domain] = {k: round(v, 3) for k, v in greedy_acceptance(target, draft, tokenizer, docs).items()}
    card = {"recipe": asdict(recipe), "init": str(init_dir) if init_dir else None,
            "parameters": sum(p.numel() for p in draft.parameters()),
            "training_s": round(time.perf_counter() - started), "greedy": greedy}
    return card


def distill_bundled(pair_dir: Path, checkpoint_dir: Path, recipe: DistillRecipe = DistillRecipe()) -> dict:
    """The pair's last stage: distill the draft in place from `pair_dir/target` (from the one in
    `pair_dir/draft` if the recipe pre-trained it on text, else from a fresh one of its shape), and
    record the distillation, held-out loss and greedy acceptance in the pair's card.json."""
    card_path = pair_dir / "card.json"
    card = json.loads(card_path.read_text())
    draft_dir = pair_dir / "draft"
    config = json.loads((draft_dir / "config.json").read_text())
    shape = ModelShape(config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                       config["intermediate_size"])
    pretrained = card["recipe"]["draft_steps"] > 0  # else the distillation starts from a fresh draft
    distilled = distill(pair_dir / "target", draft_dir, checkpoint_dir, replace(recipe, draft=shape),
                        draft_dir if pretrained else None)
    draft = LlamaForCausalLM.from_pretrained(draft_dir).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(draft_dir)
    card["recipe"]["draft_distillation"] = distilled["recipe"]
    card["training_s"]["draft_distillation"] = distilled["training_s"]
    card["greedy"] = distilled["greedy"]
    for domain in ("code", "prose"):
        stream = token_stream(documents(domain, "heldout"), tokenizer)
        card["heldout_loss"][domain]["draft"] = round(heldout_loss(draft, stream, recipe.seq_len), 3)
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return card


def _window(rng: random.Random, code: torch.Tensor, prose: torch.Tensor, continuations: torch.Tensor,
            recipe: DistillRecipe) -> torch.Tensor:
    """One training window: the target's own continuation (padded by text), else code or prose."""
    if rng.random() < recipe.continuation_share:
        row = continuations[rng.randrange(len(continuations))]
        start = rng.randrange(0, max(1, len(row) - recipe.seq_len + 1))
        piece = row[start : start + recipe.seq_len]
        if len(piece) == recipe.seq_len:
            return piece
        return torch.cat([piece, _text(rng, code, recipe.seq_len - len(piece))])
    return _text(rng, prose if rng.random() < recipe.prose_share else code, recipe.seq_len)


def _text(rng: random.Random, stream: torch.Tensor, length: int) -> torch.Tensor:
    start = rng.randrange(0, len(stream) - length - 1)
    return stream[start : start + length]
