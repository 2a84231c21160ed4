"""Crash injection for the kill -9 tests: `SPECBATCH_CRASH_AT=point:n` SIGKILLs this process the
n-th time it passes `point` (ingest_shard, part_committed, manifest_write, round); `point:n:TERM`
sends SIGTERM instead (a stop at that moment). Unset, each call is one dictionary lookup. It lets
tests kill a job at exact moments no timer can hit."""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crash_point(point: str) -> None:
    spec = os.environ.get("SPECBATCH_CRASH_AT")
    if not spec:
        return
    name, _, rest = spec.partition(":")
    if name != point:
        return
    count, _, sig = rest.partition(":")
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == int(count or 1) or (_hits[point] > int(count or 1) and sig != "TERM"):
        os.kill(os.getpid(), signal.SIGTERM if sig == "TERM" else signal.SIGKILL)
