"""Readers for each input format: they turn a dataset into a stream of `RawRecord`s.

A reader never judges a record's content (that is `specbatch.data.validate`); it only reports what
it could not read at all (bytes that are not UTF-8, text that is not JSON, a line too large to hold)
as a `RawRecord` with a drop reason, so every input record still yields exactly one row downstream.

Everything that makes the *whole* dataset unusable (no such path, unknown format, a mapped column
that does not exist) raises `DatasetError` from `resolve_dataset`, before any work is done.

A dataset may also be a URL on an object store (`s3://bucket/prompts.jsonl`, any fsspec file
system): JSON Lines, OpenAI batch files and Parquet are streamed from it the same way.

Memory does not grow with the dataset: JSONL is read line by line (a line is read with a size limit,
so even a gigabyte without a newline is skipped in bounded chunks), Parquet, CSV and Hugging Face
datasets in record batches.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path, PurePosixPath
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from specbatch.data.csv_rows import csv_column_names, csv_rows, number_columns
from specbatch.storage import input_exists, is_url, open_input

FIELDS = ("id", "prompt", "messages", "max_new_tokens", "temperature", "top_p", "seed", "stop", "domain",
          "response_format", "json_schema", "regex", "choice", "grammar")  # the last five: data/constraints.py
FORMATS = ("jsonl", "openai_batch", "parquet", "hf_saved", "hf:<builder>")
BATCH_ROWS = 4096  # rows per Arrow batch read from Parquet / HF datasets
MAX_RECORD_BYTES = 10 * 1024 * 1024
_PEEK_LINES = 1000  # lines read to find the first JSON object when detecting OpenAI batch files
_HF_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_URL_FORMATS = ("jsonl", "openai_batch", "parquet")  # streamed from an object store
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


class DatasetError(ValueError):
    """A dataset the job cannot read at all; the CLI prints it and exits with code 2."""


@dataclass(slots=True)
class RawRecord:
    """One input record as read: a parsed value, or why it could not be read.

    `position` is the record's 0-based index in the input: the line index for JSONL (blank lines
    keep their index but yield no record), the row index for Parquet and HF datasets.
    """

    position: int
    value: Any = None
    drop_reason: str | None = None
    drop_message: str | None = None


@dataclass(frozen=True)
class DatasetSource:
    """A dataset path with its resolved format and column mapping (our field -> source column)."""

    path: Path | str  # a str only for a URL
    format: str
    column_map: dict[str, str] = field(default_factory=dict)


def resolve_dataset(
    path: str | Path, dataset_format: str | None = None, column_map: dict[str, str] | None = None
) -> DatasetSource:
    """Check that the dataset can be read and settle its format; raise `DatasetError` otherwise."""
    if is_url(path):
        return _resolve_url(str(path), dataset_format, column_map)
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset not found: {path}")
    if not (path.is_file() or path.is_dir()):  # reading a FIFO waits for a writer; a device never ends
        raise DatasetError(f"dataset {path} is not a regular file or a folder (a FIFO, socket or device); "
                           "write it to a file first")
    fmt = detect_format(path) if dataset_format is None else dataset_format  # `--format ""` is unknown, not unsaid
    _check_format(path, fmt)
    mapping = _check_column_map(fmt, column_map or {})
    source = DatasetSource(path, fmt, mapping)
    if fmt in ("parquet", "hf_saved"):
        _check_columns(source, _table_columns(source))
    elif fmt == "hf:csv":
        for file in _local_files(source):
            _check_columns(source, _csv_header(file))
    elif fmt == "hf:parquet":
        _check_columns(source, _same_parquet_columns(_local_files(source)))
    elif fmt.startswith("hf:") and (first := next(_hf_rows(source), None)) is not None:
        _check_columns(source, list(first))
    return source


def _resolve_url(url: str, dataset_format: str | None, column_map: dict[str, str] | None) -> DatasetSource:
    try:
        found = input_exists(url)
    except Exception as error:  # no credentials, no such bucket, endpoint unreachable
        raise DatasetError(f"cannot reach dataset {url}: {error}") from error
    if not found:
        raise DatasetError(f"dataset not found: {url}")
    suffix = PurePosixPath(url).suffix.lower()
    fmt = dataset_format if dataset_format is not None else ("parquet" if suffix == ".parquet" else
                             _detect_json_lines(url) if suffix in _JSON_SUFFIXES else "")
    if fmt not in _URL_FORMATS:
        raise DatasetError(f"a dataset on an object store must be one of {', '.join(_URL_FORMATS)} "
                           f"({url}); copy other formats to a local path")
    source = DatasetSource(url, fmt, _check_column_map(fmt, column_map or {}))
    if fmt == "parquet":
        _check_parquet(url)
        _check_columns(source, _table_columns(source))
    elif dataset_format is not None:  # a format given: not yet checked by _detect_json_lines
        _check_json_lines_file(url)
    return source


def detect_format(path: Path) -> str:
    """Guess the format from the path: HF saved directory, a directory of Parquet files (as Spark,
    pandas or polars write a table), `.parquet`, or JSON Lines."""
    if path.is_dir():
        if any((path / marker).exists() for marker in _HF_SAVED_MARKERS):
            return "hf_saved"
        files = _data_file_paths(path)
        if files and all(file.suffix.lower() == ".parquet" for file in files):
            return "hf:parquet"
        raise DatasetError(
            f"{path} is a directory but not a saved Hugging Face dataset (no dataset_info.json or "
            "state.json) nor Parquet files; pass a file, or a format such as hf:json / hf:csv for data files"
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".csv":
        return "hf:csv"
    if suffix in _JSON_SUFFIXES:
        return _detect_json_lines(path)
    raise DatasetError(f"cannot tell the format of {path} from its name; choose one of {', '.join(FORMATS)}")


def iter_records(source: DatasetSource, max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[RawRecord]:
    """Stream the dataset's records in input order."""
    if source.format in ("jsonl", "openai_batch"):
        return iter_json_lines(source.path, max_record_bytes)
    if source.format in ("parquet", "hf:parquet"):  # hf:parquet, a folder's name from when datasets read it
        files = _local_files(source) if source.format == "hf:parquet" else [source.path]
        return _refusing_read_errors(_iter_parquet_files(files), f"{source.path} as Parquet",
                                     (OSError, pa.ArrowException))
    if source.format == "hf_saved":
        return _iter_table_rows(_hf_saved_batches(Path(source.path)))
    if source.format == "hf:csv":
        return _csv_records(source)
    return _iter_hf_files(source)


