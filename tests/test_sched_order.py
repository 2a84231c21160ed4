"""Order policies and the waiting queue on hand-made rows (no model)."""

from __future__ import annotations

import heapq
from collections import Counter
from types import SimpleNamespace

import pytest
from sched_engine_helpers import SimLoop, make_row, make_scheduler

from specbatch.core import Row
from specbatch.sched import queues
from specbatch.sched.context import SchedContext
from specbatch.sched.factory import make_order
from specbatch.sched.order import LapsSd, SpecbatchOrder
from specbatch.sched.policies import Fcfs, ShortestJobFirst
from specbatch.sched.queues import WaitQueue


def test_fcfs_and_sjf_keys():
    early, late = make_row("a", max_new=90, arrival_s=1.0), make_row("b", max_new=10, arrival_s=2.0)
    assert Fcfs().key(early, 0) < Fcfs().key(late, 0)
    assert ShortestJobFirst().key(late, 0) < ShortestJobFirst().key(early, 0)


def test_wait_queue_pops_in_key_order_and_iterates_like_a_heap():
    queue = WaitQueue(ShortestJobFirst())
    for i, max_new in enumerate([30, 10, 20]):
        queue.push(make_row(f"r{i}", num_prompt=1, max_new=max_new), 0.0)
    assert sorted(entry[2].request_id for entry in queue) == ["r0", "r1", "r2"]  # (key, counter, row)
    assert [queue.pop(0.0).request_id for _ in range(3)] == ["r1", "r2", "r0"]
    assert not queue and queue.peek(0.0) is None


def test_laps_sd_least_attained_service_until_settled():
    order = LapsSd(SchedContext(max_lookahead=4))
    fresh = make_row("fresh", num_prompt=4, max_new=200)
    served = make_row("served", num_prompt=4, max_new=200, history=[(0, 4), (1, 4)] * 2, num_output=40)
    served.num_rounds = 40  # attained well past the first queue's threshold, α̂ not settled yet
    assert order.level(fresh) < order.level(served)
    assert order.should_preempt(served, fresh, 0.0)
    assert not order.should_preempt(fresh, served, 0.0)


def test_laps_sd_settled_rows_rank_by_estimated_remaining_time():
    order = LapsSd(SchedContext(max_lookahead=4))
    good = make_row("good", max_new=120, history=[(4, 4)] * 8, num_output=40)  # α̂ high: few rounds left
    poor = make_row("poor", max_new=120, history=[(0, 4)] * 8, num_output=40)  # α̂ low: T = L·(k t_d + t_v)
    assert order.service_rounds(good)[0] and order.service_rounds(poor)[0]
    assert order.key(good, 0) < order.key(poor, 0)


def test_laps_sd_without_drafts_is_srpt_at_once():
    order = LapsSd(SchedContext(max_lookahead=0))
    short, long = make_row("s", max_new=10), make_row("l", max_new=400)
    assert order.service_rounds(short)[0]  # settled: T is exact without drafts
    assert order.key(short, 0) < order.key(long, 0)


def code_and_prose_context() -> SchedContext:
    ctx = SchedContext(max_lookahead=4)
    for _ in range(50):
        ctx.stats.observe("code", 4, 4)
        ctx.stats.observe("prose", 4, 0)
    for _ in range(20):
        ctx.stats.observe_finish("code", 30, 100, 1.0)  # code stops early (EOS)
        ctx.stats.observe_finish("prose", 100, 100, 1.0)
    return ctx


def test_specbatch_prefers_fast_domains_with_equal_budgets():
    order = SpecbatchOrder(code_and_prose_context())
    code, prose = make_row("c", max_new=100, domain="code"), make_row("p", max_new=100, domain="prose")
    assert order.remaining_ms(code, 0) < order.remaining_ms(prose, 0) / 3


def test_specbatch_class_scales_reorder_waiting_rows_without_rekeying():
    ctx = SchedContext(max_lookahead=4)
    order = SpecbatchOrder(ctx, aging=0.0)
    queue = WaitQueue(order)
    queue.push(make_row("code", max_new=100, domain="code"), 0.0)
    queue.push(make_row("prose", max_new=80, domain="prose"), 0.0)
    assert queue.peek(0.0).request_id == "prose"  # same priors: the smaller budget first
    for _ in range(50):  # then code turns out to draft well and stop early
        ctx.stats.observe("code", 4, 4)
        ctx.stats.observe_finish("code", 20, 100, 1.0)
    ctx.num_plans += 1  # scales are read once per plan
    assert queue.peek(0.0).request_id == "code"


def test_specbatch_aging_lifts_a_long_waiting_row():
    order = SpecbatchOrder(SchedContext(max_lookahead=4), aging=0.5)
    queue = WaitQueue(order)
    old = make_row("old", max_new=400, arrival_s=99.99)
    queue.push(old, 99.99)
    queue.push(make_row("new", max_new=20, arrival_s=100.0), 100.0)
    assert queue.peek(100.0).request_id == "new"  # nearly the same wait: the shorter first
    old.arrival_s = 0.0  # (as if) waited 100 s: its credit outweighs its length
    assert queue.peek(100.0).request_id == "old"


