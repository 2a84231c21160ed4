"""A GGUF file's structure checked without torch, transformers or reading its tensors: every count,
length and offset its header declares must fit in the file.

transformers' GGUF reader trusts the header: a tensor count of 2^63 - 1, a key count of 2^62 or a key
length of 2^60 makes it loop, allocate or fail in ways no caller can tell from a bug (an internal
failure, after Prefect and a worker started). Walking the header with those bounds costs a
memory-mapped pass over the metadata only (a tokenizer's ~50k strings: tens of milliseconds); a
file that fails it is refused in a second with one line (`ModelLoadError`, exit 2).

The layout (ggml's docs/gguf.md, versions 2 and 3): magic `GGUF`, uint32 version, uint64 tensor count,
uint64 metadata count; each metadata entry a string key, a uint32 value type and the value (an array:
uint32 item type, uint64 count, items); each tensor a string name, uint32 dimension count, uint64
dimensions, uint32 ggml type, uint64 offset into the data section, which starts at the next multiple
of `general.alignment` (32 by default). Strings are a uint64 length and that many bytes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 1 << 16  # keys and tensor names are short; 64 KiB is far past any real one
MAX_ARRAY_DEPTH = 2
DEFAULT_ALIGNMENT = 32
_ARRAY, _STRING = 9, 8
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_MIN_ENTRY_BYTES = 8 + 1 + 4 + 1  # a metadata entry: key length, one key byte, type, the smallest value
_MIN_TENSOR_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # a tensor: name length, one name byte, dims count, one dim, type, offset


class GGUFHeaderError(ValueError):
    """The header declares something the file cannot hold; the message says what and where."""


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    num_tensors: int
    num_metadata: int
    architecture: str | None  # `general.architecture`


def read_header(path: Path) -> GGUFHeader:
    """The checked header of `path`; `GGUFHeaderError` if it is not a whole GGUF file."""
    stat = path.stat()
    return _read_header(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _read_header(path: str, inode: int, size: int, mtime_ns: int) -> GGUFHeader:
    """Memoized by the file's identity and change stamp: a process checks a model several times."""
    if size < 24:
        raise GGUFHeaderError(f"{size} bytes is shorter than a GGUF header")
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Walker(data, size).walk()