def iter_json_lines(path: Path | str, max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[RawRecord]:
    """One record per non-blank line; whitespace-only lines are skipped silently (no record)."""
    with _open_json_lines(path, max_record_bytes) as file:
        for position, line in enumerate(_lines(file, max_record_bytes)):
            if line is None:
                yield RawRecord(
                    position,
                    drop_reason="record_too_large",
                    drop_message=f"line is longer than {max_record_bytes} bytes",
                )
            elif line.strip():
                yield _parse_line(position, line)


def _lines(file: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """Lines as bytes; a line over `max_bytes` (newline excluded) is consumed in chunks -> None.

    A UTF-8 byte order mark (some editors write one) is dropped from the start of a line here, before
    anyone asks whether that line is blank: a file of a BOM and blank lines holds no record. Any line's,
    not only the first: files joined with `cat` carry one at the start of each, and a BOM is never JSON.
    """
    while line := file.readline(max_bytes + 1):
        line = line.removeprefix(_BOM)
        if len(line) <= max_bytes or line.endswith(b"\n"):
            yield line
            continue
        while (chunk := file.readline(1 << 20)) and not chunk.endswith(b"\n"):
            pass
        yield None


@contextmanager
def _open_json_lines(path: Path | str, max_bytes: int) -> Iterator[IO[bytes]]:
    """The file opened for `_lines`; one whose lines end in a bare CR (classic Mac OS) is read with each
    CR as a newline, which `readline` alone would give as one line of the whole file (one `invalid_json`
    row, or `record_too_large`). Splitting there is safe: JSON holds no raw CR inside a string."""
    with open_input(path) as file:
        cr_only = _ends_lines_with_cr(file, max_bytes)
        file.seek(0)
        yield io.BufferedReader(_CarriageReturnsAsNewlines(file), 1 << 20) if cr_only else file


def _ends_lines_with_cr(file: IO[bytes], max_bytes: int) -> bool:
    """Whether the file's first line break is a CR alone: its first line, read up to a newline in
    bounded chunks, holds a CR and no newline. A CRLF file's first line ends in a newline, so a stray
    CR inside a line of an LF or CRLF file changes nothing."""
    while (chunk := file.readline(max_bytes + 1)) and b"\r" not in chunk and not chunk.endswith(b"\n"):
        pass  # a first line past the limit without a CR yet: its end decides
    cr = chunk.find(b"\r")
    if cr < 0 or chunk.endswith(b"\n"):
        return False
    return cr < len(chunk) - 1 or file.read(1) != b"\n"  # a CRLF the size limit cut in two is not one


class _CarriageReturnsAsNewlines(io.RawIOBase):
    """A byte stream with each CR read as LF, for a file whose lines end in CR alone. A CR is never
    part of a longer UTF-8 sequence, so bytes that are not UTF-8 stay `invalid_utf8` as they were."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__()
        self._file = file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(len(buffer)).replace(b"\r", b"\n")
        buffer[: len(data)] = data
        return len(data)


def _parse_line(position: int, line: bytes) -> RawRecord:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        message = f"line is not valid UTF-8 (byte {error.start}: {error.reason})"
        return RawRecord(position, drop_reason="invalid_utf8", drop_message=message)
    try:
        return RawRecord(position, json.loads(text))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, int digit limit, deep nesting
        message = f"line is not valid JSON: {str(error)[:200]}"
        return RawRecord(position, drop_reason="invalid_json", drop_message=message)


_BOM = b"\xef\xbb\xbf"
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"),
               (b"\xfd7zXZ\x00", "xz"))


def _check_json_lines_bytes(path: Path | str, start: bytes) -> None:
    """Refuse a file whose first bytes show it is not UTF-8 text: read line by line, UTF-16 or UTF-32
    (a NUL byte beside each ASCII one, which UTF-8 JSON never holds) would give every line as
    `invalid_json`, and a line more than it has records; a compressed file, one row of garbage."""
    if start.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        raise DatasetError(f"{path} is UTF-32 encoded; convert it to UTF-8 JSON Lines")
    if start[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise DatasetError(f"{path} is UTF-16 encoded; convert it to UTF-8 JSON Lines")
    compressed = next((name for magic, name in _COMPRESSED if start.startswith(magic)), None)
    if compressed is not None:
        raise DatasetError(f"{path} is {compressed}-compressed; decompress it to JSON Lines first")
    if b"\x00" in start[:4]:
        raise DatasetError(f"{path} starts with NUL bytes: UTF-16 or UTF-32 without a byte order mark, or not "
                           "text; convert it to UTF-8 JSON Lines")


def _check_json_lines_file(path: Path | str) -> None:
    with open_input(path) as file:
        _check_json_lines_bytes(path, file.read(6))
    _check_first_record_line(path)


def _check_first_record_line(path: Path | str) -> None:
    """Refuse JSON written across lines (`json.dump(..., indent=2)`, `jq .` without `-c`): its first
    line that is not blank is an opening bracket alone, which no JSON Lines record is. Read line by
    line, every line of it would be an `invalid_json` row, and not one of its records would run."""
    with _open_json_lines(path, MAX_RECORD_BYTES) as file:
        first = next((line for line in _lines(file, MAX_RECORD_BYTES) if line is None or line.strip()), None)
    if first is not None and first.strip() in (b"{", b"["):
        raise DatasetError(f"{path} holds JSON spread over several lines (its first line is {first.strip().decode()!r} "
                           "alone), not JSON Lines; write one record per line (jq -c . for objects, jq -c '.[]' "
                           "for an array)")


def _detect_json_lines(path: Path | str) -> str:
    """`openai_batch` if the first JSON object has `custom_id` and `body`, else `jsonl`."""
    _check_json_lines_file(path)
    with _open_json_lines(path, MAX_RECORD_BYTES) as file:
        head = islice(_lines(file, MAX_RECORD_BYTES), _PEEK_LINES)
        lines = (line for line in head if line and line.strip())
        for index, line in enumerate(lines):
            if index == 0 and line.lstrip().startswith(b"[") and str(path).lower().endswith(".json"):
                raise DatasetError(f"{path} looks like a JSON array, not JSON Lines (one object per line)")
            value = _parse_line(index, line).value
            if isinstance(value, dict):
                return "openai_batch" if {"custom_id", "body"} <= value.keys() else "jsonl"
    return "jsonl"


def _check_format(path: Path, fmt: str) -> None:
    known = fmt in ("jsonl", "openai_batch", "parquet", "hf_saved") or (fmt.startswith("hf:") and fmt[3:])
    if not known:
        raise DatasetError(f"unknown dataset format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "hf_saved" and not path.is_dir():
        raise DatasetError(f"format hf_saved needs a directory written by save_to_disk, got {path}")
    if fmt in ("jsonl", "openai_batch", "parquet") and not path.is_file():
        raise DatasetError(f"format {fmt} needs a file, got {path}")
    if fmt == "parquet":
        _check_parquet(path)
    elif fmt in ("jsonl", "openai_batch"):  # a format given: not yet checked by _detect_json_lines
        _check_json_lines_file(path)


def _check_parquet(path: Path | str) -> None:
    try:
        with open_input(path) as file:
            pq.ParquetFile(file).close()
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{path} is not a readable Parquet file: {error}") from error


def _check_column_map(fmt: str, column_map: dict[str, str]) -> dict[str, str]:
    if not column_map:
        return {}
    if fmt == "openai_batch":
        raise DatasetError("a column mapping does not apply to OpenAI batch files")
    unknown = sorted(set(column_map) - set(FIELDS))
    if unknown:
        known = ", ".join(FIELDS)
        raise DatasetError(f"column mapping names unknown fields {unknown}; known fields: {known}")
    bad = [key for key, value in column_map.items() if not isinstance(value, str) or not value]
    if bad:
        raise DatasetError(f"column mapping for {bad} must name a source column")
    return dict(column_map)


def _check_columns(source: DatasetSource, columns: list[str]) -> None:
    """A mapped column that does not exist, or no prompt at all, is a whole-dataset mistake."""
    missing = sorted(src for src in source.column_map.values() if src not in columns)
    if missing:
        raise DatasetError(f"{source.path}: mapped columns {missing} not found; columns are {columns}")
    names = {key: source.column_map.get(key, key) for key in ("prompt", "messages")}
    if not any(src in columns for src in names.values()):
        raise DatasetError(
            f"{source.path} has no prompt column ({names['prompt']!r}) or messages column "
            f"({names['messages']!r}); columns are {columns}; map one with a column mapping"
        )


def _table_columns(source: DatasetSource) -> list[str]:
    if source.format == "parquet":
        return _parquet_columns(source.path)
    return list(_load_hf_saved(Path(source.path)).column_names)


def _parquet_columns(path: Path | str) -> list[str]:
    """The file's columns, without a pandas index."""
    with open_input(path) as file, pq.ParquetFile(file) as parquet:
        return [name for name in parquet.schema_arrow.names if not name.startswith("__index_level_")]


def _same_parquet_columns(files: list[Path]) -> list[str]:
    """The columns of a folder's Parquet files, which must all have the same ones."""
    for file in files:
        _check_parquet(file)
    first, *others = [(file, _parquet_columns(file)) for file in files]
    for file, columns in others:
        if set(columns) != set(first[1]):
            raise DatasetError(f"data files' columns differ: {first[0]} has {first[1]}, {file} has {columns}")
    return first[1]


def _iter_table_rows(batches: Iterator[pa.RecordBatch | pa.Table], position: int = 0) -> Iterator[RawRecord]:
    """Rows as records, the first at `position`."""
    for batch in batches:
        for row in batch.to_pylist():
            yield RawRecord(position, _nan_as_missing(row))
            position += 1


def _nan_as_missing(row: dict[str, Any]) -> dict[str, Any]:
    """A NaN cell is a missing value (pandas writes one for every missing number, an integer column's
    too), as a null cell is."""
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in row.items()}


def _iter_parquet_files(files: Sequence[Path | str]) -> Iterator[RawRecord]:
    """The files' rows in order, numbered on from one file to the next."""
    start = 0
    for file in files:
        start = yield from _iter_parquet_rows(file, start)


def _iter_parquet_rows(path: Path | str, start: int = 0) -> Generator[RawRecord, None, int]:
    """Each row group's rows in order, the first at `start`; returns the position after the last. A
    row group whose data cannot be read (a damaged page behind a sound footer, or one whose checksum
    fails) gives its rows not yet read as `unreadable_row_group` records, and the next group is read:
    the job runs the rest and accounts for every row, by its position in the dataset. An error of the
    stream, not the data (`_is_damage`), stops the read."""
    with open_input(path) as stream, pq.ParquetFile(stream, page_checksum_verification=True) as file:
        columns = [name for name in file.schema_arrow.names if not name.startswith("__index_level_")]  # no pandas index
        for group in range(file.num_row_groups):
            num_rows = file.metadata.row_group(group).num_rows
            batches = file.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns)
            num_read = 0
            try:
                for record in _iter_table_rows(batches, start):
                    yield record
                    num_read += 1
            except (OSError, pa.ArrowException) as error:
                if not _is_damage(error):
                    raise
                yield from _unreadable_rows(path, group, start, range(num_read, num_rows), error)
            start += num_rows
    return start


