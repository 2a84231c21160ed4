"""The Llama family's native step (`engine/native_llama.py`): one flat pass gives the logits of the
family's own Hugging Face forward, for each covered family (biases, per-head norms, tied embeddings),
a job through it is exact, and the tensors it fuses are the model's own (its projections views of them)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from transformers import AutoConfig, AutoModelForCausalLM

from specbatch.engine.build import load_models
from specbatch.engine.forward import PagedModel
from specbatch.engine.loading import kv_shape
from specbatch.engine.native_llama import NativeLlama, native_reason
from specbatch.engine.packed_linear import packs
from specbatch.engine.paged_cache import ATTENTION_NAME, PagedKVCache
from specbatch.engine.panel_rows import panel_rows
from specbatch.engine.streamed_gemm import serves

TINY = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=128)
FAMILIES = {
    "llama": dict(TINY, tie_word_embeddings=True),
    "llama-biases": dict(TINY, attention_bias=True),  # q/k/v and output biases
    "mistral": dict(TINY, sliding_window=None),
    "qwen2": TINY,  # q/k/v biases
    "qwen3": dict(TINY, head_dim=16),  # per-head q/k RMSNorm
}


def family_model(family: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(3)
    config = AutoConfig.for_model(family.split("-")[0], **FAMILIES[family])
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION_NAME, dtype=dtype).eval()
    with torch.no_grad():  # initialised to zeros, a bias the step dropped would go unseen
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.5)
    return model


# float64: the same maths as Hugging Face's to rounding; float32: through the streamed kernel's GEMMs
# (`engine/packed_linear.py`) with their fused residual, gate and SiLU, which sum in another order
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_native_pass_gives_the_familys_own_logits(family, dtype, tolerance):
    model = family_model(family, dtype)
    assert native_reason(model) is None
    shape = kv_shape(model)
    cache = PagedKVCache(shape.num_layers, 32, 4, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
    native = NativeLlama(model)
    laid_out = native.layers[0].qkv.panels is not None
    assert laid_out == (dtype == torch.float32 and packs(native.lm_head.weight))  # float64 runs in torch
    paged = PagedModel(model, cache, native=native)
    # three rows prefill their prompts but the last token, then verify windows of 2, 1 and 3 tokens
    prompts = [[5, 9, 17, 3, 44, 2, 8], [70, 33], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    windows = [[prompts[0][-1], 7], [33], [prompts[2][-1], 1, 2]]
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    paged.forward(tables, [0, 0, 0], [prompt[:-1] for prompt in prompts], keep_logits=False)
    logits, _ = paged.forward(tables, [len(prompt) - 1 for prompt in prompts], windows)
    assert logits is not None
    expected = []
    for prompt, window in zip(prompts, windows, strict=True):
        with torch.no_grad():
            full = model(torch.tensor([prompt[:-1] + window])).logits[0]  # [prompt + drafts, vocab]
        expected.append(full[len(prompt) - 1 :])
    torch.testing.assert_close(logits, torch.cat(expected), rtol=0, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_c_layer_loop_gives_the_python_loops_bits(family, dtype):
    """The layers in one C call (`engine/layer_loop.py`) run the Python loop's kernels with its arguments:
    the same logits, layer inputs and cache, bit for bit; Qwen3's per-head norms keep the Python loop."""
    if not serves(dtype) or panel_rows(dtype) < 4:
        pytest.skip(f"{dtype} GEMMs do not stream here at 4 rows")
    model = family_model(family, dtype)
    shape = kv_shape(model)
    prompts = [[5, 9, 17, 3, 44, 2, 8], [70, 33], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    windows = [[prompts[0][-1], 7], [33], [prompts[2][-1]]]  # 4 tokens: within the panels' rows anywhere
    outputs = []
    for loop in (True, False):
        native = NativeLlama(model)
        assert (native.loop is not None) == (family != "qwen3")
        native.loop = native.loop if loop else None
        cache = PagedKVCache(shape.num_layers, 32, 4, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
        paged = PagedModel(model, cache, native=native)
        paged.feature_layers = (0, 1, 2)  # the inputs of each layer and the final norm's output, as EAGLE reads
        tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        paged.forward(tables, [0, 0, 0], [prompt[:-1] for prompt in prompts], keep_logits=False)
        logits, _ = paged.forward(tables, [len(prompt) - 1 for prompt in prompts], windows)
        outputs.append((logits, paged.features, *cache.keys, *cache.values))
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(*outputs, strict=True))


def test_fused_weights_are_the_models_own():
    model = family_model("qwen2")
    native = NativeLlama(model)
    attention = model.model.layers[0].self_attn
    keys = native.layers[0].qkv.weight[attention.q_proj.weight.shape[0]:]
    assert attention.k_proj.weight.data_ptr() == keys.data_ptr()
    assert attention.v_proj.bias.data_ptr() != 0 and native.layers[0].qkv.bias is not None


def test_families_without_a_native_step_say_why():
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2))
    assert "no native step" in native_reason(gpt2)


@pytest.mark.parametrize("native", [True, False])
def test_a_job_is_exact_through_either_step(tiny_pair, native):
    config = tiny_config(tiny_pair, f"models.native={native}", "scheduler.max_batch_rows=7")
    models = load_models(config)
    tokenizer = tiny_pair[2]
    requests = random_prompts(tokenizer, 14, seed=4)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    rows, _, engine = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    assert (engine.backend.target.native is not None) == native
