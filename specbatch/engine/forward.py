"""A Hugging Face causal LM over its paged cache: one flat ragged forward pass per call.

Row r feeds `chunks[r]` at positions starts[r].. through its block table; every row's tokens go to
the model as one flat batch `[1, Σ len(chunk)]` with per-token positions, so no row is padded to
another's length and the matrix multiplies see only real tokens. Positions are explicit per token,
so learned and rotary position embeddings both stay exact. Logits are computed only where the
round reads them (`logits_to_keep` with the flat indices).
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from specbatch.core import PassShape
from specbatch.engine import paged_kernel
from specbatch.engine.native_llama import NativeLlama
from specbatch.engine.paged_cache import PagedKVCache, bound_pass, build_layout


@dataclass(frozen=True)
class RowCache:
    """Where one row's KV lives: its block table in the paged caches (target and draft model) and
    its lane, the row's index in caches kept per row (an EAGLE head's)."""

    table: list[int]
    lane: int


class PagedModel:
    """A model and the paged cache it writes."""

    def __init__(self, model: torch.nn.Module, cache: PagedKVCache, step: Any = None,
                 native: NativeLlama | None = None) -> None:
        self.model, self.cache = model, cache
        self.step = model if step is None else step
        self.native = native  # the Llama family's own step, where it covers the model (`engine/native_llama.py`)
        # whether every pass's attention runs in the kernel (the native step's, whose heads it takes), so
        # layouts skip what only gathering reads
        self.kernel_attends = native is not None and paged_kernel.supports(
            torch.empty(0, 1, native.head_dim, dtype=native.final_norm.dtype, device=cache.keys[0].device),
            cache.keys[0], cache.values[0])
        self.cache_argument = cache_argument(model)
        # layers whose inputs an EAGLE drafter reads: each pass then keeps them side by side in
        # `features` [tokens, len(feature_layers)·hidden] (flat, in the pass's row order) until the next pass
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.cache.keys[0].device

    @property
    def max_len(self) -> int:
        """Positions the pool holds: the most one row could use."""
        return self.cache.num_blocks * self.cache.block_size

    def scratch_tables(self, num_rows: int, num_positions: int) -> list[list[int]]:
        """Tables for timing or warm-up passes before any row's KV exists: row after row through the
        pool's blocks, wrapping around (what they write is overwritten before it is read)."""
        per_row = -(-num_positions // self.cache.block_size)
        return [[(row * per_row + index) % self.cache.num_blocks for index in range(per_row)]
                for row in range(num_rows)]

    @torch.no_grad()
    def forward(self, tables: list[list[int]], starts: list[int], chunks: list[list[int]],
                keep_logits: bool = True, last_only: bool = False, keep: list[int] | None = None
                ) -> tuple[torch.Tensor | None, PassShape]:
        """Run the model; returns logits [Σ len(chunk), vocab], each row's positions after the
        previous row's (None if keep_logits is False); with `last_only` [len(tables), vocab] at each
        row's last chunk position; with `keep` [len(keep), vocab] at those flat positions."""
        lengths = [len(chunk) for chunk in chunks]
        device = self.device
        layout = build_layout(tables, starts, lengths, self.cache.block_size, device,
                              gathers=not self.kernel_attends)
        num_tokens = layout.num_tokens
        shape = PassShape.flat(starts, lengths)
        kept: Any = 0  # every position
        picked: list[int] | None = None  # the positions whose logits are kept, where not all
        if not keep_logits:
            kept = 1
        elif last_only:
            picked = list(itertools.accumulate(lengths, initial=-1))[1:]  # each row's last token
        elif keep is not None and len(keep) < num_tokens:
            picked = keep
        # tokens, positions and kept positions in one copy from the host, not three (`paged_cache._kernel_layout`)
        inputs = torch.tensor([*(token for chunk in chunks for token in chunk),
                               *(start + i for start, length in zip(starts, lengths, strict=True)
                                 for i in range(length)), *(picked or ())], dtype=torch.long, device=device)
        input_ids, positions = inputs[:num_tokens], inputs[num_tokens : 2 * num_tokens]
        if picked is not None:
            kept = inputs[2 * num_tokens :]
        if self.native is not None:
            logits, states = self.native.forward(input_ids, positions, shape.kv_len, self.cache, layout,
                                                 kept if isinstance(kept, torch.Tensor) else None, keep_logits,
                                                 self.feature_layers)
            if self.feature_layers:
                self.features = torch.cat(states, dim=-1)
            return logits, shape
        self.cache.bind(layout, shape.kv_len)
        with bound_pass(layout):
            output = self.step(
                input_ids=input_ids[None], position_ids=positions[None], **{self.cache_argument: self.cache},
                use_cache=True, logits_to_keep=kept, output_hidden_states=bool(self.feature_layers))
        if self.feature_layers:
            self.features = torch.cat([output.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        if not keep_logits:
            return None, shape
        return output.logits[0], shape  # [kept tokens, vocab]


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` in newer transformers 5.x,
    `past_key_values` before (5.17 and older; the H200 image's). A model given the cache under the
    other name silently runs without it, so this is read off the signature, not assumed."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