def _is_damage(error: Exception) -> bool:
    """Whether Arrow raised `error` about the bytes it read (a plain OSError without an errno, as for a
    corrupt page or a failed checksum, or an Arrow error), not the stream: what the file object raised
    (a timeout, a reset connection, a disk's EIO) reaches the reader with its own type or errno."""
    return isinstance(error, pa.ArrowException) or (type(error) is OSError and error.errno is None)


def _unreadable_rows(path: Path | str, group: int, start: int, rows: range, error: Exception) -> Iterator[RawRecord]:
    """Records for rows `rows` of row group `group` (its first row at `start` in the dataset)."""
    what = str(error)[:200]
    for row in rows:
        message = f"row {row} of row group {group} in {path} cannot be read: {what}"
        yield RawRecord(start + row, drop_reason="unreadable_row_group", drop_message=message)


def _refusing_read_errors(items: Iterator[Any], what: str, errors: tuple[type[Exception], ...],
                          records: Callable[[Any], int] = lambda item: 1) -> Iterator[Any]:
    """`items` (rows, or batches of `records(item)` rows), an error raised while reading them made a
    `DatasetError`: a file that fails part-way (a CSV row with an unterminated quote, a Parquet
    file whose stream fails; a damaged Parquet row group drops only its rows) is the dataset's
    problem, refused with one line and exit 2, not an internal failure with a traceback (the reader's
    message may quote the file's lines: their line breaks are written as \\n)."""
    count = 0
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except errors as error:
            detail = str(error).replace("\r", "\\r").replace("\n", "\\n")
            raise DatasetError(f"cannot read {what} after record {count}: {detail}") from error
        yield item
        count += records(item)


