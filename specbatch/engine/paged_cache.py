"""KV held in fixed-size blocks that rows point at through block tables, and the attention that
reads it for one flat ragged pass.

Storage is one tensor per layer for keys and one for values, `[kv_heads, num_blocks * block_size,
head_dim]`: position p of a row lives at `table[p // block_size] * block_size + p % block_size`. A
shared prefix is the same blocks in several tables (the allocator, `sched/kv_blocks.py`, decides
which); nothing here copies KV. A pass feeds every row's new tokens as one flat batch `[1, tokens]`
with per-token positions (`PassLayout`): the model's layers write their new keys through
`slot_mapping` (`PagedKVCache.update`) and attend through `paged_attention`, which the models
reach through transformers' `AttentionInterface`, so every family whose attention goes through that
interface runs paged with its own projections, norms and rotary code.

On a CPU every row's attention is one call of the kernel that reads the blocks in place
(`engine/paged_kernel.py`), decoding rows, verify windows and prefill chunks alike. Elsewhere (a GPU,
soft-capped scores, head sizes the kernel does not take, no C compiler) attention groups rows by query
length so that a verify window of 5 positions is never padded to a prefill chunk's 512: each group
gathers its rows' KV once per layer `[rows, kv_len, heads, dim]` and runs one SDPA call with the
group's causal mask (built once per pass, shared by every layer).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from specbatch.engine import paged_kernel

ATTENTION_NAME = "specbatch_paged"
_PASS: contextvars.ContextVar[PassLayout | None] = contextvars.ContextVar("specbatch_pass", default=None)


@dataclass
class AttentionGroup:
    """Rows attended together: each padded to the group's longest query and block count."""

    num_rows: int
    query_len: int
    token_index: torch.Tensor | None  # [rows, query_len] into the pass's tokens; None: tokens are [rows, query_len]
    kv_blocks: torch.Tensor  # [rows · blocks per row] the blocks each row reads, in order (padding reads block 0)
    num_row_blocks: int  # blocks per row, the longest row's
    visible: torch.Tensor | None  # [rows, query_len, blocks · block_size] bool, True = attend; None: all
    keep: torch.Tensor | None  # [real tokens] indices into the flattened [rows * query_len] output
    tokens: torch.Tensor | None  # [real tokens] their indices in the pass
    rows: torch.Tensor  # [3, rows] each row's first token in the pass, token count, first position (kernel)
    _masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask(self, group_size: int) -> torch.Tensor | None:
        """The mask with each KV head's `group_size` query heads folded into its query rows:
        [rows, 1, group_size · query_len, kv_len] (query head g of a KV head at rows g·query_len..)."""
        if self.visible is None:
            return None
        if group_size not in self._masks:
            self._masks[group_size] = self.visible[:, None].repeat(1, 1, group_size, 1)
        return self._masks[group_size]


@dataclass
class PassLayout:
    """Where one flat pass's tokens go and what each row attends to, built once per pass on the host."""

    num_tokens: int
    slot_mapping: torch.Tensor  # [tokens] physical position (block · block_size + offset) of each new token's KV
    block_size: int
    groups: list[AttentionGroup]
    _kernel_inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def kernel_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables [rows, blocks] and rows [3, rows] of every group, for one kernel call over
        all of them: built at the pass's first layer, reused by the others."""
        if self._kernel_inputs is None:
            width = max(group.num_row_blocks for group in self.groups)
            tables = [F.pad(group.kv_blocks.view(group.num_rows, group.num_row_blocks),
                            (0, width - group.num_row_blocks)) for group in self.groups]
            self._kernel_inputs = (torch.cat(tables), torch.cat([group.rows for group in self.groups], dim=1))
        return self._kernel_inputs


def build_layout(tables: list[list[int]], starts: list[int], lengths: list[int], block_size: int,
                 device: torch.device, gathers: bool = True) -> PassLayout:
    """The layout of a pass where row r feeds `lengths[r]` tokens at positions starts[r].. and reads
    positions [0, starts[r] + lengths[r]) through block table `tables[r]`. Without `gathers` (the
    caller knows the kernel attends) it holds only what the kernel reads, copied to one tensor at once
    (`_kernel_layout`): no groups, masks or token indices."""
    slots: list[int] = []
    for table, start, length in zip(tables, starts, lengths, strict=True):
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + length))
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    if not gathers:
        return _kernel_layout(tables, starts, lengths, offsets, slots, block_size, device)
    groups = [_group(members, tables, starts, lengths, offsets, block_size, device)
              for members in _group_rows(lengths)]
    return PassLayout(offsets[-1], torch.tensor(slots, dtype=torch.long, device=device), block_size, groups)


