"""A Hugging Face causal LM over its slot cache: one ragged forward pass per call.

Row b feeds `chunks[b]` at positions starts[b]..; rows are right-padded to the pass's query length
and, where the model pads to shape buckets, the batch is padded with dummy rows (the scratch slot).
Positions are always explicit per row, so learned and rotary position embeddings both stay exact.
Decode-shaped passes (those that keep logits) run through `step`, the model or its captured graphs
(`engine/graphs.py`); prefill passes run the model eagerly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from specbatch.core import PassShape
from specbatch.engine.slot_cache import SlotCache, causal_slot_mask
from specbatch.sched.buckets import ShapeBuckets


class SlotModel:
    """A model, the slot cache it writes, and how its passes are shaped."""

    def __init__(self, model: torch.nn.Module, cache: SlotCache, buckets: ShapeBuckets,
                 mask_dtype: torch.dtype | None, pad_decode: bool, pad_prefill: bool,
                 step: Callable[..., Any] | None = None) -> None:
        self.model, self.cache, self.buckets, self.mask_dtype = model, cache, buckets, mask_dtype
        # which passes pad to shape buckets: the target's all (eager) or its decode passes (graphs);
        # the drafter's none (eager) or its draft steps (graphs)
        self.pad_decode, self.pad_prefill = pad_decode, pad_prefill
        self.step = model if step is None else step
        self.cache_argument = cache_argument(model)
        self.scratch_slot = cache.num_slots - 1  # padded batch rows write here, unless...
        self.is_free: Callable[[int], bool] = lambda slot: False  # ...the slots after the real rows are free
        # layers whose inputs an EAGLE drafter reads: each pass then keeps them side by side in
        # `features` [rows, query_len, len(feature_layers)·hidden] until the next pass
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None

    @torch.no_grad()
    def forward(self, slots: list[int], starts: list[int], chunks: list[list[int]],
                keep_logits: bool = True, last_only: bool = False) -> tuple[torch.Tensor | None, PassShape]:
        """Run the model; returns logits [len(slots), query_len, vocab] (None if keep_logits is False),
        or with `last_only` [len(slots), 1, vocab] at each row's last chunk position: a draft step
        that catches a cache up on ragged lags needs no more, and the output layer over every padded
        position cost more than the bundled draft's one decoder layer (`benchmarks/draft_catch_up.py`:
        1.3x at 64 rows 4 tokens behind, 1.4-1.7x where some rows lag by whole prompts)."""
        shape = self.buckets.pass_shape(len(slots), max(starts), max(len(chunk) for chunk in chunks),
                                        sum(len(c) for c in chunks), self.cache.max_len,
                                        pad=self.pad_decode if keep_logits else self.pad_prefill)
        query_len, num_bucket_rows, kv_len = shape.query_len, shape.num_bucket_rows, shape.kv_len
        device = self.cache.keys[0].device
        num_pad_rows = num_bucket_rows - len(slots)
        all_slots = slots + self._padding_slots(slots, num_pad_rows)
        row_starts = torch.tensor(starts + [0] * num_pad_rows, dtype=torch.long, device=device)  # [rows]
        # built on the host and copied once: a copy per row cost a transfer each on a GPU
        padded = [chunk + [0] * (query_len - len(chunk)) for chunk in chunks] + [[0] * query_len] * num_pad_rows
        input_ids = torch.tensor(padded, dtype=torch.long, device=device)
        positions = row_starts[:, None] + torch.arange(query_len, device=device)  # [rows, query_len]
        self.cache.bind(all_slots, positions, kv_len)
        mask = causal_slot_mask(row_starts, query_len, kv_len, self.mask_dtype)
        ends = [len(chunk) - 1 for chunk in chunks]
        # the positions whose logits are computed, for every row: in an eager pass only the rows' last
        # ones, where fewer than all; a captured graph keeps its one output shape, rows picked after
        kept = sorted(set(ends)) if keep_logits and last_only and self.step is self.model else None
        kept = kept if kept is not None and len(kept) < query_len else None
        output = (self.step if keep_logits else self.model)(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            **{self.cache_argument: self.cache},
            use_cache=True,
            logits_to_keep=(0 if kept is None else torch.tensor(kept, device=device)) if keep_logits else 1,
            output_hidden_states=bool(self.feature_layers),
        )
        if self.feature_layers:
            self.features = torch.cat([output.hidden_states[i][: len(slots)] for i in self.feature_layers], dim=-1)
        if not keep_logits:
            return None, shape
        logits = output.logits[: len(slots)]
        if not last_only:
            return logits, shape
        if len(set(ends)) == 1:  # every row's last position is one column: a view
            column = 0 if kept is not None else ends[0]
            return logits[:, column : column + 1], shape
        columns = ends if kept is None else [kept.index(end) for end in ends]
        return logits[torch.arange(len(slots), device=device), torch.tensor(columns, device=device)][:, None], shape

    def _padding_slots(self, slots: list[int], num_pad_rows: int) -> list[int]:
        """Slots for padded batch rows: the free slots right after contiguous real rows, so the cache
        still reads the batch as a view of one slot range; otherwise the scratch slot, repeated.
        Padded rows write garbage only there: a free slot is prefilled from 0 before it is read."""
        tail = list(range(slots[-1] + 1, slots[-1] + 1 + num_pad_rows))
        if tail and tail[-1] < self.scratch_slot and all(map(self.is_free, tail)):
            return tail
        return [self.scratch_slot] * num_pad_rows

    def warm_up(self, shapes: list[tuple[int, int]]) -> None:
        """Run one decode-shaped pass per (rows, query length), so its graph is captured before the
        first round. Only before any row's KV exists: it writes positions 0.. of slots 0..rows-1 and
        pads into the slots after them, as a round does (every slot holds nothing yet)."""
        is_free, self.is_free = self.is_free, lambda slot: True
        try:
            for num_rows, query_len in shapes:
                self.forward(list(range(num_rows)), [0] * num_rows, [[0] * query_len] * num_rows)
        finally:
            self.is_free = is_free


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` in newer transformers 5.x,
    `past_key_values` before (5.17 and older; the H200 image's). A model given the cache under the
    other name silently runs without it, so this is read off the signature, not assumed."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