def _local_files(source: DatasetSource) -> list[Path]:
    """A local file, or a folder's data files (`_data_file_paths`)."""
    path = Path(source.path)
    return [path] if path.is_file() else [Path(file) for file in _data_files(path)]


def _csv_header(file: Path) -> list[str]:
    try:
        return csv_column_names(file)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"cannot read {file} as CSV: {error}") from error


def _csv_records(source: DatasetSource) -> Iterator[RawRecord]:
    """CSV, the `hf:csv` format (the name it had when datasets' builder read it), read by pyarrow with
    every cell as its text but in the number fields (`data/csv_rows.py`): an id `001` stays `001`; a
    row of the wrong width is `invalid_csv_row`, the rest run."""
    rows = csv_rows(_local_files(source), number_columns(source.column_map, FIELDS))
    for row in _refusing_read_errors(rows, f"{source.path} as CSV", (OSError, pa.ArrowException)):
        if row.values is None:
            yield RawRecord(row.position, drop_reason="invalid_csv_row", drop_message=row.problem)
        else:
            yield RawRecord(row.position, _nan_as_missing(row.values))


def _load_hf_saved(path: Path) -> Any:
    """The dataset in a `save_to_disk` directory; a DatasetDict yields its `train` (or only) split."""
    import datasets  # heavy import, only for this format

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as error:
        raise DatasetError(f"cannot load the Hugging Face dataset at {path}: {error}") from error
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if "train" not in loaded and len(splits) != 1:
            raise DatasetError(f"{path} holds splits {splits}; pass the directory of one split")
        loaded = loaded["train" if "train" in loaded else splits[0]]
    return loaded


