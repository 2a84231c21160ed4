"""The C kernel builder (`engine/c_library.py`): a library is rebuilt when a header beside its source
changes, not only when the source does (the kernels share `kernels/bfloat16.h`); what was timed through
the kernels is keyed by their sources."""

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


def test_the_sources_digest_follows_every_kernel_source_and_header(tmp_path, monkeypatch):
    for source in c_library.SOURCES.iterdir():
        shutil.copy(source, tmp_path)
    monkeypatch.setattr(c_library, "SOURCES", tmp_path)
    digests = [c_library.sources_digest()]
    (tmp_path / "notes.txt").write_text("not a source")
    digests.append(c_library.sources_digest())
    for name in ("paged_attention.c", "bfloat16.h"):
        with open(tmp_path / name, "a") as source:
            source.write("/* changed */\n")
        digests.append(c_library.sources_digest())
    assert digests[0] == digests[1] and len(set(digests)) == 3
