"""``tsspec chat``: a multi-turn terminal chat in the model's own chat template; an empty line,
``/exit`` or end of input ends it."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from . import flags
from .state import STATE

EXIT_WORDS = ("/exit", "/quit")


def chat(
    model: flags.Model = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System message.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens per reply at most.")] = 256,
    temperature: flags.Temperature = None,
    top_k: flags.TopK = None,
    top_p: flags.TopP = None,
    min_p: flags.MinP = None,
    repeat_penalty: flags.RepeatPenalty = None,
    seed: flags.Seed = None,
    stats: Annotated[bool, typer.Option("--stats", help="A stats line after each reply.")] = False,
    device: flags.Device = "cpu",
    dtype: flags.Dtype = None,
    threads: flags.Threads = None,
    ctx_size: flags.CtxSize = None,
    spec: flags.Spec = None,
    spec_type: flags.SpecType = None,
    spec_draft: flags.SpecDraft = None,
    spec_pmin: flags.SpecPmin = None,
    spec_draft_model: flags.SpecDraftModel = None,
    draft_model: flags.DraftModel = None,
    spec_adaptive: flags.Adaptive = None,
) -> None:
    """Chat with the model, turn by turn, through its chat template."""
    from ..errors import GenerationError
    from ..runtime.generation import generate as run_generate
    from .generate_cmd import load_target

    options = flags.speculation_options(spec, spec_type, spec_draft, spec_pmin, spec_draft_model, draft_model, spec_adaptive)
    if options.enabled:
        flags.check_spec_type(options.spec_type, STATE.catalog.speculators)
    sampling = flags.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    target = load_target(model, device, dtype, options, threads=threads, ctx_size=ctx_size)
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None or not tokenizer.has_chat_template:
        raise GenerationError("this model has no chat template (tokenizer.chat_template): use generate --raw")
    messages = [{"role": "system", "content": system}] if system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            typer.echo(">>> ", nl=False, err=True)
        line = sys.stdin.readline()
        text = line.strip()
        if not text or text in EXIT_WORDS:
            break
        messages.append({"role": "user", "content": text})
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)

        def on_token(tok: int, piece: str):
            if piece:
                sys.stdout.write(piece)
                sys.stdout.flush()

        result = run_generate(target, ids, options, max_tokens=max_tokens, sampling=sampling, on_token=on_token,
                              registry=STATE.catalog.speculators)
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": result.text})
        if stats:
            typer.echo(f"[stats] {result.speculator or 'plain'}: {result.stats.one_line()}", err=True)
