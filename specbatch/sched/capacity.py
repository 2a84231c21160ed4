"""KV capacity as bookkeeping: token slots reserved per request, never more than the capacity.

Reservations are in target-cache token positions; the draft cache mirrors the target's positions
(same slots), so its bytes are folded into `bytes_per_token` when a capacity is given in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys + values of one token position across every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


@dataclass
class KVBudget:
    capacity_tokens: int
    reserved: dict[str, int] = field(default_factory=dict)
    num_used: int = 0

    @property
    def num_free(self) -> int:
        return self.capacity_tokens - self.num_used

    def can_reserve(self, num_tokens: int) -> bool:
        return num_tokens <= self.num_free

    def reserve(self, request_id: str, num_tokens: int) -> None:
        """Set a request's reservation to num_tokens (grow or shrink); refuses to exceed capacity."""
        delta = num_tokens - self.reserved.get(request_id, 0)
        if delta > self.num_free:
            raise ValueError(f"reserving {num_tokens} KV tokens for {request_id} would exceed capacity")
        self.reserved[request_id] = num_tokens
        self.num_used += delta

    def free(self, request_id: str) -> None:
        self.num_used -= self.reserved.pop(request_id, 0)
