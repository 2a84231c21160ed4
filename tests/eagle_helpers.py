"""Tiny EAGLE-3 heads for tests: made for a tiny target, briefly trained so that some drafts are
accepted and some rejected, saved in the public layout."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from specbatch.engine.eagle import EagleHead, head_config, save_head
from specbatch.models.train_eagle import chain_losses, target_outputs


def make_head(target_dir: Path, directory: Path, aux_layers: tuple[int, int, int], draft_vocab: int | None = None,
              train_steps: int = 150, seed: int = 0) -> Path:
    """A head for the target in `target_dir` over its first `draft_vocab` tokens but shifted (draft id i
    stands for target id i + offset past the special tokens, so `d2t` is not the identity)."""
    torch.manual_seed(seed)
    target = LlamaForCausalLM.from_pretrained(target_dir).eval().requires_grad_(False)
    vocab = target.config.vocab_size
    draft_vocab = draft_vocab or vocab
    config = head_config(target, draft_vocab, aux_layers)
    head = EagleHead(config, target.config.hidden_size)
    offset = vocab - draft_vocab
    head.d2t.fill_(offset)
    head.t2d.zero_()
    head.t2d[offset:] = True
    head.embed_tokens = target.get_input_embeddings()
    head.lm_head.weight.data.copy_(target.get_output_embeddings().weight.data[offset:])
    optimizer = torch.optim.Adam([p for n, p in head.named_parameters() if not n.startswith("embed_tokens.")],
                                 lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(offset, vocab, (train_steps * 8, 4), generator=generator)
    # the target's own continuations, what it verifies: one batched call (a call per step of 8 spent
    # 40 s of a 2-core test run in generate's per-token loop)
    every_window = target.generate(prompts, max_new_tokens=29, do_sample=False, eos_token_id=None, pad_token_id=0)
    for windows in every_window.split(8):
        features, logits = target_outputs(target, aux_layers, windows)
        losses, _ = chain_losses(head, features, windows, logits, 2)
        optimizer.zero_grad()
        sum(losses).backward()
        optimizer.step()
    save_head(head.eval(), directory, target)
    return directory