def _kernel_layout(tables: list[list[int]], starts: list[int], lengths: list[int], offsets: list[int],
                   slots: list[int], block_size: int, device: torch.device) -> PassLayout:
    """A layout for the kernel alone: slot mapping, block tables [rows, blocks] (each row's blocks, padded
    with block 0 to the longest row's) and rows [3, rows], views of one tensor made by one copy from the
    host, where building groups and then `kernel_inputs` from them took four copies, a padding and two
    concatenations. With the pass's inputs made alike (`PagedModel.forward`) and the C loop's pointer
    table kept (`LayerLoop`), a 1-row pass of the bundled draft model went from 287 to 246 µs, its
    target's from ~700 to ~580 (medians of 300 passes)."""
    padded, width = _padded_blocks(tables, starts, lengths, range(len(tables)), block_size)
    buffer = torch.tensor([*slots, *padded, *offsets[:-1], *lengths, *starts], dtype=torch.long, device=device)
    num_tokens, num_rows = len(slots), len(tables)
    block_tables = buffer[num_tokens : num_tokens + num_rows * width].view(num_rows, width)
    rows = buffer[num_tokens + num_rows * width :].view(3, num_rows)
    return PassLayout(num_tokens, buffer[:num_tokens], block_size, [], (block_tables, rows))