class _Walker:
    """A cursor over the mapped file that refuses any read past its end."""

    def __init__(self, data: mmap.mmap, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    def _need(self, num_bytes: int, what: str) -> None:
        if num_bytes < 0 or self.at + num_bytes > self.size:
            raise GGUFHeaderError(f"{what} at byte {self.at} needs {num_bytes} bytes, the file has "
                                  f"{self.size - self.at} left")

    def _unpack(self, fmt: str, what: str) -> int:
        self._need(struct.calcsize(fmt), what)
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def _string(self, what: str, max_bytes: int | None = None) -> bytes:
        length = self._unpack("<Q", f"{what}'s length")
        if max_bytes is not None and length > max_bytes:
            raise GGUFHeaderError(f"{what} at byte {self.at - 8} declares {length} bytes (at most {max_bytes})")
        self._need(length, what)
        self.at += length
        return bytes(self.data[self.at - length: self.at])

    def _skip_value(self, value_type: int, what: str, depth: int = 0) -> None:
        if value_type in _FIXED_SIZES:
            self._need(_FIXED_SIZES[value_type], what)
            self.at += _FIXED_SIZES[value_type]
        elif value_type == _STRING:
            length = self._unpack("<Q", f"{what}'s length")
            self._need(length, what)
            self.at += length
        elif value_type == _ARRAY and depth < MAX_ARRAY_DEPTH:
            item_type = self._unpack("<I", f"{what}'s item type")
            count = self._unpack("<Q", f"{what}'s count")
            item_bytes = _FIXED_SIZES.get(item_type, 8 if item_type in (_STRING, _ARRAY) else 0)
            if item_bytes == 0:
                raise GGUFHeaderError(f"{what} has an unknown item type {item_type}")
            self._need(count * item_bytes, f"{what} ({count} items)")
            if item_type in _FIXED_SIZES:
                self.at += count * item_bytes
            else:
                for _ in range(count):
                    self._skip_value(item_type, what, depth + 1)
        else:
            raise GGUFHeaderError(f"{what} has an unknown value type {value_type}")

    def walk(self) -> GGUFHeader:
        if bytes(self.data[:4]) != MAGIC:
            raise GGUFHeaderError(f"it does not start with {MAGIC!r}")
        self.at = 4
        version = self._unpack("<I", "the version")
        if version not in VERSIONS:
            raise GGUFHeaderError(f"version {version} is not one of {VERSIONS}")
        num_tensors = self._unpack("<Q", "the tensor count")
        num_metadata = self._unpack("<Q", "the metadata count")
        room = self.size - self.at
        if num_tensors * _MIN_TENSOR_BYTES + num_metadata * _MIN_ENTRY_BYTES > room:
            raise GGUFHeaderError(f"it declares {num_tensors} tensors and {num_metadata} metadata entries, "
                                  f"more than its {self.size} bytes can hold")
        architecture, alignment = self._metadata(num_metadata)
        tensors = [self._tensor(index) for index in range(num_tensors)]
        data_start = -(-self.at // alignment) * alignment
        self._check_data(tensors, data_start, alignment)
        return GGUFHeader(version, num_tensors, num_metadata, architecture)

    def _metadata(self, count: int) -> tuple[str | None, int]:
        """Walk the metadata; returns `general.architecture` and `general.alignment`."""
        architecture, alignment = None, DEFAULT_ALIGNMENT
        for index in range(count):
            key = self._string(f"metadata key {index}", MAX_NAME_BYTES).decode("utf-8", "replace")
            value_type = self._unpack("<I", f"metadata {key!r}'s type")
            start = self.at
            self._skip_value(value_type, f"metadata {key!r}")
            if key == "general.architecture" and value_type == _STRING:
                architecture = bytes(self.data[start + 8: self.at]).decode("utf-8", "replace")
            elif key == "general.alignment" and value_type == 4:
                (alignment,) = struct.unpack_from("<I", self.data, start)
                if alignment == 0 or alignment & (alignment - 1):
                    raise GGUFHeaderError(f"general.alignment {alignment} is not a power of two")
        return architecture, alignment

    def _tensor(self, index: int) -> tuple[str, list[int], int, int]:
        name = self._string(f"tensor {index}'s name", MAX_NAME_BYTES).decode("utf-8", "replace")
        num_dims = self._unpack("<I", f"tensor {name!r}'s dimension count")
        if not 1 <= num_dims <= MAX_DIMS:
            raise GGUFHeaderError(f"tensor {name!r} has {num_dims} dimensions (1 to {MAX_DIMS})")
        dims = [self._unpack("<Q", f"tensor {name!r}'s dimensions") for _ in range(num_dims)]
        ggml_type = self._unpack("<I", f"tensor {name!r}'s type")
        offset = self._unpack("<Q", f"tensor {name!r}'s offset")
        return name, dims, ggml_type, offset

    def _check_data(self, tensors: list[tuple[str, list[int], int, int]], data_start: int, alignment: int) -> None:
        """Every tensor's bytes lie inside the file (its ggml type's block size from the gguf package)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        for name, dims, ggml_type, offset in tensors:
            try:
                block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError):
                raise GGUFHeaderError(f"tensor {name!r} has an unknown ggml type {ggml_type}") from None
            num_values = 1
            for dim in dims:
                num_values *= dim
            if dims[0] % block or offset % alignment:
                raise GGUFHeaderError(f"tensor {name!r} ({dims}, type {ggml_type}, offset {offset}) does not fit "
                                      f"its blocks of {block} or the alignment {alignment}")
            end = data_start + offset + num_values // block * type_bytes
            if end > self.size:
                raise GGUFHeaderError(f"tensor {name!r} ({dims}) ends at byte {end}, past the file's {self.size}")
