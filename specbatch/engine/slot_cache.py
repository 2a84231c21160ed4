"""A preallocated per-slot KV cache: an EAGLE head's, one slot (lane) per running row.

The models' KV is paged (`paged_cache.py`); the EAGLE head keeps this small one-layer cache by
lane, since its KV at a position was fed the target's features there and is never shared. Each
row owns a row of the key/value tensor `[num_slots, num_kv_heads, max_len, head_dim]`; a pass writes
its new keys at per-row positions (`bind`). Rejected draft positions need no undo: the row's valid
length is a scalar the engine keeps, the mask hides everything past it, and the next pass
overwrites those positions.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class SlotCache(Cache):
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        value_head_dim: int | None = None,
    ) -> None:
        super().__init__(layers=[])
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        value_shape = (num_slots, num_kv_heads, max_len, value_head_dim or head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(value_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self.max_len = max_len
        self._slots: torch.Tensor | None = None  # [batch]
        self._slot_range: tuple[int, int] | None = None  # set when the bound slots are contiguous
        self._write_positions: torch.Tensor | None = None  # [batch, query_len]
        self._kv_len = 0

    @property
    def bytes_per_token(self) -> int:
        per_layer = sum(t[0, :, 0].numel() * t.element_size() for t in self.keys[:1] + self.values[:1])
        return per_layer * len(self.keys)

    def bind(self, slots: list[int], write_positions: torch.Tensor, kv_len: int) -> None:
        """Set where the next forward writes: row b's query j goes to position write_positions[b, j]
        of slot slots[b]; attention then reads positions [0, kv_len) of each bound slot."""
        if kv_len > self.max_len or int(write_positions.max()) >= self.max_len:
            raise ValueError(f"KV length {kv_len} exceeds the cache's {self.max_len} positions")
        device = self.keys[0].device
        self._slots = torch.tensor(slots, dtype=torch.long, device=device)
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        self._slot_range = (slots[0], slots[0] + len(slots)) if contiguous else None
        self._write_positions = write_positions.to(device)
        self._kv_len = kv_len

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states / value_states: [batch, num_kv_heads, query_len, head_dim]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        assert self._slots is not None, "bind() comes before a forward"
        rows, positions = self._slots[:, None], self._write_positions  # [batch, 1], [batch, query_len]
        # advanced indices around a slice put the broadcast [batch, query_len] dims first
        keys[rows, :, positions] = key_states.transpose(1, 2).to(keys.dtype)
        values[rows, :, positions] = value_states.transpose(1, 2).to(values.dtype)
        if self._slot_range is not None:
            start, end = self._slot_range
            return keys[start:end, :, : self._kv_len], values[start:end, :, : self._kv_len]
        return keys[self._slots, :, : self._kv_len], values[self._slots, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self._kv_len, 0


def causal_slot_mask(
    num_computed: torch.Tensor, query_len: int, kv_len: int, dtype: torch.dtype | None
) -> torch.Tensor:
    """Mask letting row b's query j see positions 0..num_computed[b] + j (itself included).

    num_computed: [batch]. Returns [batch, 1, query_len, kv_len]: bool (True = attend) when dtype
    is None (sdpa), else additive with the dtype's minimum for hidden positions (eager).
    """
    positions = torch.arange(kv_len, device=num_computed.device)  # [kv_len]
    last_visible = num_computed[:, None] + torch.arange(query_len, device=num_computed.device)  # [batch, q]
    visible = positions[None, None, :] <= last_visible[:, :, None]  # [batch, q, kv_len]
    visible = visible[:, None]
    if dtype is None:
        return visible
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)
