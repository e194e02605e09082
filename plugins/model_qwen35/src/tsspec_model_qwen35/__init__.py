"""tsspec-model-qwen35: Qwen 3.5 / 3.6 / 3.8 (``qwen35``, ``qwen35moe``) and Qwen3-Next
(``qwen3next``) hybrid Gated DeltaNet trunks as ``SpeculativeTarget``s, with per-row recurrent
state snapshots, their NextN / MTP head as a per-token ``DraftHead``, and the converter for
their Hugging Face checkpoints (``tsspec convert SRC_DIR OUT.gguf``). Registered through the
``tsspec`` entry point ``qwen35``.

Importing this module is cheap: torch and the model code load when a model does.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["qwen35", "qwen35moe", "qwen3next"]
# config.json model_type values the converter reads (text-only and multimodal configs)
MODEL_TYPES = ["qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"]

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "SWITCHES", "tsspec_register_models", "tsspec_register_converters",
           "tsspec_register_switches"]


def _load(gguf_path, options):
    from .loader import load_qwen35

    return load_qwen35(gguf_path, options)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


def _convert(src_dir, out_path, *, outtype):
    from .convert import convert_hf_dir

    convert_hf_dir(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_converters(register):
    register(list(MODEL_TYPES), _convert,
             description="Qwen 3.5 / 3.5-MoE / Qwen3-Next safetensors -> GGUF (llama.cpp names, token ids only)")


# environment switch -> what setting it to 0 does (read through tsspec.switches.switch_on)
SWITCHES = {
    "TS_Q35_VERIFY_SNAPSHOTS": "hybrid (DeltaNet) targets roll back by restore + re-forward "
    "instead of committing per-row state slots",
}


@hookimpl
def tsspec_register_switches(register):
    for name, what in SWITCHES.items():
        register(name, what)
