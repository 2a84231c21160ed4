"""Small C kernels built with the machine's compiler on first use, cached, and loaded with ctypes.

Plain C (no torch headers) builds in about a second. A library is built once per source (with the
headers beside it), compiler, flags and machine (`-march=native` code runs only where it was built,
so the machine is part of the name, for a shared home) into `$SPECBATCH_CACHE_DIR/kernels/`, and
renamed into place whole, so workers building at once never load half a file. Compile flags never
reach the link: linked with fast-math flags, gcc adds start-up code that sets flush-to-zero for the
whole process, which would change torch's arithmetic.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from specbatch.engine.gguf_models import cache_root
from specbatch.engine.host import machine

log = logging.getLogger(__name__)

LINK_FLAGS = ["-shared", "-fopenmp"]
SOURCES = Path(__file__).with_name("kernels")  # the engine's kernels and their shared headers


def cache_dir() -> Path:
    return cache_root() / "kernels"


def sources_digest() -> str:
    """A digest of every kernel source and header: what was timed through the kernels (a pass
    profile, the panels' row bound) is measured again when one of them changes."""
    digest = hashlib.sha256()
    for source in sorted(SOURCES.iterdir()):
        if source.suffix in {".c", ".h"}:
            digest.update(source.name.encode() + source.read_bytes())
    return digest.hexdigest()[:16]


def load(source: Path, flags: list[str], signatures: dict[str, list[Any]], switch: str) -> ctypes.CDLL | None:
    """`source` built (`build`) with its functions' argument types set (each returns nothing), or None
    where it cannot be built here or the environment variable `switch` is "0" (torch runs instead)."""
    if os.environ.get(switch, "1") == "0":
        return None
    library = build(source, flags)
    if library is None:
        return None
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None
    return library


def build(source: Path, flags: list[str]) -> ctypes.CDLL | None:
    """`source` compiled with `flags` and linked as a shared library, or None where no compiler works
    here (logged: the caller falls back to torch)."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        log.info("no C compiler: %s is not built, torch runs instead", source.name)
        return None
    headers = b"".join(header.read_bytes() for header in sorted(source.parent.glob("*.h")))  # what it may include
    built_for = " ".join([compiler, *flags, *LINK_FLAGS, machine()])
    digest = hashlib.sha256(source.read_bytes() + headers + built_for.encode()).hexdigest()[:16]
    library = cache_dir() / f"{source.stem}-{digest}.so"
    try:
        if not library.exists():
            library.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
                built, compiled = Path(scratch) / library.name, Path(scratch) / f"{source.stem}.o"
                subprocess.run([compiler, *flags, "-c", "-o", str(compiled), str(source)], check=True,
                               capture_output=True, timeout=120)
                subprocess.run([compiler, *LINK_FLAGS, "-o", str(built), str(compiled), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, library)  # atomic: workers building at once each rename a whole file
        return ctypes.CDLL(str(library))
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("%s did not build (%s): torch runs instead", source.name, error)
        return None
