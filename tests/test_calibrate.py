"""`specbatch calibrate`: the round-time model fitted on a job's ledger, scaled to the job's time."""

from __future__ import annotations

import dataclasses

import pytest
from test_ledger import _request, _result, _round, _step

from specbatch import ledger
from specbatch.lab.calibrate import calibrate


def _job_with_rounds(job_dir, rounds_ms_by_rows: list[tuple[int, float]]) -> None:
    writer = ledger.PartWriter(job_dir, worker_id=0, run_id="r1", durable=False)
    for index, (rows, round_ms) in enumerate(rounds_ms_by_rows):
        writer.add_round(dataclasses.replace(_round(index), num_target_rows=rows, num_padded_target_rows=0,
                                             round_ms=round_ms))
    writer.add_step(_step("a"))
    writer.add_request(_request("a"))
    writer.add_result(_result("a"))
    writer.flush()


def test_a_cold_first_round_does_not_scale_the_calibrated_model(tmp_path):
    """A job's first round of 400 ms (kernels loaded, caches cold) beside 0.6 ms decoding rounds:
    the fit leaves it out as an outlier, and the scale to the job's total time must too; counted,
    it scaled every coefficient by 8.8 and the model's error from 30% to 597%."""
    decoding = [(1 + i % 4, 0.5 + 0.05 * (1 + i % 4)) for i in range(60)]  # 0.5 ms + 0.05 ms a row
    _job_with_rounds(tmp_path / "j", [(1, 400.0), *decoding])
    model = calibrate(tmp_path / "j")
    predicted = model.predict_rounds(ledger.read_table(tmp_path / "j", "rounds"))
    assert list(predicted[1:]) == pytest.approx([round_ms for _, round_ms in decoding], rel=0.02)
