"""GGUF model files as ordinary Hugging Face directories: converted once, cached, then loaded as any.

The engine, its checks and the vLLM peer all read a HF directory (config.json, safetensors,
tokenizer files). transformers reads a GGUF (llama.cpp's format) only by dequantizing it on every
load, and its tokenizer is rebuilt from the file's `tokenizer.ggml.*` metadata. So the first use
converts the file into `$SPECBATCH_CACHE_DIR/gguf/<sha256[:16]>/` (default `~/.cache/specbatch`),
keyed by the file's bytes, and every later load (each worker, resumes, other jobs) reads that
folder, in the job's `models.dtype` as for any checkpoint. Weights are saved in float32: the
dequantization computes in float32, so nothing is rounded before the job's dtype is applied.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from specbatch.engine.gguf_header import GGUFHeaderError, read_header
from specbatch.engine.model_paths import ModelLoadError, gguf_file, resolve_dir, resolve_model_path
from specbatch.storage import fsync_dir, fsync_path

log = logging.getLogger(__name__)

CACHE_ENV = "SPECBATCH_CACHE_DIR"
_CHUNK_BYTES = 1 << 20
_MAX_SNAPSHOTS = 4  # reads of a file that keeps changing before giving up


def model_dir(name: str, need_config: bool = True) -> Path:
    """The local HF directory the engine loads `name` from: a GGUF's converted folder (made on first
    use), else the directory named, checked for a config.json unless `need_config` is off (a
    tokenizer's folder needs none)."""
    if (file := gguf_file(name)) is not None:
        return converted_dir(file)
    return resolve_model_path(name) if need_config else resolve_dir(name)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specbatch").expanduser()


def is_converted(file: Path) -> bool:
    """Whether `file`'s bytes have a cached folder already (a load then converts nothing)."""
    return (cache_root() / "gguf" / file_sha256(file)[:16]).is_dir()


def converted_dir(file: Path) -> Path:
    """`file`'s cached HF folder, converted first if no process has.

    The folder is named by the hash of the bytes converted, not of the file as it was first read: under
    the lock of that hash, the file is copied into a private snapshot while it is hashed again (one
    read), and only a snapshot with the same hash is converted. A file that changes in between (a copy
    still landing, a model replaced as a job starts) is hashed and locked again under its new hash,
    so no folder ever holds other weights than its name says. The lock makes workers starting
    together convert once; the conversion goes into a temporary folder renamed into place, so a
    killed one leaves nothing a later load would take for a model."""
    root = cache_root() / "gguf"
    name = file_sha256(file)[:16]
    for _ in range(_MAX_SNAPSHOTS):
        folder = root / name
        if folder.is_dir():
            return folder
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f"{name}.lock"):
            if folder.is_dir():
                return folder
            for stale in root.glob(f".{name}.*"):  # a killed conversion's; none runs (we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            snapshot = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}.")) / "model.gguf"
            try:
                digest = _copy_hashing(file, snapshot)[:16]
                if digest == name:
                    _convert_into(snapshot, folder, shown=file)
                    return folder
            finally:
                shutil.rmtree(snapshot.parent, ignore_errors=True)
        log.warning("%s changed while it was read (hash %s, then %s); reading it again", file, name, digest)
        name = digest
    raise ModelLoadError(f"GGUF file {file} kept changing while it was read; wait until it is complete")


def _copy_hashing(file: Path, snapshot: Path) -> str:
    """Copy `file` to `snapshot` and return the sha256 of exactly the bytes copied."""
    digest = hashlib.sha256()
    with open(file, "rb", buffering=0) as source, open(snapshot, "wb") as copy:
        while chunk := source.read(_CHUNK_BYTES):
            digest.update(chunk)
            copy.write(chunk)
    return digest.hexdigest()


def _convert_into(file: Path, folder: Path, shown: Path) -> None:
    log.info("converting %s into a Hugging Face folder %s (once per file)", shown, folder)
    work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        convert_gguf(file, work, shown)
        for written in work.iterdir():
            fsync_path(written)
        work.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    fsync_dir(folder.parent)


def convert_gguf(file: Path, out: Path, shown: Path | None = None) -> None:
    """Dequantize `file` into a HF folder `out`: config, float32 safetensors, tokenizer. `shown`: the
    path messages name (the user's file, where `file` is its snapshot)."""
    hf_logging.disable_progress_bar()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            file.parent, gguf_file=file.name, dtype=torch.float32, **_dequantizing())
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except Exception as error:  # whatever the reader raises on a file it cannot load is the file's fault
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ModelLoadError(f"GGUF file {shown or file} (architecture {gguf_architecture(file)!r}) cannot be "
                             f"loaded by transformers {transformers.__version__}: {message}") from error
    _plain_copy(loaded).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _dequantizing() -> dict[str, Any]:
    """What makes `from_pretrained` unpack every block: releases with `GgufConfig` may keep them packed
    for a matmul kernel; earlier 5.x releases always unpack."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _plain_copy(loaded: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model transformers will save: it refuses one it marks as quantized."""
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ModelLoadError(f"GGUF weights do not fit {type(model).__name__}: missing {sorted(set(missing) - tied)}, "
                             f"unexpected {sorted(unexpected)}")
    model.generation_config = loaded.generation_config
    return model


def gguf_architecture(file: Path) -> str:
    """The file's `general.architecture` (llama.cpp's name), or '?' if it cannot be read."""
    try:
        return read_header(file).architecture or "?"
    except (OSError, GGUFHeaderError):
        return "?"


def file_sha256(file: Path) -> str:
    stat = file.stat()
    return _sha256(str(file.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _sha256(path: str, inode: int, size: int, mtime_ns: int) -> str:
    """Memoized by the file's identity and change stamp: a process resolves a model several times
    (config, weights, tokenizer), and a multi-GB file takes seconds to hash."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between processes, released when the file closes, even by `kill -9`. The
    holder removes the file as it lets go (converted or failed, no lock file stays in the cache); a
    waiter that then holds the lock of a removed file opens the path again."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed by the holder we waited for: lock the path's new file
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # still locked: nobody holds the path's file until it is gone
        os.close(fd)

