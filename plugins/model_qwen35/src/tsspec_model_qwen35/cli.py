"""``tsspec convert hf-to-gguf SRC_DIR OUT.gguf``: the converter as a CLI command group."""

from __future__ import annotations

from typing import Annotated

import typer

from tsspec.errors import TsspecError

convert_app = typer.Typer(
    name="convert",
    help="Convert checkpoints to GGUF.",
    no_args_is_help=True,
    add_completion=False,
)


class ConvertError(TsspecError):
    """A conversion failed; printed as one line with exit code 2."""


@convert_app.command("hf-to-gguf")
def hf_to_gguf(
    src_dir: Annotated[str, typer.Argument(help="Hugging Face model directory (config.json + safetensors).")],
    out: Annotated[str, typer.Argument(help="The GGUF file to write.")],
    outtype: Annotated[str, typer.Option("--outtype", help="f32 or f16 (2-D weights).")] = "f32",
) -> None:
    """Qwen 3.5 / 3.5-MoE / Qwen3-Next safetensors -> GGUF with llama.cpp's names (token ids only)."""
    from .convert import ConversionError, convert_hf_dir

    try:
        arch, count = convert_hf_dir(src_dir, out, outtype=outtype)
    except (ConversionError, OSError) as exc:
        raise ConvertError(str(exc)) from exc
    typer.echo(f"wrote {out}: {arch}, {count} tensors")


def register(app: typer.Typer) -> None:
    app.add_typer(convert_app, name="convert")
