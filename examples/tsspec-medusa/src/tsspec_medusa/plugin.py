"""The hook implementations tsspec calls once at start-up: the ``medusa`` algorithm, the
``medusa`` drafter-file architecture, and the ``tsspec medusa-random`` command.

Per-token work never goes through these hooks: it goes through the Speculator protocol.
"""

from typing import Optional

import tsspec
from tsspec import hookimpl

from .speculator import DRAFTER_HINT, NAME, attach_medusa, make_medusa
from .weights import ARCHITECTURE, DEFAULT_HEADS, DEFAULT_LAYERS, write_random_medusa

DESCRIPTION = (
    "Medusa heads on the last hidden state: proposes a chain of the heads' top-1 tokens "
    "(needs a Medusa GGUF: --spec-draft-model)"
)
COMMAND = "medusa-random"
TSSPEC_CONTRACT = "1.0"  # the plugin contract this plugin is written against


@hookimpl
def tsspec_register_speculators(register):
    # Medusa heads are not a DraftHead a checkpoint carries: `auto` never picks this (serves_kind None)
    register(NAME, make_medusa, requires_draft_head=True, description=DESCRIPTION, drafter_hint=DRAFTER_HINT)


@hookimpl
def tsspec_register_drafters(register):
    register([ARCHITECTURE], attach_medusa)


def medusa_random(
    out: str,
    hidden_size: int = 0,
    vocab_size: int = 0,
    model: Optional[str] = None,
    heads: int = DEFAULT_HEADS,
    layers: int = DEFAULT_LAYERS,
    seed: int = 0,
) -> None:
    """Write a Medusa heads GGUF with random weights, sized for --model (or --hidden-size and
    --vocab-size). For smoke tests: its drafts are rarely accepted, the output stays exact."""
    if model:
        config = tsspec.load_model(model).config
        hidden_size, vocab_size = config.hidden_size, config.vocab_size
    if hidden_size < 1 or vocab_size < 1:
        raise tsspec.TsspecError("give --model, or both --hidden-size and --vocab-size")
    if heads < 1 or layers < 0:
        raise tsspec.TsspecError("--heads must be >= 1 and --layers >= 0")
    path = write_random_medusa(out, hidden_size, vocab_size, heads, layers=layers, seed=seed)
    print(f"wrote {path}: {heads} heads x {layers} blocks, hidden {hidden_size}, vocab {vocab_size}")


@hookimpl
def tsspec_register_commands(app):
    app.command(COMMAND)(medusa_random)
