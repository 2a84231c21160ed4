"""The real backend from a job config: models, slot caches, drafter, and the limits they fix; the
engine around it is `loop.build_engine`, the same as the simulator's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbatch.config import JobConfig
from specbatch.engine.backend import HFBackend
from specbatch.engine.constraints import GrammarRuntime
from specbatch.engine.cost_profile import job_cost_model
from specbatch.engine.coupling import make_coupling
from specbatch.engine.drafter_mix import DrafterMix
from specbatch.engine.drafters import Drafter, DraftModelDrafter, NgramDrafter, NoDrafter
from specbatch.engine.eagle import EagleHead, aux_layer_ids, load_head
from specbatch.engine.eagle_drafter import EagleDrafter
from specbatch.engine.forced_drafter import ForcedDrafter
from specbatch.engine.forward import PagedModel
from specbatch.engine.graphs import GraphMode, decode_step, warm_shapes
from specbatch.engine.loading import check_same_tokenizer, kv_shape, load_model, load_tokenizer
from specbatch.engine.model_paths import ModelLoadError
from specbatch.engine.native_llama import NativeLlama, native_reason
from specbatch.engine.paged_cache import PagedKVCache
from specbatch.engine.slot_cache import SlotCache
from specbatch.engine.suffix_drafter import SuffixDrafter
from specbatch.loop import Engine, EngineLimits, Recorder, build_engine
from specbatch.sched.factory import job_buckets, shares_prefixes


@dataclass
class Models:
    """Loaded once per worker and reused by every engine it builds."""

    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    eagle: EagleHead | None = None
    _steps: dict[tuple[str, GraphMode], Callable[..., Any]] = field(default_factory=dict)
    _natives: dict[str, NativeLlama | None] = field(default_factory=dict)

    def native(self, role: str) -> NativeLlama | None:
        """`role`'s native step where its family has one (built once: it fuses the model's weights)."""
        if role not in self._natives:
            model = self.target if role == "target" else self.draft
            assert model is not None
            self._natives[role] = NativeLlama(model) if native_reason(model) is None else None
        return self._natives[role]

    def step(self, role: str, mode: GraphMode) -> Callable[..., Any]:
        """What runs `role`'s ("target" or "draft") decode passes in `mode`, compiled once per model."""
        if (role, mode) not in self._steps:
            model = self.target if role == "target" else self.draft
            assert model is not None
            self._steps[role, mode] = decode_step(model, mode)
        return self._steps[role, mode]


def load_models(config: JobConfig) -> Models:
    m = config.models
    if m.num_threads:
        torch.set_num_threads(m.num_threads)
    tokenizer = load_tokenizer(m)
    target = load_model(m.target, m)
    draft = None
    if config.drafter.model_kind == "draft":
        if not m.draft:
            raise ModelLoadError("drafter.kind is 'draft' but models.draft is not set")
        check_same_tokenizer(m.target, m.draft, tokenizer, m)
        draft = load_model(m.draft, m, m.draft_device)
    eagle = None
    if config.drafter.model_kind == "eagle":
        if not m.eagle:
            raise ModelLoadError("drafter.kind is 'eagle' but models.eagle is not set")
        eagle = load_head(m.eagle, target)
    return Models(target, draft, tokenizer, eagle)


def max_context(config: JobConfig, models: Models) -> int:
    positions = kv_shape(models.target).max_positions
    if models.draft is not None:
        positions = min(positions, kv_shape(models.draft).max_positions)
    return min(config.capacity.max_context or positions, positions)


def kv_bytes_per_token(models: Models) -> int:
    """KV bytes one position costs in the target's cache and the draft model's (in the target's dtype)."""
    dtype = models.target.dtype
    per_token = kv_shape(models.target).bytes_per_token(dtype)
    if models.draft is not None:
        per_token += kv_shape(models.draft).bytes_per_token(dtype)
    return per_token


PREFIX_ROOM_BYTES = 256 * 2**20  # prefix room a job may take unasked: small beside any host of the model


