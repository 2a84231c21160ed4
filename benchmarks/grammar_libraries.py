"""Which grammar library specbatch uses (issue 42): xgrammar vs llguidance on the same work.

For each tokenizer (the bundled demo's 4k vocabulary, SmolLM2's 49k): the time to build the
library's tokenizer view, to compile one extraction schema (cold), and per decoding step over a
valid answer's tokens: a mask fill, and a consume + rollback (what speculation adds per draft).
Also how many of the answer's tokens the library reports forced (single continuation).

Run: OMP_NUM_THREADS=1 python benchmarks/grammar_libraries.py   (single thread; the lead times later)
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import llguidance.torch
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict in the stub alone

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "city": {"type": "string", "enum": ["Paris", "London", "Berlin", "Madrid"]},
    "tags": {"type": "array", "items": {"type": "string"}}, "married": {"type": "boolean"}},
    "required": ["name", "age", "city", "tags", "married"], "additionalProperties": False}
ANSWER = '{"name": "Ada Lovelace", "age": 36, "city": "London", "tags": ["math", "poetry"], "married": true}'


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def bench_xgrammar(tok, eos: int, vocab: int, ids: list[int]) -> dict:
    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    tokenizer_ms = ms(start)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_ms = ms(start)
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, vocab)
    fill, step, forced = 0.0, 0.0, 0
    for token in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        fill += ms(start)
        forced += int(_popcount(mask[0]) == 1)
        start = time.perf_counter()
        assert matcher.accept_token(token)
        matcher.rollback(1)
        matcher.accept_token(token)
        step += ms(start)
    return {"tokenizer_ms": tokenizer_ms, "compile_ms": compile_ms, "fill_us": 1000 * fill / len(ids),
            "consume_rollback_us": 1000 * step / len(ids), "forced": forced}


def bench_llguidance(tok, eos: int, vocab: int, ids: list[int]) -> dict:
    start = time.perf_counter()
    info = llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=eos)
    tokenizer_ms = ms(start)
    start = time.perf_counter()
    defaults: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults=defaults)
    matcher = llguidance.LLMatcher(info, grammar)
    assert not matcher.is_error(), matcher.get_error()
    compile_ms = ms(start)
    mask = llguidance.torch.allocate_token_bitmask(1, vocab)
    fill, step, forced = 0.0, 0.0, 0
    for token in ids:
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        fill += ms(start)
        forced += int(_popcount(mask[0]) == 1)
        start = time.perf_counter()
        assert matcher.consume_token(token), matcher.get_error()
        matcher.rollback(1)
        matcher.consume_token(token)
        step += ms(start)
    return {"tokenizer_ms": tokenizer_ms, "compile_ms": compile_ms, "fill_us": 1000 * fill / len(ids),
            "consume_rollback_us": 1000 * step / len(ids), "forced": forced}


def _popcount(words: torch.Tensor) -> int:
    bits = (words[:, None].to(torch.int64) >> torch.arange(32)) & 1
    return int(bits.sum())


def main() -> None:
    from specbatch.engine.gguf_models import model_dir
    from specbatch.engine.model_paths import resolve_dir

    for name, path in (("demo", resolve_dir("bundled:target")), ("smollm2-135m", model_dir("smollm2-135m"))):
        tok = AutoTokenizer.from_pretrained(path)
        vocab = len(tok)
        ids = tok.encode(ANSWER, add_special_tokens=False)
        eos = tok.eos_token_id
        for library, bench in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            result = bench(tok, eos, vocab, ids)
            print(json.dumps({"tokenizer": name, "vocab": vocab, "library": library, "tokens": len(ids),
                              **{key: round(value, 2) for key, value in result.items()}}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