def unread_splits(source: DatasetSource) -> list[str]:
    """The splits of a saved DatasetDict that the job does not read (it reads `train`): whoever saved
    train, validation and test must hear that two of them do not run. From `dataset_dict.json`."""
    if source.format != "hf_saved":
        return []
    try:
        splits = json.loads((Path(source.path) / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError):  # not a DatasetDict
        return []
    return [str(split) for split in splits if split != "train"] if "train" in splits else []


def _hf_saved_batches(path: Path) -> Iterator[pa.Table]:
    yield from _load_hf_saved(path).with_format("arrow").iter(batch_size=BATCH_ROWS)


def _iter_hf_files(source: DatasetSource) -> Iterator[RawRecord]:
    for position, row in enumerate(_hf_rows(source)):
        yield RawRecord(position, row)


def _hf_rows(source: DatasetSource) -> Iterator[dict[str, Any]]:
    """The builder's rows; what it raises reading the files (pandas' ParserError, Arrow's JSON errors,
    datasets' CastError for files whose columns differ) is about the data: `DatasetError`."""
    from datasets.exceptions import DatasetsError

    what = f"{source.path} with datasets builder {source.format[3:]!r}"
    return _refusing_read_errors(iter(_open_hf_files(source)), what, (OSError, ValueError, pa.ArrowException,
                                                                        DatasetsError))


def _open_hf_files(source: DatasetSource) -> Any:
    """Local data files through `datasets.load_dataset(builder, streaming=True)`: no cache copy."""
    import datasets

    builder = source.format[3:]
    path = Path(source.path)
    files = [str(path)] if path.is_file() else _data_files(path)
    try:
        return datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
    except (OSError, ValueError, FileNotFoundError) as error:
        raise DatasetError(f"cannot load {source.path} with datasets builder {builder!r}: {error}") from error


def _data_files(directory: Path) -> list[str]:
    files = [str(file) for file in _data_file_paths(directory)]
    if not files:
        raise DatasetError(f"{directory} holds no data files")
    return files


def _data_file_paths(directory: Path) -> list[Path]:
    """A folder's data files in name order; names starting with `.` or `_` are not data, as for
    `datasets` itself: Spark's `_SUCCESS` and `.crc` files, a `_metadata` summary."""
    return sorted(file for file in directory.iterdir() if file.is_file() and not file.name.startswith((".", "_")))
