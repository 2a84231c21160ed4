"""Job configuration: validated once at the edge (YAML + `--set key=value`), frozen inside.

Every field has a default so that an empty config is the embedded default: the bundled demo pair
on the CPU. Errors name the field (pydantic), and `load_config` turns them into `ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_LOOKAHEAD = 16  # drafts per row; bounds fixed:K and scheduler.max_lookahead
# a record's max_new_tokens and temperature are held to these (data/validate.py), so the defaults are too:
# a default past them reached the int32 shard column as an internal failure, or sampled at infinity
MAX_NEW_TOKENS = 131072
MAX_TEMPERATURE = 100.0
_FIXED = re.compile(r"fixed:([0-9]+)")


class ConfigError(ValueError):
    """A config the job cannot run with; the CLI prints it and exits with code 2."""


@dataclass(frozen=True)
class LookaheadSpec:
    """`fixed:K` (k drafts per row), `adaptive` or `slack`, parsed; str() writes it back."""

    kind: Literal["fixed", "adaptive", "slack"]
    k: int | None = None  # fixed only

    @classmethod
    def parse(cls, text: str) -> LookaheadSpec:
        if text == "adaptive":
            return cls("adaptive")
        if text == "slack":
            return cls("slack")
        k = _fixed_count(text)
        if k is None or k > MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be fixed:K (K in 0..{MAX_LOOKAHEAD}), adaptive or slack, not {text!r}")
        return cls("fixed", k)

    def __str__(self) -> str:
        return self.kind if self.k is None else f"{self.kind}:{self.k}"

    def within(self, limit: int, name: str = "max_lookahead") -> LookaheadSpec:
        """This spec, if its K is at most `limit`: fixed:K over the limit is an error, not a clamp."""
        if self.k is not None and self.k > limit:
            raise ValueError(f"{self} is over {name} ({limit}): lower K or raise max_lookahead")
        return self


@dataclass(frozen=True)
class PrefillChunkSpec:
    """`fixed:N` (chunks of at most N prompt tokens) or `deadline`, parsed; str() writes it back."""

    kind: Literal["fixed", "deadline"]
    num_tokens: int | None = None  # fixed only

    @classmethod
    def parse(cls, text: str) -> PrefillChunkSpec:
        if text == "deadline":
            return cls("deadline")
        num_tokens = _fixed_count(text)
        if num_tokens is None or num_tokens < 1:
            raise ValueError(f"prefill_chunk must be fixed:N (N >= 1) or deadline, not {text!r}")
        return cls("fixed", num_tokens)

    def __str__(self) -> str:
        return self.kind if self.num_tokens is None else f"{self.kind}:{self.num_tokens}"


def _fixed_count(text: str) -> int | None:
    match = _FIXED.fullmatch(text)
    return int(match[1]) if match else None


_Spec = TypeVar("_Spec", LookaheadSpec, PrefillChunkSpec)


def _parsed(spec_type: type[_Spec]) -> Callable[[object], _Spec]:
    """Validates a spec field: the string a user writes (or a manifest stores) goes through
    `spec_type.parse`; an already parsed value (a default) passes as it is."""

    def validate(value: object) -> _Spec:
        if isinstance(value, spec_type):
            return value
        if not isinstance(value, str):
            raise ValueError(f"expected a string, not {type(value).__name__}")
        return spec_type.parse(value)

    return validate


# In the config: parsed values. In YAML, --set, manifests and model_dump: the strings.
Lookahead = Annotated[LookaheadSpec, PlainValidator(_parsed(LookaheadSpec)), PlainSerializer(str, return_type=str)]
PrefillChunk = Annotated[
    PrefillChunkSpec, PlainValidator(_parsed(PrefillChunkSpec)), PlainSerializer(str, return_type=str)
]


class _Section(BaseModel):
    # no NaN or infinity (`--set io.part_every_s=.inf`): the manifest's JSON holds them as null, which
    # the job's next read refused as an internal failure
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean only where the field is one: pydantic reads `true` as 1 for an int or float field,
        so `--set scheduler.max_batch_rows=true` (meant as 'on', or a slip) ran one row per batch."""
        if info.field_name is None or not _numeric(cls.model_fields[info.field_name].annotation):
            return value
        items = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(item, bool) for item in items):
            raise ValueError(f"expected a number, not a boolean: {str(value).lower()}")
        return value


def _numeric(annotation: Any) -> bool:
    """Whether a field's type is or holds a number (`int`, `float | None`, `tuple[int, ...]`)."""
    return annotation in (int, float) or any(_numeric(arg) for arg in get_args(annotation))


