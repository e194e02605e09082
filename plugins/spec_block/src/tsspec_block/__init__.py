"""tsspec-block: the ``block`` speculation algorithm and the DFlash / DFlash2 drafter.

Registered through the ``tsspec`` entry point ``block``:

* algorithm ``block`` (``requires_draft_head=True``): ``BlockDraftSpeculator`` over any BLOCK
  draft head, gated on the cumulative prefix probability;
* drafter architectures ``dflash`` and ``dflash-draft``: ``attach_dflash(target, path, options)``
  binds a DFlash / DFlash2 GGUF to a target (``--draft-model PATH``);
* trainer ``tsspec train-drafter --kind dflash`` (``trainer.train_dflash``): a DFlash drafter
  trained by self-distillation on the shared training core, written in the ``dflash`` layout;
* converter for z-lab DFlash checkpoints (``DFlashDraftModel`` / ``DFlash2DraftModel``) to GGUF
  ``dflash``: ``tsspec convert SRC OUT``, or the alias command (which reads transformers'
  ``muse_glimmer_assistant`` layout too) ``tsspec convert-dflash SRC OUT`` (which also takes the target's
  ``--logit-scale`` / ``--softcap`` when the drafter config does not carry them).

Importing this package loads no torch: the hooks import their modules when called.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

__all__ = [
    "tsspec_register_speculators",
    "tsspec_register_drafters",
    "tsspec_register_converters",
    "tsspec_register_commands",
    "tsspec_register_trainers",
    "tsspec_register_switches",
    "SWITCHES",
    "attach_file",
    "make_speculator",
]

DRAFTER_ARCHITECTURES = ["dflash", "dflash-draft"]
# checkpoint types (config.json architectures) the converter reads; transformers' Muse-Glimmer
# assistant checkpoints are the model_muse_glimmer plugin's (it adds the target's logit scale)
CHECKPOINT_TYPES = ["DFlashDraftModel", "DFlash2DraftModel"]


def make_speculator(target, options=None):
    """The ``block`` factory (see ``speculator.make_block_speculator``)."""
    from .speculator import make_block_speculator

    return make_block_speculator(target, options)


def attach_file(target, gguf_path, options=None):
    """The ``dflash`` attach function (see ``attach.attach_dflash``): ``gguf_path`` is a path, or
    an open reader (a drafter a model plugin's file carries: ``attach.attach_open``). Not named
    ``attach``: that is the submodule, which replaces a same-named package attribute."""
    from .attach import attach_dflash, attach_open

    if callable(getattr(gguf_path, "require_tensor", None)):
        return attach_open(target, gguf_path, options)
    return attach_dflash(target, gguf_path, options)


@hookimpl
def tsspec_register_speculators(register):
    from tsspec.protocols import DraftHeadKind

    from .speculator import ALGORITHM, DESCRIPTION, DRAFTER_HINT

    register(ALGORITHM, make_speculator, requires_draft_head=True, serves_kind=DraftHeadKind.BLOCK,
             weight_free=False, description=DESCRIPTION, drafter_hint=DRAFTER_HINT)


@hookimpl
def tsspec_register_drafters(register):
    register(DRAFTER_ARCHITECTURES, attach_file)


def convert_file(src_dir, out_path, *, outtype, logit_scale=None, softcap=None):
    """The ``tsspec convert`` converter (see ``converter.convert_checkpoint``); a model plugin
    handing its assistant over (``convert_as``) passes its target's logit transform."""
    from .converter import OUT_TYPES, ConversionError, convert_checkpoint

    if outtype not in OUT_TYPES:
        raise ConversionError(str(src_dir), f"DFlash drafters convert to {' or '.join(OUT_TYPES)}, not {outtype}")
    convert_checkpoint(src_dir, out_path, out_type=outtype, logit_scale=logit_scale, softcap=softcap)


@hookimpl
def tsspec_register_converters(register):
    register(list(CHECKPOINT_TYPES), convert_file, description="HF DFlash / DFlash2 drafter -> GGUF dflash")


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)


@hookimpl
def tsspec_register_trainers(register):
    def train(request, target, log=print, progress=None):
        from .trainer import train_dflash

        return train_dflash(request, target, log, progress)

    register("dflash", train, description="DFlash block drafter, block-diffusion objective (file architecture 'dflash')")


# environment switch -> what setting it to 0 does (each read through tsspec.switches.switch_on)
SWITCHES = {
    "TS_DFLASH_CONV": "DFlash2 block drafters run without their grouped convolution",
    "TS_DFLASH_SELECTOR": "DFlash2 block drafters take the plain argmax instead of the candidate selector",
    "TS_DFLASH_NATIVE": "DFlash block drafters run their matrices in torch (float32) instead of "
    "as int8 blocks on the compiled CPU kernels",
}


@hookimpl
def tsspec_register_switches(register):
    for name, what in SWITCHES.items():
        register(name, what)
