"""KV bytes per position: how a capacity given in bytes becomes positions. The capacity itself is
counted in blocks (`sched/kv_blocks.py`); the draft cache mirrors the target's blocks, so its bytes
are folded into a position's when a capacity is given in bytes.
"""

from __future__ import annotations


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys + values of one token position across every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
