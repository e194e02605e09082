"""tsspec-block: the ``block`` speculation algorithm and the DFlash / DFlash2 drafter.

Registered through the ``tsspec`` entry point ``block``:

* algorithm ``block`` (``requires_draft_head=True``): ``BlockDraftSpeculator`` over any BLOCK
  draft head, gated on the cumulative prefix probability;
* drafter architectures ``dflash`` and ``dflash-draft``: ``attach_dflash(target, path, options)``
  binds a DFlash / DFlash2 GGUF to a target (``--draft-model PATH``);
* command ``tsspec convert-dflash SRC OUT``: HF DFlash checkpoints (z-lab and transformers'
  ``muse_glimmer_assistant`` layouts) to GGUF ``dflash``.

Importing this package loads no torch: the hooks import their modules when called.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

__all__ = [
    "tsspec_register_speculators",
    "tsspec_register_drafters",
    "tsspec_register_commands",
    "attach_file",
    "make_speculator",
]

DRAFTER_ARCHITECTURES = ["dflash", "dflash-draft"]


def make_speculator(target, options=None):
    """The ``block`` factory (see ``speculator.make_block_speculator``)."""
    from .speculator import make_block_speculator

    return make_block_speculator(target, options)


def attach_file(target, gguf_path, options=None):
    """The ``dflash`` attach function (see ``attach.attach_dflash``). Not named ``attach``: that
    is the submodule, which replaces a same-named package attribute once imported."""
    from .attach import attach_dflash

    return attach_dflash(target, gguf_path, options)


@hookimpl
def tsspec_register_speculators(register):
    from tsspec.protocols import DraftHeadKind

    from .speculator import ALGORITHM, DEFAULT_MIN_DRAFT_PROB, DESCRIPTION, DRAFTER_HINT

    register(ALGORITHM, make_speculator, requires_draft_head=True, serves_kind=DraftHeadKind.BLOCK,
             weight_free=False, default_pmin=DEFAULT_MIN_DRAFT_PROB, description=DESCRIPTION,
             drafter_hint=DRAFTER_HINT)


@hookimpl
def tsspec_register_drafters(register):
    register(DRAFTER_ARCHITECTURES, attach_file)


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)
