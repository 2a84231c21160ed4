"""`models.dtype: auto` (`engine/dtype_choice.py`): bfloat16 only where the CPU has it and its measured
GEMM peak is well above float32's; made concrete in the manifest when a job is created, and a resume
keeps the recorded dtype whatever this machine would pick now (the dtype changes outputs)."""

from __future__ import annotations

import pytest
import torch
from job_helpers import write_jsonl

from specbatch.config import load_config
from specbatch.engine import dtype_choice
from specbatch.engine.gemm_peak import GemmPeak
from specbatch.job.manifest import load_manifest
from specbatch.job.prepare import prepare


def fake_machine(monkeypatch, bf16_supported: bool, bf16_gflops: float, fp32_gflops: float = 300.0) -> None:
    peaks = {torch.bfloat16: bf16_gflops, torch.float32: fp32_gflops}
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: bf16_supported)
    monkeypatch.setattr(dtype_choice, "gemm_peak", lambda dtype, device: GemmPeak(peaks[dtype], dtype, 2048, True))
    dtype_choice._fastest.cache_clear()


@pytest.fixture(autouse=True)
def _forget_choice():
    yield
    dtype_choice._fastest.cache_clear()


@pytest.mark.parametrize(("supported", "bf16_gflops", "expected"), [
    (True, 2000.0, "bfloat16"),  # AMX: several times float32
    (True, 320.0, "float32"),  # has the instructions, but not faster
    (False, 2000.0, "float32"),  # no bfloat16 instructions: never picked
])
def test_auto_picks_bfloat16_only_where_it_measures_faster(monkeypatch, supported, bf16_gflops, expected):
    fake_machine(monkeypatch, supported, bf16_gflops)
    assert dtype_choice.concrete_dtype("auto", "cpu") == expected
    assert dtype_choice.concrete_dtype("float64", "cpu") == "float64"


def test_a_job_records_the_concrete_dtype_and_a_resume_keeps_it(monkeypatch, tmp_path):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "def add(a, b):", "max_new_tokens": 2}])
    fake_machine(monkeypatch, True, 2000.0)
    prepare(dataset, tmp_path / "j", load_config(None, ["models.dtype=auto"]))
    assert load_manifest(tmp_path / "j").config["models"]["dtype"] == "bfloat16"
    fake_machine(monkeypatch, False, 0.0)  # resumed where auto would pick float32
    prepare(dataset, tmp_path / "j", load_config(None, ["models.dtype=auto"]))
    manifest = load_manifest(tmp_path / "j")
    assert manifest.config["models"]["dtype"] == "bfloat16"
