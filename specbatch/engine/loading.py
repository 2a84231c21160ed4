"""Loading a target/draft pair and tokenizer from local Hugging Face directories.

`bundled:target` and `bundled:draft` name the demo pair shipped inside the package; a `.gguf` file
(or `smollm2-135m`) is read from its converted folder (`gguf_models.model_dir`). Nothing is fetched
from a hub; `trust_remote_code` stays off unless the config turns it on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pickle import UnpicklingError

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from specbatch.config import ModelsConfig
from specbatch.engine.dtype_choice import concrete_dtype
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.model_paths import ModelLoadError
from specbatch.engine.paged_cache import ATTENTION_NAME
from specbatch.sched.capacity import kv_bytes_per_token

log = logging.getLogger(__name__)

# What reading a truncated or corrupt weight file raises (none is an OSError or a ValueError;
# RuntimeError is torch's zip reader on a .bin): that model is unusable, a one-line error (exit 2),
# not an internal failure the job retries.
CORRUPT_WEIGHTS = (SafetensorError, UnpicklingError, RuntimeError)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Model types whose layers keep recurrent or convolutional state that a KV cache cannot hold; the
# `layer_types` check below catches most hybrids, these declare no (or too few) layer types.
RECURRENT_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "zamba", "zamba2", "falcon_h1", "granitemoehybrid",
    "nemotron_h", "recurrent_gemma", "rwkv", "xlstm", "lfm2", "lfm2_moe",
})
ALIBI_MODEL_TYPES = frozenset({"bloom", "mpt"})
# Model types whose attention is their own code, not transformers' `AttentionInterface`, which is how
# the engine's flat passes reach every layer's attention over the paged cache (`engine/paged_cache.py`)
OWN_ATTENTION_MODEL_TYPES = frozenset({"gpt_neo"})
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})  # sliding: see the window check


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    value_head_dim: int
    max_positions: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype.itemsize)


def max_positions(config: PreTrainedConfig) -> int:
    """The position limit of a text config (learned or rotary positions alike)."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048


def kv_shape(model: PreTrainedModel) -> KVShape:
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KVShape(config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads,
                   head_dim, getattr(config, "v_head_dim", None) or head_dim, max_positions(config))


def unsupported_reason(config: PreTrainedConfig) -> str | None:
    """Why the engine cannot serve this model exactly, or None if it can.

    The engine's passes attend causally over every cached position of a row (paged, through the
    attention interface) and keep only attention keys and values, so a model that masks differently
    or keeps other state would run wrong."""
    text = config.get_text_config()
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported: the engine serves decoder-only causal LMs"
    layer_types = set(getattr(text, "layer_types", None) or ())
    if text.model_type in RECURRENT_MODEL_TYPES or layer_types - ATTENTION_LAYER_TYPES:
        kinds = sorted(layer_types - ATTENTION_LAYER_TYPES) or ["recurrent"]
        return (f"hybrid or recurrent layers (model_type={text.model_type!r}, layer types {kinds}) are not "
                "supported: the KV cache holds attention keys and values only, not recurrent state")
    if text.model_type in OWN_ATTENTION_MODEL_TYPES:
        return (f"{text.model_type!r} computes attention in its own code, not through transformers' attention "
                "interface, which the engine's paged passes need")
    if text.model_type in ALIBI_MODEL_TYPES or getattr(text, "alibi", False):
        return ("ALiBi position bias is not supported: the model builds it from a 2D padding mask, and the "
                "engine attends by its own causal rule")
    return _window_reason(text)


def _window_reason(text: PreTrainedConfig) -> str | None:
    positions = max_positions(text)
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
    if window is None or window >= positions:  # a window as long as the context masks nothing
        return None
    return (f"sliding-window attention (config.sliding_window={window}) is not supported: the engine masks full causal "
            f"attention, so positions more than {window} back would be attended to; a window at least the "
            f"model's {positions} positions long is accepted")


def read_config(name: str, models: ModelsConfig) -> PreTrainedConfig:
    """A model's config.json, refused here if the engine cannot run the model exactly."""
    path = model_dir(name)  # its own errors say what is wrong
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=models.trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"cannot read the model config at {name}: {error}") from error
    if (reason := unsupported_reason(config)) is not None:
        raise ModelLoadError(f"model {name!r} cannot be served exactly: {reason}")
    return config


def load_tokenizer(models: ModelsConfig) -> PreTrainedTokenizerBase:
    path = model_dir(models.tokenizer or models.target, need_config=False)
    if not path.is_dir():
        raise ModelLoadError(f"tokenizer path {path} is not a directory")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=models.trust_remote_code)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {error}") from error


def load_model(name: str, models: ModelsConfig, device: str | None = None) -> PreTrainedModel:
    """Load `name` in the job's dtype and attention kernel onto `device` (default: models.device)."""
    path, config = model_dir(name), read_config(name, models)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=DTYPES[concrete_dtype(models.dtype, models.device)],
            attn_implementation=ATTENTION_NAME,
            trust_remote_code=models.trust_remote_code,
        )
    except (OSError, ValueError, KeyError, *CORRUPT_WEIGHTS) as error:
        raise ModelLoadError(f"cannot load a causal LM from {path}: {error}") from error
    return model.to(device or models.device).eval()  # type: ignore[arg-type]  # transformers' typing of .to


def check_same_tokenizer(target_dir: str, draft_dir: str, tokenizer: PreTrainedTokenizerBase,
                         models: ModelsConfig) -> None:
    """A draft is only usable if it tokenizes exactly as the target does."""
    draft_path = model_dir(draft_dir)
    if not any((draft_path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return  # a draft without its own tokenizer files is assumed to share the target's
    draft_tokenizer = AutoTokenizer.from_pretrained(draft_path, trust_remote_code=models.trust_remote_code)
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ModelLoadError(f"draft {draft_dir!r} does not share the target {target_dir!r}'s tokenizer")


def context_limit(models: ModelsConfig) -> int:
    """The target's (and draft's) position limit, read from config.json without loading weights; an
    unsupported model is refused here too, before a job is prepared."""
    return min(max_positions(read_config(name, models).get_text_config())
               for name in filter(None, (models.target, models.draft)))
