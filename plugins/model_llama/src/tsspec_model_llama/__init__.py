"""tsspec plugin ``llama``: llama-family dense transformers loaded from GGUF.

Registers ``load_llama`` for ``general.architecture == "llama"`` (SmolLM, Llama 2/3, Mistral and
other files llama.cpp converts to the ``llama`` architecture). The target it returns,
``LlamaTarget``, implements ``tsspec.protocols.SpeculativeTarget`` and exposes ``embed``,
``final_norm``, ``lm_head`` and feature taps for drafters.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

from .loader import ARCHITECTURES, load_llama
from .target import LlamaTarget

__all__ = ["LlamaTarget", "load_llama", "ARCHITECTURES"]


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), load_llama)
