"""tsspec-model-qwen35: Qwen 3.5 / 3.6 / 3.8 (``qwen35``, ``qwen35moe``) and Qwen3-Next
(``qwen3next``) hybrid Gated DeltaNet trunks as ``SpeculativeTarget``s, with per-row recurrent
state snapshots, their NextN / MTP head as a per-token ``DraftHead``, and ``tsspec convert
hf-to-gguf``. Registered through the ``tsspec`` entry point ``qwen35``.

Importing this module is cheap: torch and the model code load when a model does.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

ARCHITECTURES = ["qwen35", "qwen35moe", "qwen3next"]

__all__ = ["ARCHITECTURES", "tsspec_register_models", "tsspec_register_commands"]


def _load(gguf_path, options):
    from .loader import load_qwen35

    return load_qwen35(gguf_path, options)


@hookimpl
def tsspec_register_models(register):
    register(list(ARCHITECTURES), _load)


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)
