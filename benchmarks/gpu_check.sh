#!/usr/bin/env bash
# On a CUDA machine, in one short run: the bench grid on the GPU (batch 1/8/32/128, every drafter
# and lookahead, HF generate and HF assisted side by side), the exactness and sampling tests on the
# device, then eager against captured CUDA graphs. Each step has its own time limit and writes as it
# goes, so a step that fails or runs out of time costs only itself. The project never needs a GPU to
# pass its tests; this is the check for what only a GPU runs (generators, masks and sampling on the
# device, graph replay) and the speed figures a GPU gives.
#
#   benchmarks/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check)
#
# Machines without a package index: put wheels of what the machine lacks in .whl/ (pydantic and its
# own needs for the lent H200's image); they are installed into a private folder, nothing else is.
# GPU_CHECK_DEVICE=cpu GPU_CHECK_PROMPTS=8 runs the same steps on a CPU, to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-${OUT:-gpu-check}}
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COLUMNS=250
python=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}
prompts=${GPU_CHECK_PROMPTS:-64}

if [[ $device == cuda* ]] && ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $python" >&2
    exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/specbatch-site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/specbatch-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c "import specbatch.lab.bench" || "$python" -m pip install -q -e '.[test]' || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
"$python" -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__)"

status=0
step() {  # name, limit_s, command...: runs it, keeps going whatever it returns
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T), limit ${limit}s)"
    timeout "$limit" "$@" || { echo "== $name failed: $?"; status=1; }
}
bench=("$python" -m specbatch.cli bench --prompts "$prompts" --max-new-tokens 128 --set "models.device=$device")
step "bench grid, batch 8/32/128" 150 "${bench[@]}" --batch-size 8,32,128 --lookahead fixed:2,fixed:4,adaptive \
    --json "$out_dir/grid-b8-b128.json"
step "bench grid, batch 1" 150 "${bench[@]}" --batch-size 1 --lookahead fixed:2,fixed:4,adaptive \
    --assisted-prompts 8 --json "$out_dir/grid-b1.json"
step "exactness and sampling on $device" 150 env SPECBATCH_TEST_SET="models.device=$device" \
    "$python" -m pytest -q -rf -p no:cacheprovider --junitxml="$out_dir/tests.xml" tests/test_engine_exact.py \
    tests/test_eagle.py tests/test_sampling.py tests/test_low_precision.py tests/test_bundled_pair.py -k "not submit"
if [[ $device == cuda* ]]; then
    step "eager vs cuda-graphs, batch 1 and 32" 120 "${bench[@]}" --prompts 32 --batch-size 1,32 \
        --drafters none,draft,eagle --lookahead fixed:2 --graphs eager,cuda-graphs --json "$out_dir/graphs.json"
fi
echo "== done ($(date +%T)), status $status"
exit $status
