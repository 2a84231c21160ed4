"""Queue lab: the fluid backlog numbers of seed 000 and its JSON contract."""

from __future__ import annotations

import json

import pytest

from specbatch.lab.queue_lab import FluidBacklog, format_queue_lab, queue_lab_report

KEYS = {"model", "arrival", "service", "initial_backlog", "rate_of_change", "drain_time_s", "series"}


def test_overloaded_backlog_grows_one_unit_per_second() -> None:
    report = queue_lab_report(arrival=4, service=3, backlog=4)
    assert set(report) == KEYS
    assert report["rate_of_change"] == 1
    assert report["drain_time_s"] is None
    series = {p["t"]: p["backlog"] for p in report["series"]}
    assert series[0.0] == 4 and series[1.0] == 5 and series[4.0] == 8
    values = list(series.values())
    assert all(b - a == pytest.approx(1.0) for a, b in zip(values, values[1:], strict=False))


def test_underloaded_backlog_drains_in_four_seconds() -> None:
    report = queue_lab_report(arrival=4, service=5, backlog=4)
    assert report["rate_of_change"] == -1
    assert report["drain_time_s"] == 4
    series = {p["t"]: p["backlog"] for p in report["series"]}
    assert series[0.0] == 4 and series[2.0] == 2 and series[4.0] == 0 and series[8.0] == 0


def test_json_round_trip_with_null_drain_and_label() -> None:
    text = json.dumps(queue_lab_report(4, 3, 4))
    assert '"drain_time_s": null' in text
    label = json.loads(text)["model"]
    assert "fluid" in label and "no batches" in label and "priorities" in label and "random arrivals" in label


def test_edge_cases() -> None:
    assert FluidBacklog(3, 5, 0).drain_time_s == 0.0
    assert FluidBacklog(3, 5, 0).rate_of_change == 0.0  # an empty, fast-enough queue stays empty
    assert FluidBacklog(4, 4, 0).drain_time_s == 0.0
    assert FluidBacklog(4, 4, 2).drain_time_s is None  # balanced: the backlog never moves
    assert FluidBacklog(5, 3, 0).drain_time_s is None and FluidBacklog(5, 3, 0).rate_of_change == 2
    drain = FluidBacklog(1, 4, 1).drain_time_s
    assert drain == pytest.approx(1 / 3)
    assert drain in [t for t, _ in FluidBacklog(1, 4, 1).series(step_s=0.25)]  # the kink is shown


@pytest.mark.parametrize(
    ("arrival", "service", "backlog"), [(-1, 3, 4), (4, -3, 4), (4, 3, -4), (float("nan"), 3, 4)]
)
def test_negative_or_nan_inputs_rejected(arrival: float, service: float, backlog: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        queue_lab_report(arrival, service, backlog)


def test_series_limits_and_text() -> None:
    with pytest.raises(ValueError):
        FluidBacklog(4, 3, 4).series(horizon_s=10, step_s=0)
    with pytest.raises(ValueError):
        FluidBacklog(4, 3, 4).series(horizon_s=1e9, step_s=1)
    text = format_queue_lab(queue_lab_report(4, 5, 4))
    assert "drains in 4 s" in text and "fluid model" in text