def test_specbatch_preemption_is_cache_aware():
    order = SpecbatchOrder(SchedContext(max_lookahead=4), aging=0.0)
    newcomer = make_row("new", max_new=10)
    small = make_row("small", num_prompt=4, max_new=400, num_output=4)
    big = make_row("big", num_prompt=300, max_new=400, num_output=4)
    near_done = make_row("near", num_prompt=4, max_new=14, num_output=4)
    assert order.should_preempt(small, newcomer, 0) and order.should_preempt(big, newcomer, 0)
    assert not order.should_preempt(near_done, newcomer, 0)  # margin: not worth a recompute
    assert order.pick_victim([big, small], 0, [700, 408], need_tokens=100) is small
    assert order.pick_victim([big, small], 0, [700, 408], need_tokens=500) is big  # only big covers it


def test_preemptive_order_swaps_a_long_running_row_for_a_short_waiting_one():
    scheduler = make_scheduler("specbatch", max_rows=1, capacity=10_000)
    scheduler.order.aging = 0.0
    long = make_row("long", max_new=500)
    scheduler.add(long)
    scheduler.plan(0.0)
    short = make_row("short", max_new=5)
    scheduler.add(short)
    _, admission = scheduler.plan(0.0)
    assert admission.preempted == [long] and admission.admitted == [short]
    assert long.num_computed == 0 and long.num_preemptions == 1
    assert scheduler.kv.holdings.keys() == {"short"}


@pytest.mark.parametrize("order", ["laps-sd", "specbatch"])
def test_speculation_aware_orders_beat_fcfs_on_mean_completion(order):
    """A code + prose mix on the simulated loop: code drafts well and stops early, prose does neither."""
    def mean_completion(name: str) -> float:
        scheduler = make_scheduler(name, "fixed:4", max_rows=4, max_tokens=512)
        loop = SimLoop(scheduler, seed=3)
        for i in range(40):
            domain = "code" if i % 2 else "prose"
            row = make_row(f"r{i}", num_prompt=16, max_new=40 + (i * 37) % 200, domain=domain)
            loop.alphas[row.request_id] = 0.9 if domain == "code" else 0.1
            loop.true_lengths[row.request_id] = 30 if domain == "code" else 10_000
            loop.add(row)
        loop.run()
        return sum(r.finished_s - r.arrival_s for r in loop.finished) / len(loop.finished)

    assert mean_completion(order) < 0.9 * mean_completion("fcfs")


ORDER_METHODS = ("key", "class_of", "class_scale", "priority", "should_preempt", "pick_victim")


def plan_work(name: str, num_waiting: int) -> Counter[str]:
    """The work 20 plans do with num_waiting rows waiting, counted on the real objects: calls into
    the order policy, heap operations of the waiting queue, entries its heaps hand out to Python
    code (any scan of the queue), and distinct rows whose state is read."""
    work: Counter[str] = Counter()
    rows_read: set[int] = set()

    class ReadTracedRow(Row):
        def __getattribute__(self, attribute: str):
            rows_read.add(id(self))
            return super().__getattribute__(attribute)

    class ScanCountedHeap(list):
        def __iter__(self):
            for entry in super().__iter__():
                work["entries_scanned"] += 1
                yield entry

    def counted(kind: str, function):
        def call(*args, **kwargs):
            work[kind] += 1
            return function(*args, **kwargs)
        return call

    scheduler = make_scheduler(name, max_rows=8)
    for i in range(num_waiting):
        row = make_row(f"r{i}", num_prompt=4, max_new=1 + i % 50, domain="ab"[i % 2])
        row.__class__ = ReadTracedRow
        scheduler.add(row)
    queue = scheduler.waiting
    queue._heaps = {cls: ScanCountedHeap(heap) for cls, heap in queue._heaps.items()}
    queue._by_arrival = ScanCountedHeap(queue._by_arrival)
    heap_ops = {op: counted("heap_ops", getattr(heapq, op)) for op in heapq.__all__}
    with pytest.MonkeyPatch.context() as patch:
        for method in ORDER_METHODS:
            patch.setattr(scheduler.order, method, counted("order_calls", getattr(scheduler.order, method)))
        patch.setattr(queues, "heapq", SimpleNamespace(**heap_ops))
        rows_read.clear()
        for round_index in range(20):
            scheduler.plan(float(round_index))
    work["rows_read"] = len(rows_read)
    return work


@pytest.mark.parametrize("name", ["fcfs", "sjf", "laps-sd", "specbatch"])
def test_waiting_queue_work_does_not_grow_with_its_length(name):
    """50k waiting rows: a round's plan does about the work it does with 500 (no O(waiting) work).
    Counted, not timed (wall-clock ratios fail on a loaded machine): O(log n) heap work could at
    most double from 500 to 50k rows, one pass over the queue would multiply some count by 100.
    Plan times: benchmarks/timing_bench.py."""
    small, large = plan_work(name, 500), plan_work(name, 50_000)
    assert small["order_calls"] > 0 and small["rows_read"] > 0
    for kind in ("order_calls", "heap_ops", "entries_scanned", "rows_read"):
        assert large[kind] <= 2 * small[kind] + 8, (kind, small, large)


def test_make_order_rejects_unknown_names():
    with pytest.raises(ValueError, match="not available"):
        make_order("lifo")
