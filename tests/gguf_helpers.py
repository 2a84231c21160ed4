"""GGUF files written as llama.cpp's `convert_hf_to_gguf.py` writes them, for tests and benchmarks
that need one without downloading it: a Hugging Face Llama (F32 tensors, so it loads back bit-exact)
and its byte-level BPE tokenizer as `tokenizer.ggml.*` metadata, or a header-only file of any
architecture."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

LLAMA = gguf.MODEL_ARCH.LLAMA


def write_llama_gguf(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, path: Path) -> Path:
    """`model` and `tokenizer` as one GGUF file at `path`."""
    config = model.config
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[LLAMA])
    writer.add_name("tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    _add_tokenizer(writer, tokenizer)
    for name, tensor in _llama_tensors(model):
        writer.add_tensor(name, tensor)
    _finish(writer)
    return path


def write_header_only_gguf(path: Path, arch: gguf.MODEL_ARCH) -> Path:
    """A GGUF that declares `arch` and holds one tensor: enough for a loader to refuse it."""
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(1)
    writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_EMBD] + ".weight", np.zeros((4, 8), np.float32))
    _finish(writer)
    return path


def _llama_tensors(model: LlamaForCausalLM):
    """(GGUF name, array) per weight; Q and K rows permuted as llama.cpp's rotary layout wants them
    (transformers' GGUF loader permutes them back)."""
    config = model.config
    names = gguf.get_tensor_name_map(LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # no `output.weight`: the file says tied by leaving it out
        data = tensor.detach().float().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, config.num_attention_heads, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, config.num_attention_heads, config.num_key_value_heads)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"no GGUF name for {hf_name}"
        yield name, data


def _permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary halves interleaved."""
    if n_head_kv != n_head:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerBase) -> None:
    """A byte-level BPE as convert_hf_to_gguf.py's `_set_vocab_gpt2` writes it."""
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    tokens, types = [], []
    for index in range(len(tokenizer)):
        tokens.append(by_id.get(index, f"[PAD{index}]"))
        types.append(gguf.TokenType.UNUSED if index not in by_id else
                     gguf.TokenType.CONTROL if index in special else gguf.TokenType.NORMAL)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]  # as llama.cpp reads tokenizer.json
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in merges])
    if tokenizer.eos_token_id is not None:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
