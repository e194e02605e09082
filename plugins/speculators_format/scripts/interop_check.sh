#!/usr/bin/env bash
# Load a tsspec export with speculators' own config and model classes, in an environment of its own
# (speculators 0.9.0 pins transformers<=5.19, the project runs a newer one).
#   1. the project's venv writes a random block drafter (with a draft vocabulary) and exports it;
#   2. a separate venv holds speculators + its transformers; torch, numpy and safetensors come from
#      the project's venv (appended to its path: its own packages come first);
#   3. that venv loads config.json with SpeculatorModelConfig.from_pretrained and the weights with
#      DFlashDraftModel.from_pretrained, and checks every tensor against the file.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
VENV="${INTEROP_VENV:-$ROOT/.venv-interop}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
unset PIP_CONSTRAINT PIP_BUILD_CONSTRAINT  # the project's pins name a newer transformers

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -c 'import sys; print(sys.executable)' >/dev/null
    python3 -m venv "$VENV"
fi
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
OWN="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" > "$OWN/tsspec-project.pth"
"$VENV/bin/python" -m pip install -q --no-deps -r "$ROOT/plugins/speculators_format/scripts/interop-requirements.txt"
"$VENV/bin/python" -m pip install -q -r "$ROOT/plugins/speculators_format/scripts/interop-datasets.txt"

"$PY" "$ROOT/plugins/speculators_format/scripts/interop_export.py" "$WORK"
"$VENV/bin/python" "$ROOT/plugins/speculators_format/scripts/interop_load.py" "$WORK/spec"
