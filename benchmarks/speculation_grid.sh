#!/usr/bin/env bash
# Issue 43's grid: adaptive speculation against plain decoding and against its own limit, one run per
# cell (target x dtype x batch rows x workload), greedy, every output checked against the target's own
# (the `exact` column). Each cell runs plain decoding (none), the target's usual drafter and a mix of
# drafters chosen per row (suffix+ngram[+draft|eagle]), all with lookahead=adaptive, planning from the
# pass times measured at start (cached in $SPECBATCH_CACHE_DIR: the first cell of a model and dtype
# pays the few seconds, inside the row's warm-up). Run it alone on a quiet machine:
#   benchmarks/speculation_grid.sh [bundled|smollm2|all] [EAGLE_HEAD_DIR for SmolLM2]
# BATCHES="1 8 32" runs those batch sizes only (SmolLM2's batch-128 cells, 256 prompts each, take an hour).
# REPEATS=3 makes each row the median of 3 interleaved runs: the bundled pair's short cells (1-2 s a run)
# swing ±20% run to run on a shared 2-core host, more than the 0.98 goal allows.
# Tables go to benchmarks/results/issue43/*.txt and .json (or $OUT); the summary, with the issue's goals checked,
# to benchmarks/results/issue43/summary.txt (benchmarks/speculation_grid_summary.py).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
eagle=${2:-outputs/models/smollm2-eagle}
out=${OUT:-benchmarks/results/issue43}  # OUT=DIR keeps an earlier grid's files
mkdir -p "$out"
export SPECBATCH_CACHE_DIR=${SPECBATCH_CACHE_DIR:-$PWD/outputs/cache}
# prompts per cell: enough to fill the batch a few times over without making batch 1 take an hour
prompts_for() { case $1 in 1) echo 12 ;; 8) echo 32 ;; 32) echo 64 ;; *) echo $(( $1 * 2 )) ;; esac; }

cell() {  # cell TARGET_NAME DTYPE BATCH WORKLOAD DRAFTERS [--set ...]
    local target=$1 dtype=$2 batch=$3 workload=$4 drafters=$5
    shift 5
    local name="$target-$dtype-$workload-b$batch"
    COLUMNS=250 .venv/bin/specbatch bench --workload "$workload" --prompts "$(prompts_for "$batch")" \
        --max-new-tokens 64 --batch-size "$batch" --drafters "$drafters" --lookahead adaptive \
        --set "models.dtype=$dtype" --repeats "${REPEATS:-1}" "$@" --json "$out/$name.json" | tee "$out/$name.txt"
}

if [[ $which == bundled || $which == all ]]; then
    for dtype in float32 bfloat16; do
        for batch in ${BATCHES:-1 8 32 128}; do
            for workload in heldout fewshot; do
                cell bundled "$dtype" "$batch" "$workload" none,draft,suffix+ngram+draft
            done
        done
    done
fi

if [[ $which == smollm2 || $which == all ]]; then
    sets=(--set models.target=smollm2-135m)
    mix=suffix+ngram
    if [ -f "$eagle/config.json" ]; then mix=suffix+ngram+eagle; sets+=(--set "models.eagle=$eagle"); fi
    for dtype in float32 bfloat16; do
        for batch in ${BATCHES:-1 8 32 128}; do
            # held-out code and chat requests, few-shot prompts, one extraction schema over many texts
            for workload in instruct fewshot json; do
                cell smollm2 "$dtype" "$batch" "$workload" "none,suffix,$mix" "${sets[@]}"
            done
        done
    done
fi

.venv/bin/python benchmarks/speculation_grid_summary.py "$out" | tee "$out/summary.txt"
