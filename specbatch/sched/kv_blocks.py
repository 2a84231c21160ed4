"""KV capacity in fixed-size blocks: block tables, refcounts, and shared prefixes held once.

Every running row has a block table: position p of the row lives in block `table[p // block_size]`.
A block full of computed KV is registered under a chained key of its tokens (the key of the block
before it and this block's tokens), so a row whose tokens start the same way points its table at
the same blocks instead of computing them: one copy of a shared prefix, however many rows read it.
A lookup confirms the tokens and the parent key, so a colliding key never matches.

A block nobody references but that holds a registered prefix stays cached until its memory is
needed (`max_cached_blocks` bounds them; `cache.prefix_kv_bytes`): first the blocks no second row has
read (a row's own prompt tail and output), least recently used first, then those that rows shared. So a
prefix that rows take turns with (A, B, A, B at one row) outlives the tails of the rows between.
Only full blocks below a row's pending token are shared, and shared blocks are never written:
a row writes only positions at or past its own `num_computed`, which lie in blocks it allocated
itself, so no block needs copying on write.

Capacity is counted in blocks, a shared block once: admission keeps the blocks in use plus every
running row's outstanding reservation within the pool. No torch: the simulator runs it too.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from specbatch.core import KVUse, Row


@dataclass
class _Block:
    refcount: int = 0
    key: int | None = None  # chained key of a registered block
    parent_key: int | None = None
    tokens: tuple[int, ...] = ()
    has_draft: bool = False  # the draft model's KV of these positions is computed too
    was_shared: bool = False  # a second row read it since it was registered (shared, or taken from the cache)


@dataclass
class _Holding:
    table: list[int] = field(default_factory=list)
    num_own: int = 0  # table blocks allocated for this row (the rest it shares: taken registered)
    num_reserved: int = 0  # own blocks this row may hold (worst case or next round)
    keys: list[int] = field(default_factory=list)  # chained keys of its leading full blocks, as far as known
    num_draft_marked: int = 0  # leading blocks `register` marked as holding the draft model's KV too


@dataclass
class BlockCounters:
    """Raw counters since the last read, for the round ledger."""

    num_evicted: int = 0
    num_hit_blocks: int = 0


class KVBlocks:
    def __init__(self, num_blocks: int, block_size: int, share_prefixes: bool = True,
                 max_cached_blocks: int | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV pool needs at least one block of at least one position")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.share_prefixes, self.max_cached_blocks = share_prefixes, max_cached_blocks
        self.blocks = [_Block() for _ in range(num_blocks)]
        self.free_blocks: deque[int] = deque(range(num_blocks))  # hold nothing reusable
        # unreferenced registered blocks, oldest first: those no second row read, then those rows shared
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.cached_shared: OrderedDict[int, None] = OrderedDict()
        self.by_key: dict[int, int] = {}  # chained key -> its registered block
        self.holdings: dict[str, _Holding] = {}
        self.counters = BlockCounters()
        self.num_in_use = 0  # blocks with refcount > 0
        self.num_shared = 0  # blocks with refcount > 1

    # ---- sizes --------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    @property
    def num_outstanding(self) -> int:
        """Blocks running rows may still allocate within their reservations."""
        return sum(max(0, h.num_reserved - h.num_own) for h in self.holdings.values())

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor promised to a running row (cached blocks count as free)."""
        return self.num_blocks - self.num_in_use - self.num_outstanding

    @property
    def num_used(self) -> int:
        """Positions in use or promised, the ledger's `kv_tokens_in_use`."""
        return (self.num_in_use + self.num_outstanding) * self.block_size

    @property
    def num_cached(self) -> int:
        return len(self.cached) + len(self.cached_shared)

    def table(self, request_id: str) -> list[int]:
        return self.holdings[request_id].table

    def reserved(self, request_id: str) -> int:
        """Positions a row's reservation covers, shared blocks included (what `reserve` takes)."""
        holding = self.holdings.get(request_id)
        if holding is None:
            return 0
        return (max(holding.num_reserved, holding.num_own) + len(holding.table) - holding.num_own) * self.block_size

    def held_tokens(self, request_id: str) -> int:
        """Positions preempting a row frees: its own blocks and reservation (shared ones stay)."""
        holding = self.holdings.get(request_id)
        if holding is None:
            return 0
        return max(holding.num_reserved, holding.num_own) * self.block_size

    # ---- admission ----------------------------------------------------------------------------
    def lookup(self, row: Row) -> list[int]:
        """Registered blocks holding the row's leading tokens (below its pending token), in order."""
        if not self.share_prefixes:
            return []
        keys = self._keys(row.token_ids, (row.num_tokens - 1) // self.block_size)
        found = []
        for index, key in enumerate(keys):
            block = self._match(key, row.token_ids, index, keys[index - 1] if index else None)
            if block is None:
                break
            found.append(block)
        return found

    def need(self, row: Row, num_positions: int, shared: list[int]) -> int:
        """Blocks admitting `row` takes from the free pool: its own reservation, plus the shared
        blocks that sit unreferenced in the cache (they come back into use)."""
        revived = sum(1 for block in shared if self.blocks[block].refcount == 0)
        return max(0, self.blocks_for(num_positions) - len(shared)) + revived

    def can_admit(self, row: Row, num_positions: int, shared: list[int]) -> bool:
        return self.need(row, num_positions, shared) <= self.num_free

    def admit(self, row: Row, num_positions: int, shared: list[int]) -> int:
        """Give `row` a table starting with `shared` and a reservation covering `num_positions`;
        returns the positions the shared blocks hold (already computed for the row)."""
        holding = self.holdings.setdefault(row.request_id, _Holding())
        assert not holding.table, "a row is admitted once until it is freed"
        for block in shared:
            self._take(block)
        holding.table = list(shared)
        holding.keys = [self.blocks[block].key for block in shared]  # type: ignore[misc]  # registered: keyed
        holding.num_reserved = max(0, self.blocks_for(num_positions) - len(shared))
        self.counters.num_hit_blocks += len(shared)
        return len(shared) * self.block_size

    def num_draft_shared(self, request_id: str) -> int:
        """Leading shared positions whose draft-model KV is computed too."""
        holding = self.holdings[request_id]
        count = 0
        for block in holding.table[: len(holding.keys)]:
            if not self.blocks[block].has_draft:
                break
            count += 1
        return count * self.block_size

    def reserve(self, request_id: str, num_positions: int) -> None:
        """Set a running row's reservation (grow or shrink) to cover `num_positions`."""
        holding = self.holdings[request_id]
        holding.num_reserved = max(0, self.blocks_for(num_positions) - (len(holding.table) - holding.num_own))

    # ---- during a round -----------------------------------------------------------------------
    def ensure(self, request_id: str, num_positions: int) -> None:
        """Grow a row's table to cover positions [0, num_positions)."""
        holding = self.holdings[request_id]
        while len(holding.table) * self.block_size < num_positions:
            holding.table.append(self._allocate())
            holding.num_own += 1

    def extend_shared(self, row: Row) -> int:
        """Point a prefilling row's next blocks at registered ones where its tokens match (an earlier
        row has computed them since); the row's own blocks there are freed. Returns positions gained."""
        holding = self.holdings[row.request_id]
        first = row.num_computed // self.block_size
        if not self.share_prefixes or row.num_computed % self.block_size or first != len(holding.keys):
            return 0
        limit = (row.num_tokens - 1) // self.block_size
        gained = 0
        for index in range(first, limit):
            key = self._chain(holding.keys[-1] if holding.keys else None, row.token_ids, index)
            block = self._match(key, row.token_ids, index, holding.keys[-1] if holding.keys else None)
            if block is None:
                break
            self._take(block)
            if index < len(holding.table):
                self._release(holding.table[index])
                holding.table[index] = block
                holding.num_own -= 1
            else:
                holding.table.append(block)
            holding.num_reserved = max(0, holding.num_reserved - 1)
            holding.keys.append(key)
            gained += self.block_size
        self.counters.num_hit_blocks += gained // self.block_size
        return gained

    def next_key(self, row: Row) -> int | None:
        """The chained key of the block a prefilling row computes next, if it is a full prompt block
        at a block boundary (what `pending` compares across rows)."""
        holding = self.holdings[row.request_id]
        index = row.num_computed // self.block_size
        if (not self.share_prefixes or row.num_computed % self.block_size or index != len(holding.keys)
                or (index + 1) * self.block_size > row.num_tokens - 1):
            return None
        return self._chain(holding.keys[-1] if holding.keys else None, row.token_ids, index)

    def register(self, row: Row) -> None:
        """Register the row's full blocks whose KV is computed, so later rows can share them; mark
        those whose draft KV is computed too."""
        holding = self.holdings.get(row.request_id)
        if holding is None:
            return
        num_full = min(row.num_computed, row.num_tokens) // self.block_size
        while self.share_prefixes and len(holding.keys) < num_full:
            index = len(holding.keys)
            parent = holding.keys[-1] if holding.keys else None
            key = self._chain(parent, row.token_ids, index)
            block = self.blocks[holding.table[index]]
            if key not in self.by_key and block.key is None:
                block.key, block.parent_key = key, parent
                block.tokens = tuple(row.token_ids[index * self.block_size : (index + 1) * self.block_size])
                self.by_key[key] = holding.table[index]
            holding.keys.append(key)
        # only blocks not marked before: a held block stays marked (only eviction clears it), and the
        # blocks a prefilling row takes from others (`extend_shared`) lie past its computed positions
        num_draft_full = min(row.num_draft_computed, row.num_computed) // self.block_size
        for index in range(holding.num_draft_marked, num_draft_full):
            self.blocks[holding.table[index]].has_draft = True
        holding.num_draft_marked = max(holding.num_draft_marked, num_draft_full)

    def free(self, request_id: str) -> None:
        """A row left (finished or preempted): drop its references; registered blocks stay cached."""
        holding = self.holdings.pop(request_id, None)
        if holding is None:
            return
        for block in reversed(holding.table):  # a prefix's last blocks become the least recently used
            self._release(block)
        self._trim_cache()

    def use(self) -> KVUse:
        """What the blocks hold now, and evictions since the last call (one ledger row's worth)."""
        counters = self.read_counters()
        referenced = sum(len(holding.table) for holding in self.holdings.values())
        return KVUse(self.num_in_use, self.num_shared, self.num_cached, counters.num_evicted, referenced)

    def read_counters(self) -> BlockCounters:
        counters, self.counters = self.counters, BlockCounters()
        return counters

    # ---- internals ----------------------------------------------------------------------------
    def _keys(self, tokens: list[int], num_blocks: int) -> list[int]:
        keys: list[int] = []
        for index in range(num_blocks):
            keys.append(self._chain(keys[-1] if keys else None, tokens, index))
        return keys

    def _chain(self, parent: int | None, tokens: list[int], index: int) -> int:
        # a tuple of ints hashes the same in every process (PYTHONHASHSEED salts only str and bytes)
        return hash((parent, tuple(tokens[index * self.block_size : (index + 1) * self.block_size])))

    def _match(self, key: int, tokens: list[int], index: int, parent: int | None) -> int | None:
        block_id = self.by_key.get(key)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.parent_key != parent or block.tokens != tuple(tokens[index * self.block_size :
                                                                      (index + 1) * self.block_size]):
            return None
        return block_id

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.refcount == 0:
            tier = self._tier(block)
            if block_id in tier:  # a later row reads a cached block
                del tier[block_id]
                block.was_shared = True
            self.num_in_use += 1
        else:
            block.was_shared = True
            self.num_shared += block.refcount == 1
        block.refcount += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.refcount -= 1
        assert block.refcount >= 0, f"block {block_id} released more often than taken"
        if block.refcount == 1:
            self.num_shared -= 1
        if block.refcount:
            return
        self.num_in_use -= 1
        if block.key is not None and self.by_key.get(block.key) == block_id:
            self._tier(block)[block_id] = None  # most recently used last
        else:
            self._forget(block)
            self.free_blocks.append(block_id)

    def _allocate(self) -> int:
        if self.free_blocks:
            block_id = self.free_blocks.popleft()
        elif self.num_cached:
            block_id = self._evict()
        else:
            raise RuntimeError("KV blocks exhausted: admission let a row past the pool")
        self._take(block_id)
        return block_id

    def _forget(self, block: _Block) -> None:
        if block.key is not None and self.by_key.get(block.key) is not None and \
                self.blocks[self.by_key[block.key]] is block:
            del self.by_key[block.key]
        block.key, block.parent_key, block.tokens, block.has_draft, block.was_shared = None, None, (), False, False

    def _tier(self, block: _Block) -> OrderedDict[int, None]:
        """The cache an unreferenced registered block waits in (see the module doc)."""
        return self.cached_shared if block.was_shared else self.cached

    def _evict(self) -> int:
        """Forget the cached block to drop first (see the module doc) and return it."""
        block_id, _ = (self.cached if self.cached else self.cached_shared).popitem(last=False)
        self._forget(self.blocks[block_id])
        self.counters.num_evicted += 1
        return block_id

    def _trim_cache(self) -> None:
        while self.max_cached_blocks is not None and self.num_cached > self.max_cached_blocks:
            self.free_blocks.append(self._evict())
