"""tsspec-drafters-smollm2: learned drafters for the embedded SmolLM2-135M-Instruct.

Ships trained drafter GGUFs (``make drafters`` reproduces them) and registers each through the
drafters hook as a bundled drafter, keyed by the identity of the target FILE it was trained on
(architecture, tensor-shape digest and sha256, read from the drafter's own metadata), never a
file name. ``tsspec generate`` on that model then attaches it under ``--spec-type auto`` (or the
drafter's own algorithm); ``TS_SPEC_BUNDLED=0`` loads the model bare.

Importing this package does nothing; the hook reads only the drafters' GGUF headers.
"""

from __future__ import annotations

from pathlib import Path

from tsspec.hookspecs import hookimpl

__all__ = ["tsspec_register_drafters", "drafter_files", "DRAFTERS"]

HERE = Path(__file__).parent
# file -> (algorithm it serves, metadata prefix of its target facts, attached under auto?)
# `auto` follows the figures (`scripts/bench_drafters.py`): a drafter that loses to the weight-free ngram on the
# served classes is attached only when its algorithm is asked for by name.
DRAFTERS = {
    # held-out first-token acceptance ~0.4: alone about plain speed, below ngram (`scripts/bench_drafters.py`).
    # Attached (--spec-draft-model), `auto` pairs it behind ngram (its head says auto_fallback);
    # that pair measured no clear gain over ngram on this CPU (README), so auto does not attach it
    "smollm2-135m-instruct-mtp.gguf": ("draft-head", "nextn", False),
    # DFlash block drafter (tsspec train-drafter --kind dflash; recipe and figures in
    # plugins/spec_block/trained/README.md): row-1 landing ~0.3-0.4 where it is sure, below plain
    "smollm2-135m-instruct-dflash.gguf": ("block", "dflash", False),
}


def drafter_files() -> list[dict]:
    """The ``files`` registration of every shipped drafter present in the package."""
    from tsspec_gguf.gguf_file import GGUFFile

    files = []
    for name, (algorithm, prefix, auto) in DRAFTERS.items():
        path = HERE / name
        if not path.is_file():
            continue
        with GGUFFile(path) as f:
            target = {
                "architecture": f.require(f"{prefix}.target.architecture", str),
                "shape_digest": f.require(f"{prefix}.target.shape_digest", str),
                "sha256": f.get(f"{prefix}.target.sha256", "") or None,
            }
        files.append({"path": str(path), "algorithm": algorithm, "target": target, "auto": auto,
                      "description": f"{name}: trained for SmolLM2-135M-Instruct (Q4_1)"})
    return files


@hookimpl
def tsspec_register_drafters(register):
    files = drafter_files()
    if files:
        register([], None, files=files)
