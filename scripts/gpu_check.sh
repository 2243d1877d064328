#!/usr/bin/env bash
# Device check on one CUDA GPU (nothing else needs a GPU; CI never runs this): ring attention at d = 1
# against torch SDPA in bfloat16 (errors against float64), then bfloat16 attention + MLP timed at 1k-32k
# tokens on group sizes 1-8 (sharding emulated on the one device), the profile's compute terms fitted
# and held-out micro-batches predicted and measured (python -m trainer.gpu_check; its docstring says more).
# Usage: scripts/gpu_check.sh [more trainer.gpu_check flags]; prints the figures, writes gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this check needs one GPU")'
exec "$PY" -m trainer.gpu_check --device cuda --dtype bfloat16 --lengths 1024,2048,4096,8192,16384,32768 \
    --degrees 1,2,3,4,6,8 --json gpu_check.json "$@"
