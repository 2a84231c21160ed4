"""The rotary table (`engine/rotary_table.py`): a position's cos and sin looked up are the bits the model's
own rotary module computes for it in a pass, for every static rope type, in float32 and bfloat16, while
the table grows; rope types whose frequencies follow the sequence length are not tabled."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specbatch.engine.rotary_table import CHUNK_POSITIONS, RotaryTable

TINY = dict(vocab_size=96, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=4096)
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
}


def rotary_of(family: str, rope: dict, dtype: torch.dtype):
    config = AutoConfig.for_model(family, **TINY, rope_parameters=rope)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).model.rotary_emb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_looked_up_rows_are_the_modules_own(family, rope, dtype):
    rotary = rotary_of(family, ROPES[rope], dtype)
    assert RotaryTable.serves(rotary)
    table = RotaryTable(rotary, dtype, torch.device("cpu"))
    like = torch.empty(1, 1, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    # a decode step, a verify window, rows at scattered positions, a prefill chunk past the first fill
    passes = [[7], [40, 41, 42, 43, 44], torch.randint(0, 300, (9,), generator=generator).tolist(),
              list(range(CHUNK_POSITIONS - 3, 3 * CHUNK_POSITIONS + 5)), [3000]]
    for positions in passes:
        ids = torch.tensor(positions)
        cos, sin = table.lookup(ids, max(positions) + 1)
        expected_cos, expected_sin = rotary(like, ids[None])
        assert torch.equal(cos, expected_cos[0]) and torch.equal(sin, expected_sin[0])
    assert table.cos.shape[0] >= 3001


def test_rope_types_that_follow_the_sequence_length_are_not_tabled():
    rotary = rotary_of("llama", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, torch.float32)
    assert not RotaryTable.serves(rotary)