class ModelsConfig(_Section):
    target: str = "bundled:target"
    draft: str | None = "bundled:draft"
    eagle: str | None = "bundled:eagle"  # an EAGLE-3 head in the public layout (drafter.kind = eagle)
    tokenizer: str | None = None  # defaults to the target's directory
    # auto: bfloat16 where this machine's matrix units have it and measure faster, else float32; fixed
    # in the job's manifest when it is created (engine/dtype_choice.py)
    dtype: Literal["auto", "float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    draft_device: str | None = None  # the draft model's device; None: models.device
    graphs: Literal["eager", "compile", "cuda-graphs"] = "eager"  # decode-shaped passes (engine/graphs.py)
    # attention outside the engine's paged passes (a `generate` baseline); the engine attends through its own
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # the Llama family (Llama, SmolLM2, Mistral, Qwen2/3) through its native step (engine/native_llama.py);
    # false, or any other family: transformers' modeling code over the same paged cache
    native: bool = True
    trust_remote_code: bool = False
    num_threads: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _cuda_graphs_on_cuda(self) -> ModelsConfig:
        devices = {self.device, self.draft_device or self.device}
        if self.graphs == "cuda-graphs" and not all(d.startswith("cuda") for d in devices):
            raise ValueError(f"graphs=cuda-graphs needs CUDA devices, not {' and '.join(sorted(devices))}; "
                             "use graphs=compile on a CPU")
        return self


DRAFTER_KINDS = ("draft", "eagle", "ngram", "suffix", "none")
MODEL_DRAFTERS = ("draft", "eagle")  # drafters that run a model (a draft model, an EAGLE head)
INDEXING_DRAFTERS = ("suffix",)  # drafters that index a row's tokens before drafting for it (host time)


class DrafterConfig(_Section):
    # draft: the bundled pair's best measured drafter, its distilled draft model (README, benchmarks/README.md).
    # Several (`suffix,ngram`, or a YAML list): the adaptive policy picks one per row and round
    # (engine/drafter_mix.py, sched/drafter_choice.py); at most one of them runs a model
    kind: str = "draft"
    ngram_max: int = Field(default=3, ge=1, le=8)
    ngram_min: int = Field(default=1, ge=1, le=8)
    # suffix (engine/suffix_drafter.py): substrings indexed up to this many tokens (nodes <= depth x tokens)
    suffix_max_depth: int = Field(default=24, ge=2, le=64)
    suffix_max_tokens: int = Field(default=262_144, ge=1)  # the job-wide index forgets the oldest outputs past this
    suffix_min_prob: float = Field(default=0.1, ge=0.0, le=1.0)  # a draft stops before its probability drops below
    suffix_spec_factor: float = Field(default=1.0, gt=0.0)  # draft at most this x the matched suffix's length

    @field_validator("kind", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> str:
        """One kind, or several (separated by commas or `+`, or a list) written back as `a,b`; `none`
        in a mix is dropped (plain decoding is every row's choice anyway)."""
        if isinstance(value, list | tuple):
            value = ",".join(str(item) for item in value)
        if not isinstance(value, str):
            raise ValueError(f"expected a drafter kind or a list of them, not {type(value).__name__}")
        kinds = list(dict.fromkeys(part.strip() for part in re.split(r"[,+]", value) if part.strip()))
        unknown = [kind for kind in kinds if kind not in DRAFTER_KINDS]
        if unknown or not kinds:
            raise ValueError(f"drafter kinds are {', '.join(DRAFTER_KINDS)}, not {value!r}")
        if len(kinds) > 1:
            kinds = [kind for kind in kinds if kind != "none"] or ["none"]
        if sum(kind in MODEL_DRAFTERS for kind in kinds) > 1:
            raise ValueError(f"at most one drafter that runs a model ({' or '.join(MODEL_DRAFTERS)}), not {value!r}")
        return ",".join(kinds)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The configured drafters, in order (the first wins ties)."""
        return tuple(self.kind.split(","))

    @property
    def model_kind(self) -> str | None:
        """The configured drafter that runs a model, if any."""
        return next((kind for kind in self.kinds if kind in MODEL_DRAFTERS), None)


class SchedulerConfig(_Section):
    order: Literal["fcfs", "sjf", "laps-sd", "specbatch"] = "fcfs"
    max_lookahead: int = Field(default=8, ge=0, le=MAX_LOOKAHEAD)  # before lookahead: _within_max_lookahead reads it
    lookahead: Lookahead = Field(default=LookaheadSpec("adaptive"), validate_default=True)
    prefill_chunk: PrefillChunk = PrefillChunkSpec("fixed", 256)
    max_batch_rows: int = Field(default=32, ge=1)
    max_round_tokens: int = Field(default=2048, ge=1)
    tpot_slo_ms: float = Field(default=200.0, gt=0)
    cost_model: str | None = None  # JSON from `specbatch calibrate`; None: the built-in CPU profile
    learn_cost: bool = True  # with lookahead=adaptive: refit that model on the worker's rounds (sched/online_cost.py)
    # with lookahead=adaptive or slack and no cost_model: time the models in use at worker start and
    # plan from that (engine/cost_profile.py, cached by model, dtype and machine) instead of the CPU profile
    measure_cost: bool = True

    @field_validator("lookahead")
    @classmethod
    def _within_max_lookahead(cls, spec: LookaheadSpec, info: ValidationInfo) -> LookaheadSpec:
        limit = info.data.get("max_lookahead")  # absent when max_lookahead itself is invalid
        return spec if limit is None else spec.within(limit, "scheduler.max_lookahead")


class CapacityConfig(_Section):
    kv_tokens: int | None = Field(default=None, ge=1)  # target KV token slots per worker
    kv_bytes: int | None = Field(default=None, ge=1)  # alternative: bytes for target + draft KV
    admission: Literal["reserve", "optimistic"] = "reserve"
    max_context: int | None = Field(default=None, ge=2)  # defaults to the target's positions


class CacheConfig(_Section):
    """KV in fixed-size blocks (`sched/kv_blocks.py`), and shared prefixes held once: a row whose
    tokens start as another's points its block table at the same blocks instead of computing them."""

    prefix: bool = True  # share registered blocks between rows; off: every row computes its own
    # positions per KV block: 16 measured best for shared-prefix jobs and no slower on others (docs/DESIGN.md)
    block_tokens: int = Field(default=16, ge=1, validation_alias=AliasChoices("block_tokens", "prefix_block_tokens"))
    # what blocks no running row references may keep cached for later rows, in target + draft KV bytes
    # (None: any block not needed for a running row); it also bounds the room the pool adds for the job's
    # shared prefixes (engine/build.py: prefix_room_tokens)
    prefix_kv_bytes: int | None = Field(default=None, ge=0)


class BucketsConfig(_Section):
    batch_rows: tuple[int, ...] = ()  # empty: no batch padding
    query_len: tuple[int, ...] = ()  # empty: pad only to the round's longest row
    kv_len_multiple: int = Field(default=32, ge=1)


class SamplingDefaults(_Section):
    max_new_tokens: int = Field(default=128, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    coupling: Literal["rejection", "gumbel"] = "rejection"  # randomness of sampled rows (engine/coupling.py)


class IOConfig(_Section):
    shard_size: int = Field(default=256, ge=1)
    group_window: int = Field(default=4096, ge=1)
    part_every_requests: int = Field(default=64, ge=1)
    part_every_s: float = Field(default=30.0, gt=0)


class WorkersConfig(_Section):
    """Where a job's workers run (docs/deployment.md).

    `local`: the worker group runs on the machine that runs the flow (`num_processes` processes).
    `pool`: the flow starts `slots` worker flow runs through the deployment `specbatch-worker/POOL`
    (registered by the flow on the work pool `pool`), on whichever machines run that pool's Prefect
    workers; the job directory must then be on storage every machine reaches (an object-store URL).
    """

    num_processes: int = Field(default=1, ge=1)
    placement: Literal["local", "pool"] = "local"
    slots: int = Field(default=1, ge=1)  # worker flow runs of a `pool` job (worker ids 0..slots-1)
    pool: str = Field(default="specbatch", min_length=1)  # the Prefect work pool of `pool` placement
    worker_retries: int = Field(default=2, ge=0)  # new runs of a failed worker flow run, per worker id
    lease_s: float = Field(default=30.0, gt=0)  # job and worker leases on an object store (no flock there)

    @model_validator(mode="after")
    def _one_process_per_slot(self) -> WorkersConfig:
        if self.placement == "pool" and self.num_processes > 1:
            raise ValueError("workers.placement=pool runs one worker process per slot; set workers.slots "
                             "instead of workers.num_processes")
        return self


class JobConfig(_Section):
    models: ModelsConfig = ModelsConfig()
    drafter: DrafterConfig = DrafterConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    capacity: CapacityConfig = CapacityConfig()
    cache: CacheConfig = CacheConfig()
    buckets: BucketsConfig = BucketsConfig()
    sampling: SamplingDefaults = SamplingDefaults()
    io: IOConfig = IOConfig()
    workers: WorkersConfig = WorkersConfig()
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _defaults_follow_the_target(cls, data: Any) -> Any:
        """The bundled draft and EAGLE head serve only the bundled target: another target gets neither
        unless one is named, and drafts with the model it is given, else with the suffix drafter."""
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict) or str(models.get("target", "bundled:")).startswith("bundled:"):
            return data
        models = {"draft": None, "eagle": None, **models}
        drafter = data.get("drafter") or {}
        if isinstance(drafter, dict) and "kind" not in drafter:
            drafter = {**drafter, "kind": "draft" if models["draft"] else "eagle" if models["eagle"] else "suffix"}
        return {**data, "models": models, "drafter": drafter}

    @property
    def max_lookahead(self) -> int:
        """Drafts a row may get: none without a drafter, whatever the lookahead policy says."""
        return 0 if self.drafter.kind == "none" else self.scheduler.max_lookahead

    @property
    def effective_lookahead(self) -> LookaheadSpec:
        """The lookahead the job runs: the configured one, except that without a drafter fixed:K runs
        as fixed:0 (no drafter, no drafts: the default fixed:4 must run with --drafter none). A K over
        scheduler.max_lookahead was refused when the config was validated, so this is the only place
        a user's K is lowered."""
        spec = self.scheduler.lookahead
        return LookaheadSpec("fixed", 0) if self.drafter.kind == "none" and spec.kind == "fixed" else spec


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
        try:
            node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as error:
            problem = " ".join(str(getattr(error, "problem", None) or error).split())
            raise ConfigError(f"--set {key.strip()}: {raw!r} is not a valid YAML value ({problem})") from None
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping naming a key twice is an error: PyYAML keeps the last
    value, so a config that set `drafter:` twice ran the second silently and the first was lost."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may repeat what it merges
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, str | int | float | bool) and key in seen:
                    line = key_node.start_mark.line + 1
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (line {line})")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506
        except FileNotFoundError as error:
            raise ConfigError(f"config file not found: {path}") from error
        except (OSError, UnicodeDecodeError) as error:  # a folder (`--config ""` is "."), unreadable, not text
            raise ConfigError(f"cannot read config file {path}: {error}") from error
        except yaml.YAMLError as error:
            problem = " ".join(str(getattr(error, "problem", None) or error).split())
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping, not {type(loaded).__name__}")
        data = loaded or {}
    return validate_config(apply_overrides(data, overrides or []))


def validate_config(data: dict[str, Any], what: str = "invalid config") -> JobConfig:
    """`data` as a JobConfig; a `ConfigError` in one line naming each bad field, not pydantic's report."""
    try:
        return JobConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise ConfigError(f"{what}: {problems}") from error


def config_to_dict(config: JobConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


# What a resumed job may change (`specbatch.job.drift`). A key is a section (all its fields, present and
# future) or one `section.field`; the field's own key wins. Outputs: what a request's output law, or the
# shards ingest cut, depend on: the target's weights, code, tokenizer and dtype, the sampling defaults and
# coupling, the context, the seed, the sharding. Speed: how and where the same outputs are computed: the
# drafter and draft model (exact speculative decoding keeps the target's law), batching, lookahead, the
# KV budget, buckets, device, attention kernel, the native step and threads (same maths, other rounding, as
# under another batch), prefix reuse (a shared block's KV is the same maths as computing it, in another pass),
# processes, part flushes. The EAGLE head (models.eagle) is a drafter like the draft model.
OUTPUT_FIELDS = frozenset({"models.target", "models.tokenizer", "models.dtype", "models.trust_remote_code",
                           "sampling", "capacity.max_context", "io.shard_size", "io.group_window", "seed"})
SPEED_FIELDS = frozenset({"models.draft", "models.eagle", "models.device", "models.draft_device", "models.graphs",
                          "models.attn_implementation", "models.native", "models.num_threads",
                          "drafter", "scheduler", "capacity.kv_tokens", "capacity.kv_bytes", "capacity.admission",
                          "cache", "buckets", "io.part_every_requests", "io.part_every_s", "workers"})


def changes_outputs(path: str) -> bool:
    """Whether config field `path` (`section.field`, or `seed`) can change a job's outputs."""
    for key in (path, path.split(".")[0]):
        if key in OUTPUT_FIELDS:
            return True
        if key in SPEED_FIELDS:
            return False
    raise KeyError(f"config field {path} is in neither OUTPUT_FIELDS nor SPEED_FIELDS")
