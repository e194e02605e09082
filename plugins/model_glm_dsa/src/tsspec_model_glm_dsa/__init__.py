"""tsspec-model-glm-dsa: GLM 5.x (GGUF ``glm-dsa``) as a ``SpeculativeTarget`` whose state rolls
back by length, its NextN layer as a per-token ``DraftHead`` (read from the file only when
draft-head speculation is asked for at load time), and the ``glm_moe_dsa`` HF -> GGUF converter.
Registered through the ``tsspec`` entry point ``glm-dsa``.

Importing this module is cheap: torch and the model code load when a model does.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["glm-dsa"]
MODEL_TYPES = ["glm_moe_dsa", "GlmMoeDsaForCausalLM"]

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "tsspec_register_models", "tsspec_register_converters"]


def _load(gguf_path, options):
    from .loader import load_glm_dsa

    return load_glm_dsa(gguf_path, options)


def _convert(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_hf_dir

    convert_hf_dir(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


@hookimpl
def tsspec_register_converters(register):
    register(list(MODEL_TYPES), _convert,
             description="GLM 5.x (glm_moe_dsa) safetensors -> GGUF glm-dsa, NextN layer included")
