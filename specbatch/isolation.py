"""Whose fault an error is, and the halves of a round plan that find the request behind it.

A backend never writes a row, so a plan whose execute raised can run again, whole or in parts:
`Engine.step` re-executes it in halves until the rows that fail run alone, and drops those as
`failed`. An error that is not one request's fault (memory, a dead device, the file system, an
interrupt) ends the worker instead, and so does a run of failures with no success between them:
then the engine, not a record, is broken, and `failed` rows would never be run again on resume.
"""

from __future__ import annotations

from specbatch.core import RoundPlan, Row

MAX_FAILED_IN_A_ROW = 16  # requests failing alone, no plan succeeding between them
MAX_MESSAGE_CHARS = 1000  # an error's message can hold a whole tensor
# A device after these is unusable (a CUDA error poisons its context), whichever request triggered it.
_DEVICE_FAILURES = ("out of memory", "can't allocate memory", "cuda error", "device-side assert",
                    "illegal memory access", "cublas", "cudnn", "nccl", "hip error", "ecc error")


def is_request_fault(error: BaseException) -> bool:
    """Whether serving one request raised this, so dropping it lets the others go on. Only
    `Exception`s count (never KeyboardInterrupt / SystemExit), and none of memory, OS or device."""
    if not isinstance(error, Exception) or isinstance(error, (MemoryError, OSError)):
        return False
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__):  # torch's, without torch
        return False
    message = str(error).lower()
    return not any(marker in message for marker in _DEVICE_FAILURES)


def failure_message(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:MAX_MESSAGE_CHARS]


def plan_rows(plan: RoundPlan) -> list[Row]:
    """The plan's distinct rows, in order: a row may prefill and verify in the same round."""
    rows = {id(row): row for row, _ in plan.prefill}
    rows.update((id(row), row) for row, _ in plan.decode)
    return list(rows.values())


def split_plan(plan: RoundPlan) -> tuple[RoundPlan, RoundPlan]:
    """Two plans of half the rows each, every row with all its work; the first keeps `plan_ms`."""
    rows = plan_rows(plan)
    middle = len(rows) // 2
    return _sub_plan(plan, rows[:middle], first=True), _sub_plan(plan, rows[middle:], first=False)


def _sub_plan(plan: RoundPlan, rows: list[Row], first: bool) -> RoundPlan:
    """The plan's work for `rows`; the first half keeps `plan_ms` and the round's reused-token count."""
    wanted = {id(row) for row in rows}
    probe = plan.probe if id(plan.probe) in wanted else None
    return RoundPlan([item for item in plan.prefill if id(item[0]) in wanted],
                     [item for item in plan.decode if id(item[0]) in wanted], plan.plan_ms if first else 0.0,
                     plan.draft_prefill, probe,
                     plan.num_reused_tokens if first else 0)
