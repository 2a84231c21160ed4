#!/usr/bin/env bash
# Issue 34's grid on a real model, SmolLM2-135M-Instruct (models.target=smollm2-135m), fp32, greedy.
# Run it alone on the machine (timings): tables go to benchmarks/results/smollm2-*.txt and .json.
#   benchmarks/smollm2_grid.sh [EAGLE_HEAD_DIR]     (default: outputs/models/smollm2-eagle, if it exists)
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
eagle=${1:-outputs/models/smollm2-eagle}
drafters=none,ngram,suffix
sets=(--set models.target=smollm2-135m)
if [ -f "$eagle/config.json" ]; then drafters=$drafters,eagle; sets+=(--set "models.eagle=$eagle"); fi
bench() { COLUMNS=250 .venv/bin/specbatch bench "${sets[@]}" "$@"; }
# held-out code and chat requests at batch 1, then 8 and 32 with vLLM's CPU build beside it
bench --workload instruct --prompts 8 --max-new-tokens 64 --batch-size 1 --drafters $drafters \
    --lookahead fixed:2,fixed:4,adaptive --json $out/smollm2-instruct-b1.json | tee $out/smollm2-instruct-b1.txt
bench --workload instruct --prompts 32 --max-new-tokens 64 --batch-size 8,32 --drafters $drafters \
    --lookahead fixed:2,adaptive --peer vllm --json $out/smollm2-instruct-b8-b32.json | tee $out/smollm2-instruct-b8-b32.txt
# one extraction schema over many texts: the job's earlier answers predict the later ones
bench --workload json --prompts 64 --max-new-tokens 80 --batch-size 8 --drafters none,ngram,suffix \
    --lookahead fixed:4,adaptive --json $out/smollm2-json-b8.json | tee $out/smollm2-json-b8.txt
