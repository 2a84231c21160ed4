"""Stream a dataset into grouped Parquet shards: `JOB_DIR/shards/shard-00000.parquet`, ...

Every input record lands in exactly one shard row, dropped ones too (with `drop_reason` set), so
workers can account for each record without going back to the dataset. Records are buffered in
windows of `io.group_window` (rounded up to whole shards), tokenized in one batch per window, sorted
by (domain, shared prefix, prompt length) and cut into shards of `io.shard_size` rows: a worker gets similar
requests, which keeps its shape buckets full. Memory holds one window plus the set of seen ids.

Each shard is written whole (`specbatch.storage`: `*.parquet.tmp` renamed on a local disk, one PUT
on an object store); on a local disk, instead of an fsync per shard (~3 ms each, 12 s for a million
records in 256-row shards) one `os.sync()` at the end makes them durable before the caller writes a
manifest that lists them.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from specbatch.config import IOConfig, JobConfig
from specbatch.data.ingest import DatasetSource, iter_records, resolve_dataset
from specbatch.data.prefix_groups import key_tree_positions, shared_prefix_keys
from specbatch.data.validate import LOOKALIKE_FIELDS, Request, ValidationLimits, Validator
from specbatch.faults import crash_point
from specbatch.storage import TMP_SUFFIX, Location, Storage, is_url, open_input, open_storage

log = logging.getLogger(__name__)

SHARD_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),  # 0-based record index in the input
        pa.field("prompt", pa.string()),  # null when dropped by validation
        pa.field("prompt_token_ids", pa.list_(pa.int32())),  # null when dropped or without a tokenizer
        pa.field("num_prompt_tokens", pa.int32()),  # null when unknown
        pa.field("max_new_tokens", pa.int32()),
        pa.field("temperature", pa.float64()),  # 0 = greedy
        pa.field("top_p", pa.float64()),
        pa.field("seed", pa.int64()),
        pa.field("stop", pa.list_(pa.string())),
        pa.field("domain", pa.string(), nullable=False),  # "" when not given
        pa.field("endpoint", pa.string()),  # OpenAI batch url, else null
        pa.field("metadata", pa.string()),  # JSON object of unknown input fields
        pa.field("drop_reason", pa.string()),  # a key of validate.DROP_REASONS; null when valid
        pa.field("drop_message", pa.string()),
        pa.field("constraint", pa.string()),  # structured output (data/constraints.py), JSON; null: none
    ]
)
SHARDS_FOLDER = "shards"
_ROW_VALUES = attrgetter(*SHARD_SCHEMA.names)


@dataclass(frozen=True)
class ShardInfo:
    name: str
    num_records: int
    num_dropped: int
    max_request_tokens: int | None = None  # longest kept prompt + max_new_tokens; None: a prompt not tokenized
    # positions of the prefixes its kept prompts share with others of their window, each once: the room a
    # worker's KV pool keeps for them beside its rows' slots, so they stay cached between the rows that read them
    shared_prefix_tokens: int = 0


def max_request_tokens(requests: list[Request]) -> int | None:
    """Positions the longest kept request can fill (prompt + max_new_tokens): what a worker sizes its
    KV slots to instead of the model's whole context. None when a kept prompt has no token ids."""
    kept = [request for request in requests if not request.is_dropped]
    needs = [len(r.prompt_token_ids) + r.max_new_tokens for r in kept
             if r.prompt_token_ids is not None and r.max_new_tokens is not None]
    return max(needs, default=0) if len(needs) == len(kept) else None


