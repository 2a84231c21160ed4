#!/usr/bin/env bash
# On a CUDA machine: the exactness tests on the GPU (float32 and bfloat16, eager and CUDA graphs),
# then the bench with and without captured graphs; everything under ten minutes, results as JSON
# and JUnit XML in OUT_DIR. The project never needs a GPU to pass its tests; this is the check for
# the code paths only a GPU runs (generators, masks and sampling on the device, graph replay).
#
#   benchmarks/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-${OUT:-gpu-check}}
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $python" >&2
    exit 2
fi
# the machine's own torch stays; what is missing comes from the index if one is reachable
"$python" -m pip install -q -e '.[test]' 2>/dev/null || "$python" -m pip install -q --no-deps -e . || exit 2

status=0
run_tests() {  # name, settings, limit_s, pytest arguments...
    local name=$1 settings=$2 limit=$3
    shift 3
    echo "== $name ($settings)"
    SPECBATCH_TEST_SET="$settings" timeout "$limit" "$python" -m pytest -q -p no:cacheprovider \
        --junitxml="$out_dir/$name.xml" "$@" || status=1
}
exact=(tests/test_engine_exact.py tests/test_graphs.py tests/test_bundled_pair.py)
run_tests fp32-eager "models.device=cuda;models.dtype=float32" 90 "${exact[@]}"
run_tests fp32-cuda-graphs "models.device=cuda;models.dtype=float32;models.graphs=cuda-graphs" 150 \
    tests/test_engine_exact.py -k "greedy_matches_target and (draft or none)"
# bfloat16: identical where the shape allows it, else the divergence the tests bound (near-ties)
run_tests bf16-eager "models.device=cuda" 90 tests/test_low_precision.py tests/test_sampling.py
run_tests bf16-cuda-graphs "models.device=cuda;models.graphs=cuda-graphs" 120 tests/test_low_precision.py

echo "== bench: eager vs cuda-graphs, batch 32"
timeout 180 "$python" -m specbatch.cli bench --prompts 64 --max-new-tokens 128 --batch-size 32 \
    --set models.device=cuda --set models.draft_device=cuda --graphs eager,cuda-graphs \
    --assisted-prompts 4 --json "$out_dir/bench.json" || status=1
"$python" - "$out_dir" <<'EOF'
import json, sys, xml.etree.ElementTree as tree
from pathlib import Path
out = Path(sys.argv[1])
summary = {}
for report in sorted(out.glob("*.xml")):
    suite = tree.parse(report).getroot().find("testsuite")
    summary[report.stem] = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
exit $status
