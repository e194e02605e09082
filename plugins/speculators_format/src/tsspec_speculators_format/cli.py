"""``tsspec export-drafter --drafter FILE.gguf --format speculators OUT/``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .schema import FORMAT

COMMAND = "export-drafter"

def export_drafter(
    out: Annotated[str, typer.Argument(help="The checkpoint directory to write (config.json + model.safetensors).")],
    drafter: Annotated[str, typer.Option("--drafter", help="The drafter GGUF to export: a block drafter (dflash) or a draft head (nextn).")],
    fmt: Annotated[str, typer.Option("--format", help="The checkpoint format: speculators.")] = FORMAT,
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="The verifier's Hugging Face id or path, recorded in speculators_config.")] = None,
    verifier_architecture: Annotated[Optional[list[str]], typer.Option("--verifier-architecture", help="The verifier's architectures entry (repeatable).")] = None,
    vocab_size: Annotated[Optional[int], typer.Option("--vocab-size", help="The target's vocabulary size, where the drafter file states none.")] = None,
    verifier_layers: Annotated[Optional[int], typer.Option("--verifier-layers", help="A draft head: the verifier's layer count (the format names the hidden state it reads by it).")] = None,
    spec_type: Annotated[Optional[str], typer.Option("--speculators-type", help="A draft head: the speculators type to write (default: the one whose equations the head fits).")] = None,
) -> None:
    """Write a tsspec drafter as a checkpoint other engines load (vLLM's --speculative-config)."""
    from tsspec.errors import OptionsError
    from tsspec_gguf.gguf_file import read_architecture

    from .exporter import ExportError, export_block, export_head

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
        config = export_head(drafter, out, kind=spec_type, verifier=verifier,
                             verifier_architectures=verifier_architecture or [], verifier_layers=verifier_layers)
        layer = config["transformer_layer_config"]
        typer.echo(f"wrote {out}: speculators {config['speculators_model_type']} (one {layer['model_type']} layer, "
                   f"hidden {layer['hidden_size']}, the verifier's LM head over {layer['vocab_size']} tokens)")
        return
    raise ExportError(f"{drafter}: architecture {arch!r} has no speculators type")


def register(app: typer.Typer) -> None:
    app.command(COMMAND)(export_drafter)