def shard_dataset(
    dataset: Location | DatasetSource,
    job_dir: Location,
    config: JobConfig,
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
    dataset_format: str | None = None,
    column_map: dict[str, str] | None = None,
    *,
    limits: ValidationLimits | None = None,
    unread_fields: dict[str, str] | None = None,
) -> list[ShardInfo]:
    """Validate, tokenize and group every record of `dataset` into `job_dir/shards/`.

    Raises `DatasetError` before writing anything when the dataset cannot be read at all. Shards
    left by an earlier, interrupted call are removed first: sharding is deterministic, so a rerun
    writes the same shards. `max_prompt_tokens` is checked only when a tokenizer is given. A
    `DatasetSource` (from `resolve_dataset`, as `job.prepare` hands it on) is read as resolved;
    a path is resolved here with `dataset_format` and `column_map`. `unread_fields`, if given, gets
    the fields kept as metadata that another engine would read for one of ours (`LOOKALIKE_FIELDS`:
    field -> ours), for the job's summary to name.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    source = dataset if isinstance(dataset, DatasetSource) else resolve_dataset(str(dataset), dataset_format,
                                                                                 column_map)
    limits = limits or ValidationLimits()
    validator = Validator(
        config.sampling,
        openai_batch=source.format == "openai_batch",
        column_map=source.column_map,
        tokenizer=tokenizer,
        limits=limits,
    )
    encoder = PromptEncoder(tokenizer) if tokenizer is not None else None
    if encoder is None and max_prompt_tokens is not None:
        log.warning("no tokenizer given: prompt lengths are not checked against %d tokens", max_prompt_tokens)
    storage = open_storage(job_dir)
    writer = ShardWriter(storage, config.io.shard_size)
    requests = map(validator, iter_records(source, limits.max_record_bytes))
    for window in _windows(requests, window_size(config.io)):
        if encoder is not None:
            _tokenize(window, encoder, max_prompt_tokens)
        keys = dict(zip(map(id, window), shared_prefix_keys([r.prompt_token_ids for r in window]), strict=True))
        window.sort(key=lambda request: _group_key(request, keys[id(request)]))
        writer.write(window, [keys[id(request)] for request in window])
    if storage.is_local:
        os.sync()  # one flush for all shards (an fsync per shard costs ~3 ms each) before a manifest lists them
    _log_summary(source.path, writer)
    for name in sorted(validator.kept_lookalikes):
        log.warning("records carry %r, kept as metadata and not read: specbatch's field is %r (map it with "
                    "--column %s=%s if it is meant as one)", name, LOOKALIKE_FIELDS[name], LOOKALIKE_FIELDS[name], name)
        if unread_fields is not None:
            unread_fields[name] = LOOKALIKE_FIELDS[name]
    return writer.shards


def read_shard(path: Location) -> pa.Table:
    """One shard file, a local path or a URL."""
    if not is_url(path):
        return pq.read_table(path, schema=SHARD_SCHEMA)
    with open_input(path) as file:
        return pq.read_table(file, schema=SHARD_SCHEMA)


def read_shard_requests(path: Location) -> list[Request]:
    """A shard's rows as `Request`s, in shard order."""
    return [Request(**row) for row in read_shard(path).to_pylist()]


