"""The EAGLE-3 head's training recipe: `specbatch models train-eagle`.

The target is frozen; the head learns the target's next-token law from the target's hidden
states, trained as it drafts (`eagle_chain.py`). Two data sources: corpus windows of code and
prose with the target run at every step (the bundled pair, whose target is a base model), or the
target's own greedy answers to chat-templated requests, recorded once (`eagle_records.py`): what
the head of an instruct target meets while serving. Checkpoints every `checkpoint_every` steps
make a run resumable: rerunning the command continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, Protocol, cast

import torch
from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from specbatch.config import ModelsConfig
from specbatch.engine.eagle import EagleHead, aux_layer_ids, head_config, save_head
from specbatch.engine.loading import load_model, load_tokenizer
from specbatch.engine.model_paths import BUNDLED_DIR, resolve_dir
from specbatch.models.checkpoint import load_training_state, save_training_state
from specbatch.models.corpus import documents
from specbatch.models.eagle_chain import chain_losses, chain_outputs, target_outputs
from specbatch.models.eagle_instruct import InstructRecords
from specbatch.models.train_demo import token_stream

log = logging.getLogger(__name__)

DataKind = Literal["auto", "corpus", "instruct"]


@dataclass(frozen=True)
class InstructData:
    """The instruct recipe's data: `instruct_prompts` of the train split (half code, half chat) for
    training, of the held-out split for the agreement in the log and the card."""

    num_prompts: int = 448
    num_heldout_prompts: int = 32
    max_new_tokens: int = 160
    draft_vocab_size: int = 8192  # the most frequent answer tokens; sized by α per draft cost (eagle_instruct.py)
    eval_every: int = 40


@dataclass(frozen=True)
class EagleRecipe:
    steps: int = 1500
    batch_size: int = 8  # corpus windows, or recorded answers
    seq_len: int = 256  # corpus windows
    ttt_steps: int = 3  # chain positions trained as drafted
    step_decay: float = 0.8  # loss weight of chain step s: decay^(s − 1)
    peak_lr: float = 2e-3
    prose_share: float = 0.4
    aux_layers: tuple[int, ...] | None = (1, 3, 5)  # None: aux_layer_ids' (2, L/2, L − 3)
    checkpoint_every: int = 50
    seed: int = 0
    instruct: InstructData | None = None  # None: corpus windows


INSTRUCT_RECIPE = EagleRecipe(steps=480, peak_lr=1e-3, aux_layers=None, checkpoint_every=40,
                              instruct=InstructData())


class Source(Protocol):
    """Where a head's training batches and held-out numbers come from."""

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """[draft vocab] target ids the head drafts over, ascending; None: the whole vocabulary."""

    @property
    def eval_every(self) -> int:
        """Steps between held-out agreements in the log; 0: none."""

    def losses(self, head: EagleHead, rng: random.Random) -> tuple[list[torch.Tensor], list[float]]: ...

    def heldout(self, head: EagleHead) -> dict: ...


def recipe_for(target: str, data: DataKind, steps: int | None = None, draft_vocab_size: int | None = None,
               num_prompts: int | None = None) -> EagleRecipe:
    """The recipe for `target` with the command's overrides. `auto`: corpus windows for the bundled
    target (a base model; its chat template is a toy) or a target without a chat template, else
    the instruct recipe."""
    if data == "auto":
        bundled = resolve_dir(target).resolve() == (BUNDLED_DIR / "target").resolve()
        tokenizer = None if bundled else load_tokenizer(ModelsConfig(target=target, draft=None, eagle=None))
        data = "instruct" if getattr(tokenizer, "chat_template", None) else "corpus"
    recipe = INSTRUCT_RECIPE if data == "instruct" else EagleRecipe()
    recipe = replace(recipe, steps=steps or recipe.steps)
    if (instruct := recipe.instruct) is not None:
        instruct = replace(instruct, draft_vocab_size=draft_vocab_size or instruct.draft_vocab_size,
                           num_prompts=num_prompts or instruct.num_prompts)
    return replace(recipe, instruct=instruct)


def new_head(target: PreTrainedModel, aux_layers: tuple[int, ...], draft_ids: torch.Tensor | None) -> EagleHead:
    """A head for `target` over `draft_ids` (None: the whole vocabulary), its output layer and norm
    started from the target's (it predicts the same tokens), its embedding the target's and frozen."""
    text = target.config.get_text_config()
    draft_ids = torch.arange(text.vocab_size) if draft_ids is None else draft_ids
    head = EagleHead(head_config(target, len(draft_ids), aux_layers), text.hidden_size)
    head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
    head.t2d.zero_()
    head.t2d[draft_ids] = True
    head.lm_head.weight.data.copy_(target.get_output_embeddings().weight.data[draft_ids])
    head.norm.weight.data.copy_(target.model.norm.weight.data)
    head.embed_tokens = target.get_input_embeddings()
    return head


