"""The waiting queue: one heap per order class, keyed by each row's static key.

A row's priority is class_scale(class) · key(row). Keys do not change while a row waits, and a
class's scale applies to all its rows alike, so each class heap stays ordered however the scales
move; the best waiting row is the best of the class heads: O(#classes) to peek, O(log n) to pop,
no re-ranking of a million waiting rows when statistics change. If the order policy ages rows (its
priority falls the longer a row waits), a heap by arrival time adds the oldest waiting row to the
candidates: the best of the class heads and the oldest row by current priority goes next.

Entries are lists [key, counter, row, alive]; popped entries are marked dead and skipped lazily
(a row sits in its class heap and, with the guard, in the arrival heap).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from specbatch.core import Row
from specbatch.sched.policies import OrderPolicy

_KEY, _COUNTER, _ROW, _ALIVE = 0, 1, 2, 3


class WaitQueue:
    def __init__(self, order: OrderPolicy) -> None:
        self.order = order
        self._heaps: dict[str, list[list]] = {}
        self._by_arrival: list[tuple[float, int, list]] = []
        self._counter = itertools.count()
        self._size = 0

    def push(self, row: Row, now_s: float) -> None:
        entry: list[Any] = [self.order.key(row, now_s), next(self._counter), row, True]
        heapq.heappush(self._heaps.setdefault(self.order.class_of(row), []), entry)
        if self.order.ages_waiting_rows:
            heapq.heappush(self._by_arrival, (row.arrival_s, entry[_COUNTER], entry))
        self._size += 1

    def peek(self, now_s: float) -> Row | None:
        entry = self._best(now_s)
        return entry[_ROW] if entry is not None else None

    def pop(self, now_s: float) -> Row:
        entry = self._best(now_s)
        if entry is None:
            raise IndexError("pop from an empty wait queue")
        entry[_ALIVE] = False
        self._size -= 1
        return entry[_ROW]

    def _best(self, now_s: float) -> list | None:
        heads = [(cls, entry) for cls, heap in self._heaps.items() if (entry := _head(heap, _entry))]
        if not heads:
            return None
        if not self.order.ages_waiting_rows:
            scale = self.order.class_scale
            return min(heads, key=lambda item: (scale(item[0]) * item[1][_KEY], item[1][_COUNTER]))[1]
        candidates = [entry for _, entry in heads] + [_head(self._by_arrival, _arrival_entry)[2]]
        return min(candidates, key=lambda e: (self.order.priority(e[_ROW], now_s), e[_COUNTER]))

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[tuple[float, int, Row]]:
        """Live entries as (key, counter, row), in no particular order."""
        for heap in self._heaps.values():
            for entry in heap:
                if entry[_ALIVE]:
                    yield entry[_KEY], entry[_COUNTER], entry[_ROW]

    def remove(self, rows: list[Row]) -> int:
        """Take these rows out (e.g. cancelled while waiting); one pass over the queue. Their
        entries are marked dead and dropped lazily, as popped ones are. Returns how many."""
        ids = {id(row) for row in rows}
        removed = 0
        for heap in self._heaps.values():
            for entry in heap:
                if entry[_ALIVE] and id(entry[_ROW]) in ids:
                    entry[_ALIVE] = False
                    removed += 1
        self._size -= removed
        return removed

    def clear(self) -> None:
        self._heaps.clear()
        self._by_arrival.clear()
        self._size = 0


def _entry(item: list) -> list:
    return item


def _arrival_entry(item: tuple[float, int, list]) -> list:
    return item[2]


def _head(heap: list[Any], entry_of: Callable[[Any], list[Any]]) -> Any:
    """The heap's first live item, dropping dead ones on the way."""
    while heap and not entry_of(heap[0])[_ALIVE]:
        heapq.heappop(heap)
    return heap[0] if heap else None
