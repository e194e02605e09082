"""tsspec plugin ``speculators_format``: drafters in the speculators checkpoint format.

``tsspec convert SRC_DIR OUT.gguf`` reads a speculators checkpoint (``config.json`` with
``speculators_model_type``) into a tsspec drafter GGUF; ``tsspec export-drafter --format
speculators`` writes a tsspec block drafter or draft head as one (what vLLM loads with
``--speculative-config``).
Importing this package is cheap: torch and safetensors load when a command runs.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

from .schema import CONVERTER_KEY

__all__ = ["tsspec_register_converters", "tsspec_register_commands"]


def convert_file(src_dir, out_path, *, outtype):
    from .reader import convert_speculators

    convert_speculators(src_dir, out_path, outtype=outtype)


@hookimpl
def tsspec_register_converters(register):
    register([CONVERTER_KEY], convert_file, description="speculators dflash / dflash2 / mtp checkpoint -> GGUF dflash / nextn")


@hookimpl
def tsspec_register_commands(app):
    from .cli import register

    register(app)
