#!/usr/bin/env bash
# Issue 42's goals on SmolLM2-135M-Instruct (models.target=smollm2-135m), greedy. Run it alone on the
# machine (timings); tables go to benchmarks/results/structured-*.txt and .json.
#  - extraction (the json workload's prompts under its JSON schema) with speculation against the same
#    constrained job with --drafter none, at 8 rows (goal >= 2x: the `× none` column);
#  - the same prompts unconstrained (--workload json), for constrained / unconstrained (goal >= 0.95x);
#  - classification under a choice constraint.
# `valid`: finished answers that satisfy their constraint (jsonschema / membership); `exact`: outputs
# equal to the target's own greedy decoding under the same masks. The hf-generate row decodes without
# the constraint (a reference of speed only: its `exact` is against the masked references).
# Mask and forced-draft figures per job: `specbatch report` on a job (sql/structured_output.sql).
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
bench() { COLUMNS=250 .venv/bin/specbatch bench --set models.target=smollm2-135m --set capacity.max_context=1024 "$@"; }
bench --workload extraction --prompts 64 --max-new-tokens 160 --batch-size 8 --drafters none,ngram,suffix \
    --lookahead fixed:4,fixed:8 --repeats 3 --json $out/structured-extraction-b8.json | tee $out/structured-extraction-b8.txt
bench --workload json --prompts 64 --max-new-tokens 160 --batch-size 8 --drafters none,ngram,suffix \
    --lookahead fixed:4,fixed:8 --repeats 3 --json $out/structured-json-b8.json | tee $out/structured-json-b8.txt
bench --workload classification --prompts 64 --max-new-tokens 8 --batch-size 8,32 --drafters none,suffix \
    --lookahead fixed:2 --json $out/structured-classification.json | tee $out/structured-classification.txt
