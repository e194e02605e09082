"""``tsspec convert SRC_DIR OUT.gguf``: every checkpoint a plugin converts (alias ``hf-to-gguf``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .state import STATE

ALIAS = "hf-to-gguf"


def convert(
    src_dir: Annotated[str, typer.Argument(help="Hugging Face checkpoint directory (config.json + safetensors).")],
    out: Annotated[str, typer.Argument(help="The GGUF file to write.")],
    alias_out: Annotated[Optional[str], typer.Argument(hidden=True)] = None,
    outtype: Annotated[str, typer.Option("--outtype", help="f32, f16 or q8_0 (matrices; what a converter supports).")] = "f32",
) -> None:
    """Convert a checkpoint to GGUF with the converter registered for its model_type."""
    from ..errors import OptionsError
    from ..runtime.converting import convert_checkpoint

    if alias_out is not None:
        if src_dir != ALIAS:
            raise OptionsError(f"convert takes SRC_DIR OUT.gguf, got a third argument {alias_out!r}")
        src_dir, out = out, alias_out  # `convert hf-to-gguf SRC OUT`
    key, entry = convert_checkpoint(STATE.catalog, src_dir, out, outtype=outtype)
    typer.echo(f"wrote {out}: {key} checkpoint, {outtype} (converter of plugin {entry.plugin})")


