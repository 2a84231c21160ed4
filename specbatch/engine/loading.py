"""Loading a target/draft pair and tokenizer from local Hugging Face directories.

`bundled:target` and `bundled:draft` name the demo pair shipped inside the package. Nothing is
fetched from a hub; `trust_remote_code` stays off unless the config turns it on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from specbatch.config import ModelsConfig
from specbatch.sched.capacity import kv_bytes_per_token

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "models" / "demo"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(ValueError):
    """An unusable model path or pair; the CLI reports it and exits with code 2."""


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    value_head_dim: int
    max_positions: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype.itemsize)


def resolve_dir(name: str) -> Path:
    if name.startswith("bundled:"):
        return BUNDLED_DIR / name.split(":", 1)[1]
    return Path(name).expanduser()


def resolve_model_path(name: str) -> Path:
    path = resolve_dir(name)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model path {name!r} is not a local Hugging Face model directory (no config.json)")
    return path


def kv_shape(model: PreTrainedModel) -> KVShape:
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
    return KVShape(config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads,
                   head_dim, getattr(config, "v_head_dim", None) or head_dim, positions)


def load_tokenizer(models: ModelsConfig) -> PreTrainedTokenizerBase:
    path = resolve_dir(models.tokenizer or models.target)
    if not path.is_dir():
        raise ModelLoadError(f"tokenizer path {path} is not a directory")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=models.trust_remote_code)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {error}") from error


def load_model(name: str, models: ModelsConfig) -> PreTrainedModel:
    path = resolve_model_path(name)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[models.dtype], attn_implementation=models.attn_implementation,
            trust_remote_code=models.trust_remote_code,
        )
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"cannot load a causal LM from {path}: {error}") from error
    return model.to(models.device).eval()  # type: ignore[arg-type]  # transformers' typing of .to


def check_same_tokenizer(target_dir: str, draft_dir: str, tokenizer: PreTrainedTokenizerBase,
                         models: ModelsConfig) -> None:
    """A draft is only usable if it tokenizes exactly as the target does."""
    draft_path = resolve_model_path(draft_dir)
    if not any((draft_path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return  # a draft without its own tokenizer files is assumed to share the target's
    draft_tokenizer = AutoTokenizer.from_pretrained(draft_path, trust_remote_code=models.trust_remote_code)
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ModelLoadError(f"draft {draft_dir!r} does not share the target {target_dir!r}'s tokenizer")


def context_limit(models: ModelsConfig) -> int:
    """The target's (and draft's) position limit, read from config.json without loading weights."""
    from transformers import AutoConfig

    limits = []
    for name in filter(None, (models.target, models.draft)):
        try:
            config = AutoConfig.from_pretrained(resolve_model_path(name),
                                                trust_remote_code=models.trust_remote_code).get_text_config()
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"cannot read the model config at {name}: {error}") from error
        limits.append(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048)
    return min(limits)
