"""`EagleDrafter`: chain drafting with an EAGLE-3 head from the target's own hidden states.

The head's KV cache holds, per lane (one per running row), positions whose inputs were the *target's* features: after a
verify pass the target's features of the accepted positions are known, so the next round first
feeds those (step 0, the catch-up) and then drafts one position per step from its own outputs.
Positions drafted from the head's own outputs are never kept: the next round overwrites them with
target features (`Proposals.num_kept` counts only the catch-up). Features wait in a per-request
buffer from the target pass that computed them until the head has read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbatch.core import PassShape, Proposals, Row
from specbatch.engine.argmax import greedy_tokens
from specbatch.engine.coupling import Coupling
from specbatch.engine.eagle import EagleHead, sdpa_attend
from specbatch.engine.forward import RowCache
from specbatch.engine.slot_cache import SlotCache, causal_slot_mask


@dataclass
class _Features:
    """Target features of positions first.. of one request, not yet all read by the head; fused by
    the head only when fed, so that rows not drafting (k = 0) cost no fusion. Kept as the passes'
    chunks, joined only when fed: a row that does not draft for a while costs no copy per pass."""

    first: int
    chunks: list[torch.Tensor]  # [positions, 3·target hidden] each, in position order
    num_positions: int

    @property
    def end(self) -> int:
        return self.first + self.num_positions

    def keep_until(self, position: int) -> None:
        """Drop positions from `position` on (rejected drafts, which the next pass computes again)."""
        keep = position - self.first
        while self.num_positions > keep:
            last, excess = self.chunks[-1], self.num_positions - keep
            if excess >= last.shape[0]:
                self.chunks.pop()
                self.num_positions -= last.shape[0]
            else:
                self.chunks[-1], self.num_positions = last[: last.shape[0] - excess], keep

    def values(self) -> torch.Tensor:
        if len(self.chunks) > 1:
            self.chunks = [torch.cat(self.chunks)]
        return self.chunks[0]


class EagleDrafter:
    uses_model = True

    def __init__(self, head: EagleHead, cache: SlotCache, target_device: torch.device) -> None:
        self.head, self.cache = head, cache
        self.target_device = target_device  # where q and the random streams live
        self.features: dict[str, _Features] = {}
        self.num_groups = head.config.num_attention_heads // head.num_kv_heads

    def observe(self, rows: list[Row], starts: list[int], lengths: list[int], features: torch.Tensor) -> None:
        """Keep the target's features [Σ lengths, 3·hidden] (flat, rows in order) of the positions a
        pass computed."""
        offset = 0
        for row, start, length in zip(rows, starts, lengths, strict=True):
            held = self.features.get(row.request_id)
            new = features[offset : offset + length]
            offset += length
            if held is not None and held.first <= start <= held.end:
                held.keep_until(start)
                held.chunks.append(new)
                held.num_positions += length
            else:
                self.features[row.request_id] = _Features(start, [new], length)

    def forget(self, row: Row) -> None:
        self.features.pop(row.request_id, None)

    def prefill(self, rows: list[Row], caches: list[RowCache], starts: list[int], ends: list[int]
                ) -> PassShape | None:
        """Feed positions starts..ends (their target features came with this round's prefill pass)."""
        _, shape = self._feed(rows, [cache.lane for cache in caches], starts, ends)
        return shape

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        slots = [cache.lane for cache in caches]  # the head keeps its own per-row cache, by lane
        proposals = Proposals([[] for _ in rows], [None for _ in rows], [0 for _ in rows], num_kept=[0 for _ in rows])
        # the head reads the target's features of the position before the pending token: a row whose
        # target has computed nothing yet (a one-token prompt) drafts from the next round on
        active = [i for i, k in enumerate(ks) if k > 0 and rows[i].num_tokens >= 2]
        if not active:
            return proposals
        # step 0: positions the head lacks, up to the pending token's (its output there drafts token 1);
        # at least that last position, which a prefill that ended this round fed without keeping its output
        ends = [rows[i].num_tokens - 1 for i in active]
        firsts = [min(starts[i], end - 1) for i, end in zip(active, ends, strict=True)]
        outputs, shape = self._feed([rows[i] for i in active], [slots[i] for i in active], firsts, ends)
        self._count(proposals, shape)
        q_rows: list[list[torch.Tensor]] = [[] for _ in rows]
        for row_index, i in enumerate(active):
            proposals.num_fed[i] = ends[row_index] - firsts[row_index]
            proposals.num_kept[i] = ends[row_index] - starts[i] if starts[i] < ends[row_index] else 0
        step = 0
        while True:
            for i, (token, q) in zip(active, self._pick([rows[i] for i in active], [len(proposals.tokens[i])
                                                         for i in active], outputs, coupling), strict=True):
                proposals.tokens[i].append(token)
                if q is not None:
                    q_rows[i].append(q)
            kept = [row_index for row_index, i in enumerate(active) if len(proposals.tokens[i]) < ks[i]]
            if not kept:
                break
            step += 1
            outputs = outputs[kept]
            active = [active[row_index] for row_index in kept]
            positions = [rows[i].num_tokens - 2 + step for i in active]
            tokens = torch.tensor([[proposals.tokens[i][-1]] for i in active], device=outputs.device)
            outputs, shape = self._step([slots[i] for i in active], positions, tokens, outputs[:, None])
            self._count(proposals, shape)
            for i in active:
                proposals.num_fed[i] += 1
        for i, row in enumerate(rows):
            if q_rows[i] and not row.params.is_greedy:
                proposals.draft_probs[i] = torch.stack(q_rows[i])
        return proposals

    def _feed(self, rows: list[Row], slots: list[int], starts: list[int], ends: list[int]
              ) -> tuple[torch.Tensor, PassShape]:
        """Feed each row's positions starts..ends from its buffered target features and the token
        after each position; returns the head's output at each row's last position [rows, hidden]."""
        device = self.head.fc.weight.device
        lengths = [end - start for start, end in zip(starts, ends, strict=True)]
        query_len = max(lengths)
        tokens = [row.token_ids[start + 1 : end + 1] + [0] * (query_len - end + start)
                  for row, start, end in zip(rows, starts, ends, strict=True)]
        raw = torch.zeros((len(rows), query_len, self.head.fc.in_features), dtype=self.head.fc.weight.dtype,
                          device=device)
        for index, (row, start, end) in enumerate(zip(rows, starts, ends, strict=True)):
            held = self.features[row.request_id]
            assert held.first <= start and end <= held.end, "target features of a fed position are missing"
            values = held.values()
            raw[index, : end - start] = values[start - held.first : end - held.first]
            self.features[row.request_id] = _Features(end - 1, [values[end - 1 - held.first :]], held.end - end + 1)
        hidden = self.head.fuse(raw)
        offsets = torch.arange(query_len, device=device)
        firsts = torch.tensor(starts, dtype=torch.long, device=device)
        real = offsets[None, :] < torch.tensor(lengths, device=device)[:, None]
        # padded queries write at the slot's last position, which no row's valid prefix reaches
        positions = torch.where(real, firsts[:, None] + offsets, self.cache.max_len - 1)
        outputs = self._run(slots, positions, firsts, max(ends), torch.tensor(tokens, device=device), hidden)
        last = outputs[torch.arange(len(rows), device=device), torch.tensor(lengths, device=device) - 1]
        return last, PassShape(len(rows), len(rows), query_len, int(max(ends)), sum(lengths))

    def _step(self, slots: list[int], positions: list[int], tokens: torch.Tensor, hidden: torch.Tensor
              ) -> tuple[torch.Tensor, PassShape]:
        """One chain step: each row feeds its last draft token with the head's previous output."""
        device = tokens.device
        firsts = torch.tensor(positions, dtype=torch.long, device=device)
        outputs = self._run(slots, firsts[:, None], firsts, max(positions) + 1, tokens, hidden)
        return outputs[:, 0], PassShape(len(slots), len(slots), 1, max(positions) + 1, len(slots))

    def _run(self, slots: list[int], positions: torch.Tensor, firsts: torch.Tensor, kv_len: int,
             tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The head over [rows, query_len] positions of `slots` (row b's first at firsts[b])."""
        query_len = positions.shape[1]
        self.cache.bind(slots, positions, kv_len)
        mask = causal_slot_mask(firsts, query_len, kv_len, None)
        attend = sdpa_attend(mask, self.num_groups)

        def cached_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache.update(key, value, 0)
            return attend(query, keys, values)

        with torch.no_grad():
            return self.head(tokens, hidden, positions, cached_attend)

    @staticmethod
    def _count(proposals: Proposals, shape: PassShape) -> None:
        proposals.num_draft_positions += shape.num_real_positions
        proposals.num_padded_draft_positions += shape.num_padded_positions
        proposals.num_passes += 1

    def _pick(self, rows: list[Row], draft_indices: list[int], outputs: torch.Tensor, coupling: Coupling
              ) -> list[tuple[int, torch.Tensor | None]]:
        """Each row's next draft token and its q, from the head's outputs [rows, hidden]. Greedy rows
        take the argmax over the draft vocabulary, mapped to a target id (the same token as the argmax
        over the target's vocabulary, where every other id is -inf), all rows with one transfer."""
        draft_logits = self.head.draft_logits(outputs)
        greedy = torch.tensor(greedy_tokens(draft_logits), device=draft_logits.device)
        greedy_ids = (greedy + self.head.d2t[greedy]).tolist()
        picks: list[tuple[int, torch.Tensor | None]] = []
        for index, (row, draft_index) in enumerate(zip(rows, draft_indices, strict=True)):
            if row.params.is_greedy and not coupling.constrains(row):  # a constrained row's argmax is masked
                picks.append((greedy_ids[index], None))
            else:
                logits = self.head.to_target_vocab(draft_logits[index]).to(self.target_device)
                picks.append(coupling.draft(row, row.num_output_tokens + draft_index, logits))
        return picks
