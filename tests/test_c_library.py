"""The C kernel builder (`engine/c_library.py`): a library is rebuilt when a header beside its source
changes, not only when the source does (the kernels share `kernels/bfloat16.h`)."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from specbatch.engine import c_library
from specbatch.engine.gguf_models import CACHE_ENV

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="no C compiler here")


def test_a_changed_header_rebuilds_the_library(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    source, header = tmp_path / "value.c", tmp_path / "value.h"
    source.write_text('#include "value.h"\nvoid value(int *out) { *out = VALUE; }\n')
    seen = []
    for value in (1, 2):
        header.write_text(f"#define VALUE {value}\n")
        library = c_library.build(source, ["-O1", "-fPIC"])
        assert library is not None
        out = ctypes.c_int()
        library.value(ctypes.byref(out))
        seen.append(out.value)
    assert seen == [1, 2]
