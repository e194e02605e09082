#!/usr/bin/env bash
# The kernels_cuda device check, one prepared run on a machine with an NVIDIA GPU (see README):
# installs this checkout WITHOUT touching the machine's CUDA torch or CuPy (no dependencies
# resolved, no index reached; missing pure-Python wheels come from kernels_cuda/wheels), then
# runs scripts/device_check.py: kernels vs the torch contracts, timings vs the bytes floor and
# torch, the CUDA and lossless tests; one JSON + markdown report under OUT_DIR.
#
#   bash kernels_cuda/scripts/device_check.sh [OUT_DIR]      (default: $OUT, else ./device_report)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-device_report}}
PY=${PYTHON:-python3}
SITE=${TSSPEC_SITE:-/tmp/tsspec-site}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== python: $($PY -c 'import sys; print(sys.version.split()[0])'); torch: $($PY -c 'import torch; print(torch.__version__, torch.cuda.is_available())')"
if compgen -G "kernels_cuda/wheels/*.whl" >/dev/null; then
  echo "== carried wheels: $(ls kernels_cuda/wheels | tr '\n' ' ')"
  $PY -m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" kernels_cuda/wheels/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# editable installs for the entry points; --no-build-isolation uses the machine's setuptools
$PY -m pip install -q --no-deps --no-build-isolation -e . -e kernels_cuda \
  -e plugins/model_llama -e plugins/model_qwen35 -e plugins/spec_block -e plugins/spec_ngram -e plugins/spec_draft_head
$PY -c 'import torch, cupy; print("== torch", torch.__version__, "cuda", torch.version.cuda, "| cupy", cupy.__version__)'
$PY -m tsspec.cli.app plugins 2>/dev/null | grep -A1 '^kernels_cuda' || true
timeout 540 $PY kernels_cuda/scripts/device_check.py --out "$OUT_DIR" "${@:2}"
