"""The vLLM peer of `specbatch bench --peer vllm`, run by the peer's own Python (benchmarks/peer/setup_vllm.sh).

Reads a JSON request from `specbatch.lab.peer` (model paths, token-id prompts with their
max_new_tokens, batch sizes, modes, automatic prefix caching on and/or off), and for each batch size,
mode and prefix-caching setting starts one engine, times its start-up apart, runs every prompt as
a `TokensPrompt` (greedy, at the dtype the target runs at in specbatch; under its structured output,
with vLLM's llguidance backend, where the prompt has one) and writes token ids, finish reasons and seconds.
A mode the engine refuses is reported with its error instead of stopping the others. This file
imports only vLLM and the standard library: the project's venv cannot import vLLM, nor this one specbatch.

    PEER_VENV/bin/python specbatch/lab/vllm_runner.py REQUEST.json RESULT.json
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback


def speculative_config(mode: str, request: dict) -> dict | None:
    k = request["num_speculative_tokens"]
    if mode == "none":
        return None
    if mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": request["ngram_min"],
                "prompt_lookup_max": request["ngram_max"]}
    if mode == "draft":
        return {"method": "draft_model", "model": request["draft"], "num_speculative_tokens": k}
    if mode == "eagle":
        return {"method": "eagle3", "model": request["eagle"], "num_speculative_tokens": k}
    raise ValueError(f"unknown peer mode {mode!r}")


def run_mode(mode: str, batch_rows: int, request: dict, prefix_caching: bool = True) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    constrained = any(p.get("structured_output") for p in request["prompts"])
    started = time.perf_counter()
    llm = LLM(model=request["target"], tokenizer=request["target"], skip_tokenizer_init=not constrained,
              dtype=request["dtype"], max_num_seqs=batch_rows, max_model_len=request["max_model_len"],
              kv_cache_memory_bytes=request["kv_cache_bytes"], enforce_eager=request["enforce_eager"],
              speculative_config=speculative_config(mode, request), enable_prefix_caching=prefix_caching, seed=0,
              structured_outputs_config={"backend": "guidance"} if constrained else None)
    startup_s = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in request["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=p["max_new_tokens"], stop_token_ids=request["eos"],
                             detokenize=False,
                             structured_outputs=StructuredOutputsParams(**p["structured_output"])
                             if p.get("structured_output") else None) for p in request["prompts"]]
    llm.generate(prompts[:batch_rows], params[:batch_rows], use_tqdm=False)  # warm-up, as specbatch's bench does
    # the warm-up's prompts leave their KV in vLLM's prefix cache, and the timed run would skip their
    # prefill (all of it where the batch holds every prompt); specbatch's timed runs start cold
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache after the warm-up")
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall_s = time.perf_counter() - started
    del llm
    gc.collect()
    return {"mode": mode, "batch_rows": batch_rows, "prefix_caching": prefix_caching, "startup_s": startup_s,
            "wall_s": wall_s,
            "outputs": {p["request_id"]: list(o.outputs[0].token_ids)
                        for p, o in zip(request["prompts"], outputs, strict=True)},
            "finish_reasons": {p["request_id"]: o.outputs[0].finish_reason
                               for p, o in zip(request["prompts"], outputs, strict=True)}}


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as file:
        request = json.load(file)
    results = []
    for batch_rows in request["batch_sizes"]:
        for mode, caching in ((m, c) for m in request["modes"] for c in request.get("prefix_caching", [True])):
            try:
                results.append(run_mode(mode, batch_rows, request, caching))
            except Exception as error:  # one refused mode (a head it cannot load) must not stop the rest
                results.append({"mode": mode, "batch_rows": batch_rows, "prefix_caching": caching,
                                "error": f"{type(error).__name__}: {error}".splitlines()[0][:500],
                                "traceback": traceback.format_exc()[-4000:]})
            with open(result_path, "w") as file:  # after every run: a crash later keeps what ran
                json.dump({"vllm_version": _version(), "results": results}, file)


def _version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
