"""The streamed GEMM's row bound (`engine/panel_rows.py`): measured once per machine and dtype, then read
back (the measurement is replaced by a counter where the caching is what is checked), and the host
key that tells machines apart (`engine/host.py`)."""

from __future__ import annotations

import math

import pytest
import torch

from specbatch.engine import host
from specbatch.engine import panel_rows as module
from specbatch.engine.panel_rows import ROWS, measure_panel_rows, panel_rows
from specbatch.engine.streamed_gemm import load

pytestmark = pytest.mark.skipif(load() is None, reason="no C compiler here")


@pytest.fixture
def counted(monkeypatch):
    measured = []
    bounds = iter([math.inf, 64])

    def measure(dtype: torch.dtype) -> float:
        measured.append(dtype)
        return next(bounds)

    monkeypatch.setattr(module, "measure_panel_rows", measure)
    panel_rows.cache_clear()
    yield measured
    panel_rows.cache_clear()


def test_a_bound_is_measured_once_per_dtype_and_then_read_back(tmp_path, counted):
    assert panel_rows(torch.float32, tmp_path) == math.inf  # no bound: stored as such, read back as such
    panel_rows.cache_clear()  # a new process
    assert panel_rows(torch.float32, tmp_path) == math.inf
    if module.Panels.packs(torch.empty(0, 2, dtype=torch.bfloat16)):
        assert panel_rows(torch.bfloat16, tmp_path) == 64
        assert counted == [torch.float32, torch.bfloat16]
    else:
        assert counted == [torch.float32]


def test_an_unreadable_entry_is_measured_again(tmp_path, counted):
    panel_rows(torch.float32, tmp_path)
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    panel_rows.cache_clear()
    assert panel_rows(torch.float32, tmp_path) == 64 and len(counted) == 2


def test_a_cache_that_cannot_be_written_still_gives_the_measured_bound(tmp_path, counted):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder would go
    assert panel_rows(torch.float32, blocked / "gemm") == math.inf and len(counted) == 1


def test_a_dtype_the_panels_do_not_take_streams_no_rows(tmp_path, counted):
    assert panel_rows(torch.float64, tmp_path) == 0 and counted == []


def test_a_measured_bound_is_a_row_count_tried_or_none():
    assert measure_panel_rows(torch.float32) in {0, math.inf, *ROWS}


def test_machines_that_differ_only_in_their_processor_have_different_keys(tmp_path, monkeypatch):
    keys = []
    for name in ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+"):
        cpuinfo = tmp_path / name.split()[0]
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: x\nmodel name\t: {name}\nflags\t\t: fpu\n")
        monkeypatch.setattr(host, "CPUINFO", cpuinfo)
        host.cpu_name.cache_clear()
        keys.append(host.machine())
        assert name in keys[-1]
    host.cpu_name.cache_clear()
    assert keys[0] != keys[1]


def test_processors_of_one_model_name_but_another_family_have_different_keys(tmp_path, monkeypatch):
    """VMs on AMD EPYC Zen 4 and Zen 5 hosts both say `AMD EPYC`: a kernel built for one with
    -march=native, or a peak measured on it, must not be read back on the other."""
    keys = []
    for family, flags in (("25", "fpu avx512f"), ("26", "fpu avx512f avx_vnni")):
        cpuinfo = tmp_path / f"cpuinfo{family}"
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: {family}\nmodel\t\t: 2\n"
                           f"flags\t\t: {flags}\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n")
        monkeypatch.setattr(host, "CPUINFO", cpuinfo)
        host.cpu_name.cache_clear()
        keys.append(host.machine())
        assert f"AMD EPYC (family {family} model 2 flags " in keys[-1]
    host.cpu_name.cache_clear()
    assert keys[0] != keys[1]
