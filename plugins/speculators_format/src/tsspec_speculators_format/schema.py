"""The speculators checkpoint format: what a ``config.json`` carries and which types map here.

A speculators checkpoint is a Hugging Face style directory: ``config.json`` with
``speculators_model_type`` (the algorithm: ``dflash``, ``eagle3``, ``mtp`` ...), the draft
layers' ``transformer_layer_config``, the type's own fields, and ``speculators_config`` (the
algorithm, its proposal methods and the ``verifier`` it was trained for); the weights are
``model.safetensors``. A reduced draft vocabulary travels as ``d2t`` (draft row -> offset to its
target id: ``target = row + d2t[row]``) and ``t2d`` (a mask over the target vocabulary).
"""

from __future__ import annotations

from typing import Any

FORMAT = "speculators"
TYPE_KEY = "speculators_model_type"
CONVERTER_KEY = "speculators"  # the converter key tsspec convert looks up for these checkpoints
SPECULATORS_VERSION = "0.9.0"  # the format version written (the schema of speculators 0.9.0)

# speculators types the block drafter runs (same layer and tensor names as the z-lab DFlash layout)
BLOCK_TYPES = ("dflash", "dflash2")
ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}

# the types that cannot map, each with the piece tsspec lacks
UNMAPPED = {
    "eagle3": "an EAGLE-3 head (attention over the 2H-wide [embedding; hidden] input, the hidden part as "
              "the residual, and an fc over three verifier layers); tsspec's draft-head algorithm runs "
              "NextN heads (a projection to H before attention)",
    "dspark": "DSpark's Markov and confidence heads on a dense target; tsspec's block drafter runs "
              "DSpark only as DeepSeek V4's hyper-connection drafter",
    "peagle": "a P-EAGLE head; no tsspec algorithm runs one",
    "xpress": "an Xpress head; no tsspec algorithm runs one",
}


def unmapped_reason(kind: str) -> str:
    """The one-line reason a speculators type does not convert."""
    if kind in UNMAPPED:
        return f"speculators type {kind!r} cannot convert: tsspec lacks {UNMAPPED[kind]}"
    known = ", ".join((*BLOCK_TYPES, "mtp"))
    return f"speculators type {kind!r} is not one tsspec reads (it converts {known})"


def speculators_config(algorithm: str, speculative_tokens: int, verifier: str | None,
                       verifier_architectures: list[str]) -> dict[str, Any]:
    """The ``speculators_config`` table: one greedy proposal method and the verifier reference."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
    }
