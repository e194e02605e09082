"""tsspec plugin ``gemma4``: the Gemma 4 text trunk and its assistant drafter, from GGUF.

Registers ``load_gemma4`` for ``general.architecture == "gemma4"``, the ``gemma4-assistant``
drafter attach (``--spec-draft-model`` / ``--mtp-draft-model``; the draft-head algorithm drives
it) and converters for HF ``Gemma4ForCausalLM`` / ``Gemma4ForConditionalGeneration`` (text part)
and ``Gemma4AssistantForCausalLM`` checkpoints. The trunk verifies on its own: weight-free
algorithms (``ngram``) serve any checkpoint, with or without an assistant.

Importing this package loads no torch: the hooks import their modules when called.
"""

from __future__ import annotations

import importlib
from typing import Any

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["gemma4"]
DRAFTER_ARCHITECTURES = ["gemma4-assistant"]
_LAZY = {"Gemma4Target": ".target", "load_gemma4": ".loader", "Gemma4Assistant": ".assistant",
         "attach_assistant": ".assistant"}

__all__ = ["Gemma4Target", "Gemma4Assistant", "load_gemma4", "attach_assistant", "ARCHITECTURES"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def _load(gguf_path, options):
    from .loader import load_gemma4

    return load_gemma4(gguf_path, options)


def _attach(target, source, options=None):
    from .assistant import attach_assistant

    return attach_assistant(target, source, options)


def _convert_trunk(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_gemma4

    convert_gemma4(src_dir, out_path, outtype=outtype)


def _convert_assistant(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_assistant

    convert_assistant(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


@hookimpl
def tsspec_register_drafters(register):
    register(list(DRAFTER_ARCHITECTURES), _attach)


@hookimpl
def tsspec_register_converters(register):
    register(["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "gemma4_text", "gemma4"], _convert_trunk,
             description="Gemma 4 text trunk -> GGUF gemma4 (vision/audio towers skipped)")
    register(["Gemma4AssistantForCausalLM", "gemma4_assistant"], _convert_assistant,
             description="Gemma 4 assistant drafter -> GGUF gemma4-assistant (ordered embeddings kept)")
