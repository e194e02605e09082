"""tsspec plugin ``muse-glimmer``: the Muse-Glimmer text trunk loaded from GGUF.

Registers ``load_muse_glimmer`` for ``general.architecture == "muse-glimmer"`` and converters for
the HF ``muse_glimmer`` (text part) and ``muse_glimmer_assistant`` (-> GGUF ``dflash``)
checkpoints. The target, ``MuseGlimmerTarget``, verifies on its own: weight-free algorithms
(``ngram``) serve it with no drafter, and a DFlash / DFlash2 assistant drives ``block``.

Importing this package loads no torch: the hooks import their modules when called.
"""

from __future__ import annotations

import importlib
from typing import Any

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["muse-glimmer"]
_LAZY = {"MuseGlimmerTarget": ".target", "load_muse_glimmer": ".loader"}

__all__ = ["MuseGlimmerTarget", "load_muse_glimmer", "ARCHITECTURES"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def _load(gguf_path, options):
    from .loader import load_muse_glimmer

    return load_muse_glimmer(gguf_path, options)


def _convert_trunk(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_muse_glimmer

    convert_muse_glimmer(src_dir, out_path, outtype=outtype)


def _convert_assistant(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_assistant

    convert_assistant(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


@hookimpl
def tsspec_register_converters(register):
    """``tsspec convert`` tries a checkpoint's ``architectures`` before its ``model_type``: the
    class names make these converters win for checkpoints transformers saved."""
    register(["MuseGlimmerForConditionalGeneration", "MuseGlimmerTextModel", "muse_glimmer", "muse_glimmer_text"],
             _convert_trunk, description="Muse-Glimmer text trunk -> GGUF muse-glimmer (the vision tower is skipped)")
    register(["MuseGlimmerAssistantModel", "muse_glimmer_assistant"], _convert_assistant,
             description="Muse-Glimmer DFlash assistant -> GGUF dflash (with the target's logit scale and softcap)")
