"""tsspec-model-deepseek-v4: DeepSeek V4 (GGUF ``deepseek4``) as a ``SpeculativeTarget`` whose
whole state rolls back by length, its MTP head as a per-token ``DraftHead``, the DSpark block
drafter, and the ``deepseek_v4`` HF -> GGUF converter. Registered through the ``tsspec`` entry
point ``deepseek-v4``.

Importing this module is cheap: torch and the model code load when a model does.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["deepseek4"]
MODEL_TYPES = ["deepseek_v4"]
DRAFTER_ARCHITECTURES = ["deepseek4-dspark"]

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "DRAFTER_ARCHITECTURES", "tsspec_register_models",
           "tsspec_register_drafters", "tsspec_register_converters"]


def _load(gguf_path, options):
    from .loader import load_deepseek_v4

    return load_deepseek_v4(gguf_path, options)


def _convert(src_dir, out_path, *, outtype: str = "f32") -> None:
    from .convert import convert_hf_dir

    convert_hf_dir(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


def _attach(target, gguf_path, options):
    from .dspark import attach_dspark_file

    return attach_dspark_file(target, gguf_path, options)


@hookimpl
def tsspec_register_drafters(register):
    register(list(DRAFTER_ARCHITECTURES), _attach)


@hookimpl
def tsspec_register_converters(register):
    register(list(MODEL_TYPES), _convert,
             description="DeepSeek V4 (deepseek_v4) safetensors -> GGUF deepseek4, MTP block included")
