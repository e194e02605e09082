#!/usr/bin/env bash
# Load a tsspec export with speculators' own config and model classes, in an environment of its own
# (speculators 0.9.0 pins transformers<=5.19, the project runs a newer one).
#   1. the project's venv writes a random block drafter (with a draft vocabulary) and an mtp-shaped
#      draft head, and exports both;
#   2. a separate venv holds speculators + its transformers; torch, numpy and safetensors come from
#      the project's venv (appended to its path: its own packages come first);
#   3. that venv loads config.json with SpeculatorModelConfig.from_pretrained and the weights with
#      DFlashDraftModel / MTPDraftModel.from_pretrained, checks every tensor against the file and
#      the mtp layer's outputs against tsspec's head, and saves the mtp model again;
#   4. the project's venv converts speculators' save back and compares the head's weights.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
VENV="${INTEROP_VENV:-$ROOT/.venv-interop}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
unset PIP_CONSTRAINT PIP_BUILD_CONSTRAINT  # the project's pins name a newer transformers

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"  # the project's Python: the venv reads the project's compiled packages
fi
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
OWN="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" > "$OWN/tsspec-project.pth"
PINS="$ROOT/plugins/speculators_format/scripts/interop-constraints.txt"
"$VENV/bin/python" -m pip install -q -c "$PINS" --no-deps -r "$ROOT/plugins/speculators_format/scripts/interop-requirements.txt"
"$VENV/bin/python" -m pip install -q -c "$PINS" -r "$ROOT/plugins/speculators_format/scripts/interop-datasets.txt"

"$PY" "$ROOT/plugins/speculators_format/scripts/interop_export.py" "$WORK"
"$VENV/bin/python" "$ROOT/plugins/speculators_format/scripts/interop_load.py" "$WORK"
"$PY" "$ROOT/plugins/speculators_format/scripts/interop_import.py" "$WORK"
