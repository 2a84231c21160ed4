"""Greedy outputs in bfloat16 and float16 on the CPU against the target's own greedy decoding.

In a low-precision dtype a matmul's rounding depends on the shapes it runs at (batch rows, query
positions, padded KV length), so a batched or speculative pass can flip a near-tied argmax that HF
`generate` at batch 1 does not. Per dtype, batch size and drafter this prints the share of requests
whose output is identical to HF greedy at batch 1 in the same dtype, the mean position (output
token index) of the first difference over the requests that differ, and the share identical to the
engine's own plain decoding (drafter none) at the same batch size, which isolates speculation.
`--pair random` swaps the trained bundled pair for a random tiny Llama (hidden 64, 2 layers) and a
perturbed copy: near-flat logits, so near-ties everywhere, the worst case.

    .venv/bin/python benchmarks/low_precision_divergence.py [--pair bundled|random] [--attn sdpa|eager]
        [--prompts 32] [--max-new-tokens 64] [--batch-sizes 1 32]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import mean

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specbatch.config import load_config
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.lab.prompts import BenchPrompt, heldout_prompts
from specbatch.loop import MemoryRecorder, generate

DTYPES = ("float32", "bfloat16", "float16")
DRAFTERS = ("none", "ngram", "draft")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output position where a and b differ (a length difference counts), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def hf_greedy(model, prompts: list[BenchPrompt], eos: int, pad: int) -> list[list[int]]:
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt.prompt_ids])
        out = model.generate(ids, max_new_tokens=prompt.max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=pad)
        outputs.append(out[0, ids.shape[1]:].tolist())
    return outputs


def random_pair(root: Path) -> list[str]:
    """A random tiny Llama target and a noisy copy as draft, sharing the bundled tokenizer."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         initializer_range=0.2, eos_token_id=0, pad_token_id=1, bos_token_id=None)
    target = LlamaForCausalLM(config).eval()
    target.save_pretrained(root / "target")
    with torch.no_grad():
        for parameter in target.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1 * parameter.std().clamp(min=1e-3))
    target.save_pretrained(root / "draft")
    return [f"models.target={root / 'target'}", f"models.draft={root / 'draft'}",
            "models.tokenizer=bundled:target"]


def engine_greedy(settings: list[str], drafter: str, batch: int, models,
                  prompts: list[BenchPrompt]) -> list[list[int]]:
    config = load_config(None, [*settings, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}"])
    rows = generate(build_hf_engine(config, models, MemoryRecorder()), [p.to_row() for p in prompts])
    return [rows[p.request_id].output_ids for p in prompts]


def summary(outputs: list[list[int]], refs: list[list[int]]) -> tuple[float, str]:
    firsts = [f for o, r in zip(outputs, refs, strict=True) if (f := first_difference(o, r)) is not None]
    share = 1 - len(firsts) / len(refs)
    return share, f"{mean(firsts):.1f}" if firsts else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["bundled", "random"], default="bundled")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    pair = random_pair(Path(tempfile.mkdtemp())) if args.pair == "random" else []
    print(f"{args.pair} pair on the CPU, {args.attn}, {args.prompts} held-out prompts, max_new_tokens ≤ "
          f"{args.max_new_tokens}; reference: HF generate, batch 1, same dtype and attention")
    print("dtype     batch  drafter  identical_to_hf  mean_first_divergence  identical_to_own_plain")
    for dtype in DTYPES:
        settings = [*pair, f"models.dtype={dtype}", f"models.attn_implementation={args.attn}", "models.num_threads=1"]
        models = load_models(load_config(None, settings))
        prompts = heldout_prompts(models.tokenizer, args.prompts, args.max_new_tokens)
        eos, pad = models.tokenizer.eos_token_id, models.tokenizer.pad_token_id
        refs = hf_greedy(models.target, prompts, eos, pad)
        for batch in args.batch_sizes:
            plain = engine_greedy(settings, "none", batch, models, prompts)
            for drafter in DRAFTERS:
                outputs = plain if drafter == "none" else engine_greedy(settings, drafter, batch, models, prompts)
                share, first = summary(outputs, refs)
                own, _ = summary(outputs, plain)
                print(f"{dtype:9} {batch:5}  {drafter:7}  {share:15.3f}  {first:>21}  {own:22.3f}", flush=True)


if __name__ == "__main__":
    main()