def kv_capacity_tokens(config: JobConfig, models: Models, slot_len: int, shared_prefix_tokens: int = 0) -> int:
    """The pool's positions: the configured capacity, else a slot per batch row and the room that keeps
    the job's shared prefixes cached between the rows that read them (`prefix_room_tokens`)."""
    c = config.capacity
    if c.kv_tokens:
        return c.kv_tokens
    if c.kv_bytes:
        return c.kv_bytes // kv_bytes_per_token(models)
    return config.scheduler.max_batch_rows * slot_len + prefix_room_tokens(config, models, slot_len,
                                                                           shared_prefix_tokens)


def prefix_room_tokens(config: JobConfig, models: Models, slot_len: int, shared_prefix_tokens: int) -> int:
    """Positions beside the rows' slots for shared prefixes no running row reads. Slots sized to the
    job's longest request leave a pool of 1 row no room for any prefix but its own row's, so rows that
    take turns between prefixes (A, B, A, B) computed each of them every time. The room holds the
    prefixes the job's prompts share (ingest counts them), at most `cache.prefix_kv_bytes` of KV, else
    at most the rows' slots, one whole context or `PREFIX_ROOM_BYTES` of KV, whichever is most."""
    if not shares_prefixes(config) or shared_prefix_tokens <= 0:
        return 0
    per_token = kv_bytes_per_token(models)
    if config.cache.prefix_kv_bytes is not None:
        most = config.cache.prefix_kv_bytes // per_token
    else:
        most = max(config.scheduler.max_batch_rows * slot_len, max_context(config, models),
                   PREFIX_ROOM_BYTES // per_token)
    return min(shared_prefix_tokens, most)


def grammar_eos(models: Models) -> int:
    """The end token a finished grammar allows (llguidance takes one): the tokenizer's, else the lowest EOS."""
    eos = models.tokenizer.eos_token_id
    return int(eos) if eos is not None else min(eos_token_ids(models))


def eos_token_ids(models: Models) -> set[int]:
    ids = models.target.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if models.tokenizer.eos_token_id is not None:
        ids.add(models.tokenizer.eos_token_id)
    return ids


def _paged_cache(model: PreTrainedModel, num_blocks: int, block_size: int, graphs: GraphMode) -> PagedKVCache:
    shape = kv_shape(model)
    device = next(model.parameters()).device
    cache = PagedKVCache(shape.num_layers, num_blocks, block_size, shape.num_kv_heads, shape.head_dim, model.dtype,
                         device, shape.value_head_dim)
    if graphs == "cuda-graphs":  # graphs replay into these buffers: their addresses must not change
        for tensor in cache.keys + cache.values:
            torch._dynamo.mark_static_address(tensor)
    return cache


def kv_num_blocks(config: JobConfig, capacity_tokens: int) -> int:
    """Blocks of the paged caches: the KV capacity, whole blocks."""
    return max(1, capacity_tokens // config.cache.block_tokens)


def num_slot_positions(config: JobConfig, context: int, max_request_tokens: int | None) -> int:
    """Positions one slot holds: the context, plus a verify pass's pending token and lookahead.

    A job that knows its longest request (prompt + max_new_tokens, recorded at ingest) never fills
    more, so its slots stop there: at the context limit (SmolLM2-135M: 8192 positions) slots for
    300-token requests are mostly unused memory, allocated and zeroed. That bound leaves room for
    the widest pass a row's last positions pad to, and is rounded up to the KV-length multiple so
    that every pass attends over the same KV bucket as with whole-context slots: the same shapes,
    the same outputs. `None` (a job ingested before the record): the whole context."""
    k_max = config.max_lookahead
    if max_request_tokens is None:
        return context + k_max + 1
    buckets = job_buckets(config)
    # a running row holds fewer tokens; its next pass starts at its last one, padded to a query bucket
    widest_pass = max((k_max + 1, *buckets.query_len))
    return min(context + k_max + 1, buckets.kv_len(max_request_tokens + widest_pass))


def hf_backend(config: JobConfig, models: Models, max_request_tokens: int | None = None,
               shared_prefix_tokens: int = 0) -> tuple[HFBackend, EngineLimits]:
    """The backend and its limits. `max_request_tokens` sizes only the slots (`num_slot_positions`):
    the limits keep the model's context, which the scheduler and the stop rule compare against;
    `shared_prefix_tokens` adds the pool's room for shared prefixes (`prefix_room_tokens`)."""
    context = max_context(config, models)
    slot_len = num_slot_positions(config, context, max_request_tokens)
    capacity_tokens = kv_capacity_tokens(config, models, slot_len, shared_prefix_tokens)
    num_blocks, block_size = kv_num_blocks(config, capacity_tokens), config.cache.block_tokens
    graphs, num_lanes = config.models.graphs, config.scheduler.max_batch_rows
    vocab_size = models.target.get_output_embeddings().weight.shape[0]
    target_device = next(models.target.parameters()).device
    native = config.models.native and graphs == "eager"
    target = PagedModel(models.target, _paged_cache(models.target, num_blocks, block_size, graphs),
                        step=models.step("target", graphs), native=models.native("target") if native else None)
    drafters: dict[str, Drafter] = {}  # by kind: several make a `DrafterMix`, a drafter chosen per row
    for kind in config.drafter.kinds:
        if kind == "draft":
            assert models.draft is not None
            draft = PagedModel(models.draft, _paged_cache(models.draft, num_blocks, block_size, graphs),
                               step=models.step("draft", graphs), native=models.native("draft") if native else None)
            drafters[kind] = DraftModelDrafter(draft, vocab_size, target_device)
        elif kind == "eagle":
            assert models.eagle is not None
            head = models.eagle
            lanes = SlotCache(1, num_lanes + 1, head.num_kv_heads, head.head_dim, slot_len, models.target.dtype,
                              target_device)
            target.feature_layers = aux_layer_ids(head.config, kv_shape(models.target).num_layers)
            drafters[kind] = EagleDrafter(head, lanes, target_device)
        elif kind == "ngram":
            drafters[kind] = NgramDrafter(config.drafter.ngram_min, config.drafter.ngram_max)
        elif kind == "suffix":
            drafters[kind] = SuffixDrafter(config.drafter)
        else:
            drafters[kind] = NoDrafter()
    drafter: Drafter = DrafterMix(drafters) if len(drafters) > 1 else drafters[config.drafter.kind]

    coupling = make_coupling(config.sampling.coupling, config.seed, target_device)
    grammar = GrammarRuntime(models.tokenizer, vocab_size, grammar_eos(models))  # structured output (issue 42)
    draft_model = getattr(drafters.get("draft"), "draft", None)
    warm_up = None if graphs == "eager" else lambda: _warm_up(config, target, draft_model)
    backend = HFBackend(target, ForcedDrafter(drafter, grammar), vocab_size, coupling, num_lanes, warm_up,
                        grammar=grammar)
    tokenizer = models.tokenizer
    limits = EngineLimits(context, num_blocks * block_size, frozenset(eos_token_ids(models)),
                          lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
                          kv_bytes_per_token=kv_bytes_per_token(models))
    return backend, limits


def _warm_up(config: JobConfig, target: PagedModel, draft: PagedModel | None) -> None:
    """One pass of each decode shape the job runs (rows x verify positions; the draft's steps), so
    graphs compile before the first round. Before any row's KV exists: it writes scratch tables."""
    buckets, max_rows = job_buckets(config), config.scheduler.max_batch_rows
    passes = [(target, config.max_lookahead + 1)] + ([(draft, 2)] if draft is not None else [])
    for model, max_query_len in passes:
        for num_rows, query_len in warm_shapes(buckets, max_rows, max_query_len):
            model.forward(model.scratch_tables(num_rows, query_len), [0] * num_rows, [[0] * query_len] * num_rows,
                          last_only=model is draft)


def build_hf_engine(config: JobConfig, models: Models, recorder: Recorder, worker_id: int = 0,
                    max_request_tokens: int | None = None, shared_prefix_tokens: int = 0) -> Engine:
    """The engine of one worker on real models, its slots sized to `max_request_tokens` if known, its
    KV pool with room for `shared_prefix_tokens` of shared prefixes."""
    backend, limits = hf_backend(config, models, max_request_tokens, shared_prefix_tokens)
    # the scheduler plans from the models in use, timed (or read from the cache) before any row's KV
    measured = job_cost_model(config, backend.target, getattr(backend.drafter, "draft", None))
    return build_engine(config, backend, limits, recorder, worker_id, scheduler_cost=measured)
