"""``tsspec export-drafter --drafter FILE.gguf --format speculators OUT/``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .schema import FORMAT

COMMAND = "export-drafter"
NEXTN_REASON = (
    "the speculators format has no type for tsspec's NextN draft head: its mtp type is a Qwen3 layer "
    "(per-head q/k norms) over the verifier's full LM head, and its eagle3 type feeds [embedding; hidden] "
    "to attention unprojected; this head has neither shape (export a block drafter instead)"
)


def export_drafter(
    out: Annotated[str, typer.Argument(help="The checkpoint directory to write (config.json + model.safetensors).")],
    drafter: Annotated[str, typer.Option("--drafter", help="The drafter GGUF to export (a block drafter, architecture dflash).")],
    fmt: Annotated[str, typer.Option("--format", help="The checkpoint format: speculators.")] = FORMAT,
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="The verifier's Hugging Face id or path, recorded in speculators_config.")] = None,
    verifier_architecture: Annotated[Optional[list[str]], typer.Option("--verifier-architecture", help="The verifier's architectures entry (repeatable).")] = None,
    vocab_size: Annotated[Optional[int], typer.Option("--vocab-size", help="The target's vocabulary size, where the drafter file states none.")] = None,
) -> None:
    """Write a tsspec drafter as a checkpoint other engines load (vLLM's --speculative-config)."""
    from tsspec.errors import OptionsError
    from tsspec_gguf.gguf_file import read_architecture

    from .exporter import ExportError, export_block

    if fmt != FORMAT:
        raise OptionsError(f"--format must be {FORMAT}, got {fmt!r}")
    try:
        arch = read_architecture(drafter)
    except Exception as exc:  # a missing or foreign file: one line
        raise ExportError(f"{drafter}: not a GGUF drafter file ({exc})") from None
    if arch in ("dflash", "dflash-draft"):
        config = export_block(drafter, out, vocab_size=vocab_size, verifier=verifier,
                              verifier_architectures=verifier_architecture or [])
        typer.echo(f"wrote {out}: speculators {config['speculators_model_type']} "
                   f"(draft vocabulary {config['draft_vocab_size']}, block {config['block_size']})")
        return
    if arch == "nextn":
        raise ExportError(f"{drafter}: {NEXTN_REASON}")
    raise ExportError(f"{drafter}: architecture {arch!r} has no speculators type")


def register(app: typer.Typer) -> None:
    app.command(COMMAND)(export_drafter)
