"""``tsspec convert-dflash SRC_DIR OUT.gguf``: an alias of ``tsspec convert`` for DFlash
checkpoints that also takes the target's logit transform when the drafter config lacks it.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

COMMAND = "convert-dflash"


def convert_dflash(
    src_dir: Annotated[str, typer.Argument(help="HF DFlash checkpoint directory (config.json + safetensors).")],
    out: Annotated[str, typer.Argument(help="The GGUF file to write (general.architecture = dflash).")],
    outtype: Annotated[str, typer.Option("--outtype", help="f32 or f16 (2-D weights).")] = "f32",
    logit_scale: Annotated[Optional[float], typer.Option(
        "--logit-scale", help="The target's logit scale, when the drafter config does not carry it.")] = None,
    softcap: Annotated[Optional[float], typer.Option(
        "--softcap", help="The target's final logit softcapping, when the drafter config does not carry it.")] = None,
) -> None:
    """HF DFlash / DFlash2 drafter (z-lab or transformers muse_glimmer_assistant) -> GGUF dflash."""
    from .converter import convert_checkpoint

    if outtype not in ("f32", "f16"):
        from tsspec.errors import OptionsError

        raise OptionsError(f"--outtype must be f32 or f16, got {outtype!r}")
    try:
        layout = convert_checkpoint(src_dir, out, out_type=outtype, logit_scale=logit_scale, softcap=softcap)
    except OSError as exc:  # an unwritable output is one line like every other failure
        from .converter import ConversionError

        raise ConversionError(out, f"cannot write the GGUF ({exc.strerror or exc})") from None
    typer.echo(f"wrote {out}: dflash drafter from a {layout} checkpoint")


def register(app: typer.Typer) -> None:
    app.command(COMMAND)(convert_dflash)
