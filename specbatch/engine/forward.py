"""One ragged forward pass of a Hugging Face causal LM over slot-cached rows.

Row b feeds `chunks[b]` at positions num_computed[b]..; rows are right-padded to the pass's query
length and the batch may be padded with dummy rows (the scratch slot) up to a shape bucket.
Positions are always explicit per row, so learned and rotary position embeddings both stay exact.
"""

from __future__ import annotations

import torch

from specbatch.core import PassShape
from specbatch.engine.slot_cache import SlotCache, causal_slot_mask
from specbatch.sched.buckets import ShapeBuckets


@torch.no_grad()
def forward_rows(
    model: torch.nn.Module,
    cache: SlotCache,
    slots: list[int],
    num_computed: list[int],
    chunks: list[list[int]],
    query_len: int,
    num_bucket_rows: int,
    buckets: ShapeBuckets,
    mask_dtype: torch.dtype | None,
    scratch_slot: int,
    keep_logits: bool = True,
) -> tuple[torch.Tensor | None, PassShape]:
    """Run the model; returns logits [num_rows, query_len, vocab] (None if keep_logits is False)."""
    device = cache.keys[0].device
    num_pad_rows = num_bucket_rows - len(slots)
    all_slots = slots + [scratch_slot] * num_pad_rows
    starts = torch.tensor(num_computed + [0] * num_pad_rows, dtype=torch.long, device=device)  # [rows]
    input_ids = torch.zeros((num_bucket_rows, query_len), dtype=torch.long, device=device)
    for row, chunk in enumerate(chunks):
        input_ids[row, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
    positions = starts[:, None] + torch.arange(query_len, device=device)  # [rows, query_len]
    kv_len = buckets.kv_len(int(positions.max()) + 1, cache.max_len)
    cache.bind(all_slots, positions, kv_len)
    mask = causal_slot_mask(starts, query_len, kv_len, mask_dtype)
    output = model(
        input_ids=input_ids,
        position_ids=positions,
        attention_mask=mask,
        cache=cache,
        use_cache=True,
        logits_to_keep=0 if keep_logits else 1,
    )
    shape = PassShape(len(slots), num_bucket_rows, query_len, kv_len, sum(len(c) for c in chunks))
    return (output.logits[: len(slots)] if keep_logits else None), shape