def window_size(io: IOConfig) -> int:
    """`group_window` rounded up to whole shards, so only the last shard of a job is short."""
    return max(1, -(-io.group_window // io.shard_size)) * io.shard_size


class PromptEncoder:
    """Batched tokenization without special tokens.

    The tokenizer's own call (`tokenizer(texts, add_special_tokens=False)`) is the reference. For a
    fast tokenizer whose Rust backend gives the same ids on a sample, the backend's
    `encode_batch_fast` (no offsets) is used instead: about 2x faster on short prompts.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend: Any = None
        self.checked = False

    def encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if not self.checked:
            self.backend = self._matching_backend(texts[:32])
            self.checked = True
        if self.backend is not None:
            return _backend_ids(self.backend, texts)
        return self._reference(texts)

    def _reference(self, texts: list[str]) -> list[list[int]]:
        encoded = self.tokenizer(
            texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False
        )
        return encoded["input_ids"]

    def _matching_backend(self, sample: list[str]) -> Any:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):
            return None
        reference = self._reference(sample)  # also resets the backend's truncation and padding
        return backend if _backend_ids(backend, sample) == reference else None


def _backend_ids(backend: Any, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]


class ShardWriter:
    """Writes rows as numbered shards of at most `shard_size` into the job's `shards/`, each whole;
    durability: see the module doc."""

    def __init__(self, storage: Storage, shard_size: int) -> None:
        self.storage = storage
        self.shard_size = shard_size
        self.shards: list[ShardInfo] = []
        self.drop_counts: Counter[str] = Counter()
        for name in storage.names(SHARDS_FOLDER):  # leftovers of an interrupted run
            if name.startswith("shard-") and name.endswith((".parquet", ".parquet" + TMP_SUFFIX)):
                storage.delete(f"{SHARDS_FOLDER}/{name}")

    def write(self, requests: list[Request], prefix_keys: list[tuple[int, ...]]) -> None:
        """Shards of `requests` in order; `prefix_keys` are theirs (`data/prefix_groups.py`)."""
        for start in range(0, len(requests), self.shard_size):
            self._write_shard(requests[start : start + self.shard_size], prefix_keys[start : start + self.shard_size])

    def _write_shard(self, requests: list[Request], prefix_keys: list[tuple[int, ...]]) -> None:
        name = f"shard-{len(self.shards):05d}.parquet"
        self.storage.write_parquet(f"{SHARDS_FOLDER}/{name}", requests_to_table(requests), durable=False)
        reasons = [request.drop_reason for request in requests if request.drop_reason is not None]
        self.drop_counts.update(reasons)
        shared = key_tree_positions(key for request, key in zip(requests, prefix_keys, strict=True)
                                    if not request.is_dropped)
        self.shards.append(ShardInfo(name, len(requests), len(reasons), max_request_tokens(requests), shared))
        crash_point("ingest_shard")


def requests_to_table(requests: list[Request]) -> pa.Table:
    rows = map(_ROW_VALUES, requests)  # one tuple per request, in schema order
    columns = zip(*rows, strict=True) if requests else ([] for _ in SHARD_SCHEMA.names)
    arrays = [pa.array(values, type=field.type) for values, field in zip(columns, SHARD_SCHEMA, strict=True)]
    return pa.Table.from_arrays(arrays, schema=SHARD_SCHEMA)


def _windows(requests: Iterable[Request], size: int) -> Iterator[list[Request]]:
    iterator = iter(requests)
    while window := list(islice(iterator, size)):
        yield window


def _tokenize(window: list[Request], encoder: PromptEncoder, max_prompt_tokens: int | None) -> None:
    """Token ids for the window's valid prompts; a prompt with no tokens or too many is dropped."""
    live = [request for request in window if not request.is_dropped]
    prompts = [request.prompt for request in live if request.prompt is not None]  # every live request has one
    for request, token_ids in zip(live, encoder.encode(prompts), strict=True):
        request.num_prompt_tokens = len(token_ids)
        if not token_ids:
            _drop_late(request, "empty_prompt", "prompt has no tokens after tokenization")
        elif max_prompt_tokens is not None and len(token_ids) > max_prompt_tokens:
            message = f"prompt has {len(token_ids)} tokens; at most {max_prompt_tokens} fit the model context"
            _drop_late(request, "prompt_too_long", message)
        else:
            request.prompt_token_ids = token_ids


def _drop_late(request: Request, reason: str, message: str) -> None:
    """A drop after validation keeps the prompt and its length, for the report."""
    request.drop_reason, request.drop_message = reason, message
    request.max_new_tokens = request.temperature = request.top_p = request.seed = request.stop = None


def _group_key(request: Request, prefix_key: tuple[int, ...]) -> tuple[bool, str, tuple[int, ...], int, int]:
    """Dropped rows last; then by domain, shared prefix (`data/prefix_groups.py`: rows that share one
    stay together, so a worker computes it once) and prompt length (tokens, or characters without a
    tokenizer)."""
    length = request.num_prompt_tokens
    if length is None:
        length = len(request.prompt) if request.prompt is not None else 0
    return (request.is_dropped, request.domain, prefix_key, length, request.position)


def _log_summary(path: Location, writer: ShardWriter) -> None:
    num_records = sum(shard.num_records for shard in writer.shards)
    num_dropped = sum(writer.drop_counts.values())
    log.info("%s: %d records in %d shards, %d dropped", path, num_records, len(writer.shards), num_dropped)
    for reason, count in writer.drop_counts.most_common():
        log.info("  dropped %-24s %d", reason, count)
