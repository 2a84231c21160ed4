"""`specbatch bench`: the same held-out prompts through HF `generate` (as its users batch it),
specbatch with each drafter, and HF assisted generation, side by side in one process.

Speed claims live here, never in timed unit tests. Every row also reports the work behind its
speed (target passes and rows per token, padding, acceptance) and `exact_match` against the
target's own greedy decoding of each prompt alone.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers.utils import logging as hf_logging

from specbatch.config import JobConfig, load_config
from specbatch.core import Row, SamplingParams
from specbatch.engine.build import Models, build_hf_engine, eos_token_ids, load_models
from specbatch.loop import MemoryRecorder
from specbatch.models.corpus import documents


@dataclass(frozen=True)
class Prompt:
    request_id: str
    domain: str
    token_ids: list[int]
    max_new_tokens: int


@dataclass
class BenchResult:
    name: str
    tokens_per_s: float
    ratio_vs_hf_generate: float | None
    target_passes_per_token: float | None  # None where the library does not expose its work
    target_rows_per_token: float | None
    padded_share: float | None
    acceptance: float | None
    tokens_per_pass: float | None
    tokens_per_pass_theory: float | None
    exact_match: float
    num_prompts: int
    num_tokens: int
    wall_s: float


def heldout_prompts(tokenizer, num_prompts: int, max_new_tokens: int, prompt_tokens: int = 48,
                    seed: int = 0) -> list[Prompt]:
    """Half code, half prose held-out documents; a prompt is a document's first tokens, and
    max_new_tokens is drawn per request from [16, max_new_tokens]."""
    rng = random.Random(seed)
    pools = {domain: documents(domain, "heldout") for domain in ("code", "prose")}
    for pool in pools.values():
        rng.shuffle(pool)
    prompts = []
    for index in range(num_prompts):
        domain = ("code", "prose")[index % 2]
        doc = pools[domain][(index // 2) % len(pools[domain])]
        ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"][:prompt_tokens]
        prompts.append(Prompt(f"{domain}-{index:04d}", domain, ids, rng.randint(min(16, max_new_tokens), max_new_tokens)))
    return prompts


@torch.no_grad()
def greedy_references(models: Models, prompts: list[Prompt]) -> dict[str, list[int]]:
    """The target's own greedy decoding of each prompt alone (batch size 1)."""
    eos, pad = sorted(eos_token_ids(models)), models.tokenizer.pad_token_id
    refs = {}
    for prompt in prompts:
        out = models.target.generate(torch.tensor([prompt.token_ids]), max_new_tokens=prompt.max_new_tokens,
                                     do_sample=False, eos_token_id=eos, pad_token_id=pad)
        refs[prompt.request_id] = out[0, len(prompt.token_ids):].tolist()
    return refs


def cut(tokens: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


@torch.no_grad()
def run_hf_generate(models: Models, prompts: list[Prompt], batch_size: int) -> tuple[dict, dict]:
    """Fixed-size batches in dataset order, left padding, greedy, the batch's largest max_new_tokens."""
    eos = eos_token_ids(models)
    pad = models.tokenizer.pad_token_id if models.tokenizer.pad_token_id is not None else sorted(eos)[0]
    outputs, passes, rows = {}, 0, 0
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p.token_ids) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p.token_ids)) + p.token_ids for p in batch])
        mask = torch.tensor([[0] * (width - len(p.token_ids)) + [1] * len(p.token_ids) for p in batch])
        out = models.target.generate(ids, attention_mask=mask, max_new_tokens=max(p.max_new_tokens for p in batch),
                                     do_sample=False, eos_token_id=sorted(eos), pad_token_id=pad)
        steps = out.shape[1] - width
        passes += steps
        rows += len(batch) * width + len(batch) * max(steps - 1, 0)
        for row, prompt in enumerate(batch):
            outputs[prompt.request_id] = cut(out[row, width:].tolist(), prompt.max_new_tokens, eos)
    return outputs, {"passes": passes, "rows": rows}


@torch.no_grad()
def run_hf_assisted(models: Models, prompts: list[Prompt]) -> dict:
    eos = eos_token_ids(models)
    outputs = {}
    for prompt in prompts:
        out = models.target.generate(torch.tensor([prompt.token_ids]), assistant_model=models.draft,
                                     max_new_tokens=prompt.max_new_tokens, do_sample=False,
                                     eos_token_id=sorted(eos), pad_token_id=models.tokenizer.pad_token_id)
        outputs[prompt.request_id] = cut(out[0, len(prompt.token_ids):].tolist(), prompt.max_new_tokens, eos)
    return outputs


def run_specbatch(config: JobConfig, models: Models, prompts: list[Prompt]) -> tuple[dict, MemoryRecorder]:
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder)
    rows = [Row(p.request_id, list(p.token_ids), SamplingParams(max_new_tokens=p.max_new_tokens), p.domain)
            for p in prompts]
    for row in rows:
        engine.add(row)
    engine.run()
    return {row.request_id: row.output_ids for row in rows}, recorder


def exact_share(outputs: dict, refs: dict) -> float:
    return sum(outputs[key] == refs[key] for key in outputs) / max(len(outputs), 1)