def _padded_blocks(tables: list[list[int]], starts: list[int], lengths: list[int], members: Iterable[int],
                   block_size: int) -> tuple[list[int], int]:
    """The blocks each member row reads, padded with block 0 to the longest member's count, row after
    row, and that count."""
    row_blocks = [tables[r][: -(-(starts[r] + lengths[r]) // block_size)] for r in members]
    width = max(map(len, row_blocks))
    return [block for blocks in row_blocks for block in (*blocks, *[0] * (width - len(blocks)))], width


def _group_rows(lengths: list[int]) -> list[list[int]]:
    """Rows by query length: one group per power-of-two class of lengths, so a group pads a row's
    query to less than twice its own (verify windows and draft steps all land in one group)."""
    classes: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        classes.setdefault(max(length - 1, 0).bit_length(), []).append(row)
    return [classes[key] for key in sorted(classes)]


def _group(members: list[int], tables: list[list[int]], starts: list[int], lengths: list[int],
           offsets: list[int], block_size: int, device: torch.device) -> AttentionGroup:
    query_len = max(lengths[r] for r in members)
    padded, num_row_blocks = _padded_blocks(tables, starts, lengths, members, block_size)
    kv_blocks = torch.tensor(padded, dtype=torch.long, device=device)
    rows = torch.tensor([[offsets[r] for r in members], [lengths[r] for r in members], [starts[r] for r in members]],
                        device=device)
    starts_t = torch.tensor([starts[r] for r in members], device=device)  # [rows]
    ends_t = starts_t + torch.tensor([lengths[r] for r in members], device=device)
    positions = torch.arange(num_row_blocks * block_size, device=device)
    last_visible = starts_t[:, None] + torch.arange(query_len, device=device)  # [rows, query_len]
    visible = positions[None, None, :] <= last_visible[:, :, None]  # causal
    visible &= positions[None, None, :] < ends_t[:, None, None]  # within the row's own KV
    mask = None if bool(visible.all()) else visible
    contiguous = members == list(range(members[0], members[-1] + 1))
    uniform = all(lengths[r] == query_len for r in members)
    if contiguous and uniform and offsets[members[0]] == 0 and offsets[members[-1] + 1] == offsets[-1]:
        return AttentionGroup(len(members), query_len, None, kv_blocks, num_row_blocks, mask, None, None, rows)
    columns = torch.arange(query_len, device=device)
    token_index = torch.tensor([offsets[r] for r in members], device=device)[:, None] + columns  # [rows, query_len]
    real = columns[None, :] < (ends_t - starts_t)[:, None]  # [rows, query_len]
    token_index = torch.where(real, token_index, torch.zeros_like(token_index))
    return AttentionGroup(len(members), query_len, token_index, kv_blocks, num_row_blocks, mask,
                          real.flatten().nonzero().flatten(), token_index[real], rows)


class PagedKVCache(Cache):
    """Keys and values of every layer in blocks, `[kv_heads, blocks · block_size, head_dim]`: a row's
    blocks are gathered per head as whole runs of `block_size` positions. A pass writes through its
    layout's slot mapping."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, value_head_dim: int | None = None) -> None:
        super().__init__(layers=[])
        positions = num_blocks * block_size
        self.keys = [torch.zeros(num_kv_heads, positions, head_dim, dtype=dtype, device=device)
                     for _ in range(num_layers)]
        self.values = [torch.zeros(num_kv_heads, positions, value_head_dim or head_dim, dtype=dtype, device=device)
                       for _ in range(num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.layout: PassLayout | None = None
        self._kv_len = 0

    @property
    def bytes_per_token(self) -> int:
        return sum(t[:, 0].numel() * t.element_size() for t in self.keys + self.values)

    def bind(self, layout: PassLayout, kv_len: int) -> None:
        self.layout, self._kv_len = layout, kv_len

    def write(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, layout: PassLayout) -> None:
        """keys / values: [tokens, kv_heads, dim] of a flat pass, written at the layout's positions."""
        pool_keys, pool_values = self.keys[layer_idx], self.values[layer_idx]
        pool_keys.index_copy_(1, layout.slot_mapping, keys.transpose(0, 1).to(pool_keys.dtype))
        pool_values.index_copy_(1, layout.slot_mapping, values.transpose(0, 1).to(pool_values.dtype))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states / value_states: [1, num_kv_heads, tokens, head_dim] of the flat pass
        assert self.layout is not None, "bind() comes before a forward"
        self.write(layer_idx, key_states[0].transpose(0, 1), value_states[0].transpose(0, 1), self.layout)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self._kv_len, 0


class bound_pass:
    """Context in which `paged_attention` reads `layout` (the model call of one pass)."""

    def __init__(self, layout: PassLayout) -> None:
        self.layout = layout

    def __enter__(self) -> PassLayout:
        self._token = _PASS.set(self.layout)
        return self.layout

    def __exit__(self, *exc: object) -> None:
        _PASS.reset(self._token)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    softcap: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention of one flat pass over the paged cache. query: [1, heads, tokens, dim]; key/value: the
    layer's whole pools [kv_heads, positions, dim] (`PagedKVCache.update`). Returns [1, tokens, heads, dim]."""
    layout = _PASS.get()
    if layout is None:  # the model outside the engine (`generate` in a benchmark, training): plain attention
        return _unpaged_attention(module, query, key, value, attention_mask, dropout, scaling, softcap, **kwargs)
    return attend(query[0].transpose(0, 1), key, value, layout, scaling, softcap)[None], None


def attend(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PassLayout, scaling: float | None,
           softcap: float | None = None) -> torch.Tensor:
    """q: [tokens, heads, dim] of a flat pass; key/value: a layer's pools [kv_heads, positions, dim].
    Returns [tokens, heads, value_dim]. Where the kernel serves the tensors, every row in one call
    over the pass's q whatever its length (a call per group, each gathering and scattering its
    tokens, slowed the mixed verify passes of a constrained job); otherwise each group gathers its
    rows' blocks for SDPA."""
    num_heads, value_dim = q.shape[1], value.shape[-1]
    if softcap is None and paged_kernel.supports(q, key, value):
        tables, rows = layout.kernel_inputs()
        scale = scaling if scaling is not None else q.shape[-1] ** -0.5
        return paged_kernel.attend(q, key, value, tables, rows, layout.block_size, scale)
    assert layout.groups, "a layout built for the kernel alone reached the gathering path"
    out = None
    for group in layout.groups:
        if group.token_index is None:  # the group is the whole pass, its tokens row-major
            return _attend(q.reshape(group.num_rows, group.query_len, num_heads, -1), key, value, group,
                           layout.block_size, scaling, softcap).reshape(layout.num_tokens, num_heads, value_dim)
        assert group.tokens is not None and group.keep is not None
        out = q.new_empty(layout.num_tokens, num_heads, value_dim) if out is None else out
        attended = _attend(q[group.token_index], key, value, group, layout.block_size, scaling, softcap)
        out[group.tokens] = attended.reshape(-1, num_heads, value_dim)[group.keep].to(out.dtype)
    assert out is not None
    return out


def _attend(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group: AttentionGroup, block_size: int,
            scaling: float | None, softcap: float | None) -> torch.Tensor:
    """q: [rows, query_len, heads, dim] -> [rows, query_len, heads, value_dim] over the group's blocks.
    The query heads sharing a KV head are folded into its query rows, so grouped-query attention
    reads each KV head once instead of a copy per query head."""
    rows, query_len, num_heads, _ = q.shape
    num_kv_heads = key.shape[0]
    group_size, kv_len = num_heads // num_kv_heads, group.num_row_blocks * block_size
    # [rows, kv_heads, kv_len, dim]
    k = _gather(key, group, block_size).view(num_kv_heads, rows, kv_len, -1).transpose(0, 1)
    v = _gather(value, group, block_size).view(num_kv_heads, rows, kv_len, -1).transpose(0, 1)
    q = q.permute(0, 2, 1, 3).reshape(rows, num_kv_heads, group_size * query_len, -1)  # [rows, kv_heads, g·q, dim]
    mask = group.mask(group_size)
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    else:  # soft-capped scores (Gemma 2): SDPA has no cap, so the maths written out
        scores = torch.matmul(q, k.transpose(-1, -2)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    return out.view(rows, num_heads, query_len, -1).transpose(1, 2)


def _gather(pool: torch.Tensor, group: AttentionGroup, block_size: int) -> torch.Tensor:
    """The group's blocks of one layer's pool [kv_heads, positions, dim]: [kv_heads, rows · blocks, block, dim]."""
    return pool.view(pool.shape[0], -1, block_size, pool.shape[-1]).index_select(1, group.kv_blocks)


def _unpaged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float, scaling: float | None,
                       softcap: float | None, **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA with the bool mask `paged_mask` made (soft-capped maths where the model caps scores)."""
    if softcap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    repeat = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), value)
    return out.transpose(1, 2).contiguous(), None


def paged_mask(*args, **kwargs) -> torch.Tensor | None:
    """No mask inside a paged pass (attention builds its own per group); outside it SDPA's bool mask,
    always made (not left to SDPA's `is_causal`: the soft-capped maths reads it)."""
    return None if _PASS.get() is not None else sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})


AttentionInterface.register(ATTENTION_NAME, paged_attention)
AttentionMaskInterface.register(ATTENTION_NAME, paged_mask)
