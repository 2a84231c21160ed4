#!/usr/bin/env bash
# On a CUDA machine, in one short run: the bench grid on the GPU (batch 1/8/32/128, every drafter
# and lookahead, HF generate and HF assisted side by side), the exactness and sampling tests on the
# device, and where a round's time goes (benchmarks/round_phases.py). Each step has its own time
# limit and writes as it goes, so a step that fails or runs out of time costs only itself. The
# project never needs a GPU to pass its tests; this is the check for what only a GPU runs
# (generators, masks and sampling on the device, graph replay) and the speed figures a GPU gives.
#
#   benchmarks/gpu_check.sh [OUT_DIR [STEP ...]]   (OUT_DIR default: $OUT, else ./gpu-check)
#
# Steps: grid, grid-b1, tests, phases (the default, about 7 minutes on the lent H200) and graphs
# (eager against captured CUDA graphs: Inductor's compile alone took over 2 minutes there, so it
# runs on its own call). Timings from 2026-12-04 are in benchmarks/README.md, "On a GPU".
#
# Machines without a package index: put wheels of what the machine lacks in .whl/ (pydantic and its
# own needs for the lent H200's image); they are installed into a private folder, nothing else is.
# GPU_CHECK_DEVICE=cpu GPU_CHECK_PROMPTS=8 runs the same steps on a CPU, to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-${OUT:-gpu-check}}
steps=("${@:2}")
[[ ${#steps[@]} -gt 0 ]] || steps=(grid grid-b1 tests phases)
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
step() {  # name, limit_s, command...: runs it if asked for, keeps going whatever it returns
    local name=$1 limit=$2
    shift 2
    [[ " ${steps[*]} " == *" $name "* ]] || return 0
    echo "== $name ($(date +%T), limit ${limit}s)"
    timeout "$limit" "$@" || { echo "== $name failed: $?"; status=1; }
}
bench=("$python" -m specbatch.cli bench --max-new-tokens 128 --set "models.device=$device")
step grid 150 "${bench[@]}" --prompts "$prompts" --batch-size 8,32,128 --lookahead fixed:2,fixed:4,adaptive \
    --json "$out_dir/grid-b8-b128.json"
# batch 1 runs every prompt alone: 64 prompts did not fit 150 s on the H200, 16 took 50 s
step grid-b1 120 "${bench[@]}" --prompts $((prompts / 4)) --batch-size 1 --lookahead fixed:2,fixed:4,adaptive \
    --assisted-prompts 4 --json "$out_dir/grid-b1.json"
step tests 150 env SPECBATCH_TEST_SET="models.device=$device" \
    "$python" -m pytest -q -rf -p no:cacheprovider --junitxml="$out_dir/tests.xml" tests/test_engine_exact.py \
    tests/test_eagle.py tests/test_sampling.py tests/test_low_precision.py tests/test_bundled_pair.py -k "not submit"
step phases 150 "$python" benchmarks/round_phases.py --set "models.device=$device" --batch 1,32,128 \
    --prompts $((prompts * 3 / 4)) --json "$out_dir/round-phases.json"
if [[ $device == cuda* ]]; then
    step graphs 540 "${bench[@]}" --prompts 16 --batch-size 1,32 --drafters none,draft --lookahead fixed:2 \
        --graphs eager,cuda-graphs --json "$out_dir/graphs.json"
fi
echo "== done ($(date +%T)), status $status"
exit $status