def theory_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected committed tokens per verified row, (1 − α^(k+1)) / (1 − α), for per-token acceptance α
    and lookahead k (rows proposing fewer than k drafts, as n-gram lookup does, fall below it)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def summarize_engine(name, outputs, recorder, refs, wall_s, k) -> BenchResult:
    tokens = sum(len(v) for v in outputs.values())
    rounds = recorder.rounds
    target_rows = sum(r.num_target_rows for r in rounds)
    padded = sum(r.num_padded_target_rows for r in rounds)
    proposed, accepted = sum(r.num_proposed for r in rounds), sum(r.num_accepted for r in rounds)
    acceptance = accepted / proposed if proposed else None
    # per-token α: of the drafts the rule reached, the share it accepted (a rejection ends a block)
    rejections = sum(1 for s in recorder.steps if s.num_accepted < s.num_proposed)
    alpha = accepted / (accepted + rejections) if proposed else None
    row_verifies = sum(r.num_decode_rows for r in rounds)
    return BenchResult(
        name, tokens / wall_s, None, sum(r.num_target_passes for r in rounds) / tokens,
        (target_rows + padded) / tokens, padded / max(target_rows + padded, 1), acceptance,
        tokens / max(row_verifies, 1), theory_tokens_per_pass(alpha, k) if alpha is not None else None,
        exact_share(outputs, refs), len(outputs), tokens, wall_s,
    )


def run_bench(num_prompts: int, max_new_tokens: int, batch_size: int, config_path: Path | None = None,
              overrides: list[str] | None = None, assisted_prompts: int | None = None,
              console: Console | None = None) -> list[BenchResult]:
    console = console or Console()
    base = load_config(config_path, [*(overrides or []), f"scheduler.max_batch_rows={batch_size}"])
    models = load_models(base)
    prompts = heldout_prompts(models.tokenizer, num_prompts, max_new_tokens, seed=base.seed)
    console.print(f"[bold]bench[/] {len(prompts)} prompts, max_new_tokens 16..{max_new_tokens}, batch {batch_size}")
    hf_logging.set_verbosity_error()
    refs = greedy_references(models, prompts)  # also warms the target up before anything is timed
    if models.draft is not None:
        run_specbatch(base, models, prompts[:batch_size])  # warm the draft and engine paths up
    results: list[BenchResult] = []

    started = time.perf_counter()
    outputs, work = run_hf_generate(models, prompts, batch_size)
    wall = time.perf_counter() - started
    tokens = sum(len(v) for v in outputs.values())
    useful_rows = sum(len(p.token_ids) + len(outputs[p.request_id]) - 1 for p in prompts)
    results.append(BenchResult("hf-generate", tokens / wall, 1.0, work["passes"] / tokens, work["rows"] / tokens,
                               max(0.0, 1 - useful_rows / work["rows"]), None, 1.0, None,
                               exact_share(outputs, refs), len(prompts), tokens, wall))
    k = int(base.scheduler.lookahead.split(":")[1]) if base.scheduler.lookahead.startswith("fixed") else 0
    for drafter in ("none", "draft", "ngram"):
        config = load_config(config_path, [*(overrides or []), f"scheduler.max_batch_rows={batch_size}",
                                           f"drafter.kind={drafter}"])
        if drafter == "draft" and models.draft is None:
            continue
        started = time.perf_counter()
        outputs, recorder = run_specbatch(config, models, prompts)
        wall = time.perf_counter() - started
        results.append(summarize_engine(f"specbatch-{drafter}", outputs, recorder, refs, wall, 0 if drafter == "none" else k))
    if models.draft is not None:
        subset = prompts[: assisted_prompts or len(prompts)]
        started = time.perf_counter()
        outputs = run_hf_assisted(models, subset)
        wall = time.perf_counter() - started
        tokens = sum(len(v) for v in outputs.values())
        results.append(BenchResult("hf-assisted", tokens / wall, None, None, None, None, None, None, None,
                                   exact_share(outputs, refs), len(subset), tokens, wall))
    for result in results:
        result.ratio_vs_hf_generate = result.tokens_per_s / results[0].tokens_per_s
    print_results(results, console)
    return results


def print_results(results: list[BenchResult], console: Console) -> None:
    table = Table(title="specbatch bench")
    columns = {"name": "name", "tokens_per_s": "tok/s", "ratio_vs_hf_generate": "× hf-gen",
               "target_passes_per_token": "passes/tok", "target_rows_per_token": "rows/tok", "padded_share": "padded",
               "acceptance": "accept", "tokens_per_pass": "tok/pass", "tokens_per_pass_theory": "theory",
               "exact_match": "exact", "num_prompts": "n"}
    for column, header in columns.items():
        table.add_column(header, justify="left" if column == "name" else "right", no_wrap=True)
    for result in results:
        values = asdict(result)
        table.add_row(*(_fmt(values[c]) for c in columns))
    console.print(table)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_json(results: list[BenchResult], path: Path) -> None:
    Path(path).write_text(json.dumps({"results": [asdict(r) for r in results]}, indent=2) + "\n")
