"""Job configuration: validated once at the edge (YAML + `--set key=value`), frozen inside.

Every field has a default so that an empty config is the embedded default: the bundled demo pair
on the CPU. Errors name the field (pydantic), and `load_config` turns them into `ConfigError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """A config the job cannot run with; the CLI prints it and exits with code 2."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelsConfig(_Section):
    target: str = "bundled:target"
    draft: str | None = "bundled:draft"
    tokenizer: str | None = None  # defaults to the target's directory
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    trust_remote_code: bool = False
    num_threads: int | None = Field(default=None, ge=1)


class DrafterConfig(_Section):
    kind: Literal["draft", "ngram", "none"] = "draft"
    ngram_max: int = Field(default=3, ge=1, le=8)
    ngram_min: int = Field(default=1, ge=1, le=8)


class SchedulerConfig(_Section):
    order: Literal["fcfs", "sjf", "laps-sd", "specbatch"] = "fcfs"
    lookahead: str = "fixed:4"  # fixed:K | adaptive | slack
    max_lookahead: int = Field(default=8, ge=0, le=16)
    prefill_chunk: str = "fixed:256"  # fixed:N | deadline
    max_batch_rows: int = Field(default=32, ge=1)
    max_round_tokens: int = Field(default=2048, ge=1)
    tpot_slo_ms: float = Field(default=200.0, gt=0)
    cost_model: str | None = None  # JSON from `specbatch calibrate`; None: the built-in CPU profile

    @field_validator("lookahead")
    @classmethod
    def _lookahead(cls, value: str) -> str:
        if value in ("adaptive", "slack"):
            return value
        kind, _, k = value.partition(":")
        if kind != "fixed" or not k.isdigit() or int(k) > 16:
            raise ValueError("lookahead must be fixed:K (K in 0..16), adaptive or slack")
        return value

    @field_validator("prefill_chunk")
    @classmethod
    def _prefill_chunk(cls, value: str) -> str:
        kind, _, size = value.partition(":")
        if value != "deadline" and (kind != "fixed" or not size.isdigit() or int(size) < 1):
            raise ValueError("prefill_chunk must be fixed:N (N >= 1) or deadline")
        return value


class CapacityConfig(_Section):
    kv_tokens: int | None = Field(default=None, ge=1)  # target KV token slots per worker
    kv_bytes: int | None = Field(default=None, ge=1)  # alternative: bytes for target + draft KV
    admission: Literal["reserve", "optimistic"] = "reserve"
    max_context: int | None = Field(default=None, ge=2)  # defaults to the target's positions


class BucketsConfig(_Section):
    batch_rows: tuple[int, ...] = ()  # empty: no batch padding
    query_len: tuple[int, ...] = ()  # empty: pad only to the round's longest row
    kv_len_multiple: int = Field(default=32, ge=1)


class SamplingDefaults(_Section):
    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class IOConfig(_Section):
    shard_size: int = Field(default=256, ge=1)
    group_window: int = Field(default=4096, ge=1)
    part_every_requests: int = Field(default=64, ge=1)
    part_every_s: float = Field(default=30.0, gt=0)


class WorkersConfig(_Section):
    num_processes: int = Field(default=1, ge=1)


class JobConfig(_Section):
    models: ModelsConfig = ModelsConfig()
    drafter: DrafterConfig = DrafterConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    capacity: CapacityConfig = CapacityConfig()
    buckets: BucketsConfig = BucketsConfig()
    sampling: SamplingDefaults = SamplingDefaults()
    io: IOConfig = IOConfig()
    workers: WorkersConfig = WorkersConfig()
    seed: int = 0


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings; values are parsed as YAML scalars (`4`, `true`, `null`)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        node = data
        *parents, leaf = key.strip().split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
            node = child
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise ConfigError(f"config file not found: {path}") from error
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path} is not valid YAML: {error}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping, not {type(loaded).__name__}")
        data = loaded or {}
    data = apply_overrides(data, overrides or [])
    try:
        return JobConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise ConfigError(f"invalid config: {problems}") from error


def config_to_dict(config: JobConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
