"""The instruct recipe's data source for `train_eagle`: the target's recorded answers to chat
requests over the corpus's train split, and to held-out ones for the agreement in the log.

The head drafts over a reduced vocabulary, the target's most frequent answer tokens (EAGLE-3's
d2t), so that its output layer stays cheap beside the target. SmolLM2-135M on one core: a head step
costs 3.0 / 3.9 / 4.8 / 5.8 / 13.1 ms over 4k / 8k / 12k / 16k / all 49k tokens, a one-position
target pass ~58-64 ms (~80 ms for five). The 4k / 8k / 12k / 16k most frequent tokens of corpus
text hold 94.6 / 97.5 / 99.3 / 99.5% of the target's answer tokens, a bound on acceptance. With
acceptance a·coverage per drafted token (a = 0.6: 25.2 / 25.1 / 24.8 / 24.2 / 20.9 tokens/s at the
best chain length, against 17.2 for plain decoding), 4k and 8k tie and 16k or more cost more than
they gain; 8k (`InstructData.draft_vocab_size`) keeps the coverage margin for other prompts.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbatch.engine.eagle import EagleHead, target_fingerprint
from specbatch.models.eagle_chain import record_losses
from specbatch.models.eagle_records import Generation, cached_records, coverage, draft_vocabulary, record_batch
from specbatch.models.instruct_data import InstructDomain, instruct_prompts

if TYPE_CHECKING:
    from specbatch.models.train_eagle import EagleRecipe

log = logging.getLogger(__name__)
DOMAINS: tuple[InstructDomain, ...] = ("code", "chat")


class InstructRecords:
    """Batches of recorded answers (train split) and held-out agreement per domain and chain step."""

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: EagleRecipe,
                 directory: Path) -> None:
        assert recipe.instruct is not None and recipe.aux_layers is not None
        data = recipe.instruct
        generation = Generation(recipe.aux_layers, data.max_new_tokens)
        _check_settings(directory, {**asdict(generation), "seed": recipe.seed, "target": target_fingerprint(target)})
        self.batch_size, self.num_steps, self.eval_every = recipe.batch_size, recipe.ttt_steps, data.eval_every
        half = data.num_heldout_prompts // 2
        self.heldout_records = {domain: cached_records(
            target, instruct_prompts(tokenizer, domain, "heldout", half, recipe.seed), generation,
            directory / f"heldout-{domain}") for domain in DOMAINS}
        code, chat = (instruct_prompts(tokenizer, domain, "train", data.num_prompts // 2, recipe.seed)
                      for domain in DOMAINS)
        prompts = [prompt for pair in zip(code, chat, strict=True) for prompt in pair]  # a longer run keeps the batches
        self.records = cached_records(target, prompts, generation, directory / "train")
        self.vocab_size = target.config.get_text_config().vocab_size
        self.draft_ids = draft_vocabulary(self.records, self.vocab_size, min(data.draft_vocab_size, self.vocab_size))
        log.info("%d answers (%d tokens) recorded; draft vocabulary %d covers %s of held-out answer tokens",
                 len(self.records), sum(len(r.token_ids) - r.num_prompt_tokens for r in self.records),
                 len(self.draft_ids), self.coverage())

    def losses(self, head: EagleHead, rng: random.Random) -> tuple[list[torch.Tensor], list[float]]:
        return record_losses(head, record_batch(rng.sample(self.records, self.batch_size)), self.num_steps)

    def heldout(self, head: EagleHead) -> dict:
        """Per domain: greedy agreement per chain step (step 1 is the first draft's acceptance)."""
        result: dict = {}
        for domain, records in self.heldout_records.items():
            _, agreement = record_losses(head, record_batch(records), self.num_steps)
            result[domain] = {f"step{s + 1}": round(a, 3) for s, a in enumerate(agreement)}
        result["coverage"] = self.coverage()
        return result

    def coverage(self) -> dict[str, float]:
        """Per domain, the share of held-out answer tokens the draft vocabulary holds."""
        return {domain: round(coverage(records, self.draft_ids, self.vocab_size), 4)
                for domain, records in self.heldout_records.items()}


def _check_settings(directory: Path, settings: dict) -> None:
    """Records made with other settings (or for another target) are refused, not mixed in."""
    path = directory / "settings.json"
    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    if path.exists() and json.loads(path.read_text()) != settings:
        raise ValueError(f"{directory} holds answers recorded with other settings ({path.read_text().strip()}); "
                         "use another checkpoint directory")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")