def train_eagle(target_name: str, output_dir: Path, checkpoint_dir: Path, recipe: EagleRecipe = EagleRecipe()
                ) -> dict:
    """Train (or resume) the head for `target_name` (a path or configured name), save it in the
    public layout with its card."""
    torch.manual_seed(recipe.seed)
    models = ModelsConfig(target=target_name, draft=None, eagle=None)
    tokenizer = load_tokenizer(models)
    target = load_model(target_name, models).requires_grad_(False)
    text = target.config.get_text_config()
    aux_layers = recipe.aux_layers or aux_layer_ids(cast(LlamaConfig, text), text.num_hidden_layers)
    recipe = replace(recipe, aux_layers=aux_layers)
    source: Source
    if recipe.instruct is None:
        source = CorpusWindows(target, tokenizer, recipe)
    else:
        source = InstructRecords(target, tokenizer, recipe, checkpoint_dir / "records")
    head = new_head(target, aux_layers, source.draft_ids)
    training_s = fit(head, source, checkpoint_dir / "eagle-checkpoint.pt", recipe)
    head.eval()
    save_head(head, output_dir, target)
    card = {"recipe": asdict(recipe), "training_s": round(training_s), "heldout": _heldout(head, source)}
    (output_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def fit(head: EagleHead, source: Source, checkpoint: Path, recipe: EagleRecipe) -> float:
    """Train `head` from the checkpoint on (or from scratch) to `recipe.steps`; returns training seconds."""
    trainable = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens.")]
    optimizer = torch.optim.AdamW(trainable, lr=recipe.peak_lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, recipe.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (
        0.05 + 0.475 * (1 + math.cos(math.pi * min(step, recipe.steps) / recipe.steps))))
    rng, start_step, elapsed = random.Random(recipe.seed), 0, 0.0
    if (resumed := load_training_state(checkpoint, optimizer, schedule, rng)) is not None:
        weights, start_step, elapsed = resumed
        head.load_state_dict(weights, strict=False)  # the target's embedding is not in it
        log.info("resumed at step %d", start_step)
    started = time.perf_counter() - elapsed
    for step in range(start_step, recipe.steps):
        if source.eval_every and step % source.eval_every == 0:
            log.info("step %d held-out agreement %s", step, _heldout(head, source))
        head.train()
        losses, agreement = source.losses(head, rng)
        loss = torch.stack([recipe.step_decay ** s * step_loss for s, step_loss in enumerate(losses)]).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        if step % 10 == 0:
            log.info("step %d/%d loss %s agree %s (%.0f s)", step, recipe.steps,
                     [round(x.item(), 3) for x in losses], [round(a, 3) for a in agreement],
                     time.perf_counter() - started)
        if (step + 1) % recipe.checkpoint_every == 0 or step + 1 == recipe.steps:
            weights = {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}
            save_training_state(checkpoint, weights, optimizer, schedule, rng, step + 1, time.perf_counter() - started)
    return time.perf_counter() - started


def _heldout(head: EagleHead, source: Source) -> dict:
    head.eval()
    with torch.no_grad():
        return source.heldout(head)


class CorpusWindows:
    """Windows of the corpus's train split (code and prose); the target runs on each batch."""

    draft_ids = None
    eval_every = 0

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: EagleRecipe) -> None:
        self.target, self.tokenizer, self.recipe = target, tokenizer, recipe
        self.aux_layers = recipe.aux_layers or ()
        fast = cast(PreTrainedTokenizerFast, tokenizer)
        self.streams = [(token_stream(documents("code", "train"), fast), 1 - recipe.prose_share),
                        (token_stream(documents("prose", "train"), fast), recipe.prose_share)]

    def losses(self, head: EagleHead, rng: random.Random) -> tuple[list[torch.Tensor], list[float]]:
        windows = torch.stack([self._window(rng) for _ in range(self.recipe.batch_size)])
        features, logits = target_outputs(self.target, self.aux_layers, windows)
        return chain_losses(head, features, windows, logits, self.recipe.ttt_steps)

    def heldout(self, head: EagleHead) -> dict:
        return evaluate(head, self.target, self.tokenizer, self.recipe)

    def _window(self, rng: random.Random) -> torch.Tensor:
        stream = rng.choices(self.streams, weights=[w for _, w in self.streams])[0][0]
        start = rng.randrange(0, len(stream) - self.recipe.seq_len - 2)
        return stream[start : start + self.recipe.seq_len + 1]


@torch.no_grad()
def evaluate(head: EagleHead, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: EagleRecipe,
             num_docs: int = 48, prompt_tokens: int = 48, new_tokens: int = 64) -> dict:
    """Greedy agreement with the target per chain step along the target's own greedy continuation of
    held-out prompts (step 1 is the per-token acceptance of the first draft)."""
    result = {}
    for domain in ("code", "prose"):
        docs = random.Random(recipe.seed).sample(documents(domain, "heldout"), num_docs)
        agree = [0.0] * recipe.ttt_steps
        for doc in docs:
            prompt = tokenizer(doc.text)["input_ids"][:prompt_tokens]
            sequence = target.generate(  # type: ignore[operator]  # transformers types generate loosely
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id)
            features, logits = target_outputs(target, recipe.aux_layers or (), sequence)
            span = slice(len(prompt) - 2, sequence.shape[1] - 2)  # predictions of generated tokens
            steps = _span_agreement(head, features, sequence, logits, recipe.ttt_steps, span)
            agree = [a + s for a, s in zip(agree, steps, strict=True)]
        result[domain] = {f"step{s + 1}": round(a / len(docs), 3) for s, a in enumerate(agree)}
    return result


def _span_agreement(head: EagleHead, features: torch.Tensor, sequence: torch.Tensor, logits: torch.Tensor,
                    num_steps: int, span: slice) -> list[float]:
    """Per chain step, argmax agreement over `span` of head positions."""
    wanted = logits[:, 1:].argmax(-1)
    agreement = []
    for output in chain_outputs(head, features[:, :-1], sequence[:, 1:], num_steps):
        predicted = head.to_target_vocab(head.draft_logits(output)).argmax(-1)
        agreement.append(float((predicted[:, span] == wanted[:, span]).float().mean()))
    return agreement
