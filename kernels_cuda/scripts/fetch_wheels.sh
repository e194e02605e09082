#!/usr/bin/env bash
# Download the wheels the device check needs that the GPU image lacks (it has torch, CuPy, numpy,
# pluggy, attrs, typer, tokenizers, jinja2, rich, pytest, hypothesis; not gguf) into
# kernels_cuda/wheels, for CPython 3.12 on x86-64 Linux. Run where pip reaches an index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p wheels
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d wheels "gguf==0.19.0"
ls -l wheels
