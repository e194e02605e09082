"""``tsspec generate``: stream a completion from a model, with or without speculation."""

from __future__ import annotations

import json
import sys
from typing import Annotated, List, Optional

import typer

from ..errors import GenerationError
from . import flags
from .state import STATE

# The built-in request of `make run`: input-grounded (it quotes its input), where n-gram pays.
DEMO_SYSTEM = "You are a careful senior Python engineer."
DEMO_REQUEST = "Add type hints to this function. Keep the code and the docstring otherwise identical and return the whole function."


def demo_prompt() -> str:
    """The request with its input: a real function from the standard library."""
    import inspect
    import textwrap

    return f"{DEMO_REQUEST}\n\n```python\n{inspect.getsource(textwrap.indent)}```"


DEMO_MAX_TOKENS = 200


def _read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise GenerationError("give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        try:
            raw = open(prompt_file, "rb").read() if prompt_file != "-" else sys.stdin.buffer.read()
        except OSError as exc:
            raise GenerationError(f"cannot read the prompt file {prompt_file}: {exc.strerror or exc}") from None
    elif prompt is not None:
        return prompt
    elif not sys.stdin.isatty():
        raw = sys.stdin.buffer.read()
    else:
        raise GenerationError("no prompt: give --prompt TEXT, --prompt-file PATH, or pipe text in")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenerationError(f"the prompt is not valid UTF-8 (byte {exc.start})") from None


def describe_target(target) -> str:
    """One line on what runs: architecture, device, compute dtype, weight layout, CPU kernels."""
    config = getattr(target, "config", None)
    extra = dict(getattr(config, "extra", None) or {})
    parts = [str(getattr(config, "architecture", type(target).__name__))]
    device = getattr(target, "device", None)
    if device is not None:
        parts.append(str(device))
    if extra.get("dtype"):
        parts.append(str(extra["dtype"]))
    weights = extra.get("weights")
    if weights:
        parts.append(f"weights {weights}")
    toolkit = STATE.catalog.toolkit
    if weights == "blocks" and toolkit is not None and toolkit.kernels_info is not None:
        info = toolkit.kernels_info()
        if extra.get("arithmetic") == "int8":
            parts.append(f"arithmetic int8 ({info.get('int8')})")
        elif extra.get("arithmetic"):
            parts.append(f"arithmetic {extra['arithmetic']}")
        parts.append(f"kernels {info.get('simd')}")
    in_use = kernels_in_use(target)
    if in_use:
        parts.append(f"device kernels {', '.join(in_use)}")
    if extra.get("weight_formats"):  # how each ggml type of the file's matrices runs
        parts.append(f"tensor types [{extra['weight_formats']}]")
    return ", ".join(parts)


def kernels_in_use(target) -> list[str]:
    """Registered kernels the target (and its drafter) run: their ``kernels_in_use`` fields."""
    names: list[str] = []
    for part in (target, getattr(target, "draft_head", None)):
        for name in getattr(part, "kernels_in_use", None) or ():
            if name not in names:
                names.append(str(name))
    return names


def load_target(model: str | None, device: str, dtype: str | None, options, *, threads: int | None = None,
                ctx_size: int | None = None):
    """The model a command serves (``--threads`` applied before the load, ``--ctx-size`` after)."""
    from ..runtime.loading import load_model

    flags.apply_threads(threads)
    target = load_model(model, device=device, dtype=dtype, options=options, catalog=STATE.catalog)
    flags.apply_ctx_size(target, ctx_size)
    return target


def generate(
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text (or pipe it in).")] = None,
    prompt_file: Annotated[Optional[str], typer.Option("--prompt-file", help="Prompt file ('-' = stdin).")] = None,
    model: flags.Model = None,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Apply the model's chat template.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="System message (with --chat).")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens to generate.")] = 128,
    temperature: flags.Temperature = None,
    top_k: flags.TopK = None,
    top_p: flags.TopP = None,
    min_p: flags.MinP = None,
    repeat_penalty: flags.RepeatPenalty = None,
    seed: flags.Seed = None,
    stop: Annotated[Optional[List[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print a stats line after the text.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    device: flags.Device = "cpu",
    dtype: flags.Dtype = None,
    threads: flags.Threads = None,
    ctx_size: flags.CtxSize = None,
    demo: Annotated[bool, typer.Option("--demo", help="The built-in request (make run), timed against plain.")] = False,
    spec: flags.Spec = None,
    spec_type: flags.SpecType = None,
    spec_draft: flags.SpecDraft = None,
    spec_pmin: flags.SpecPmin = None,
    spec_draft_model: flags.SpecDraftModel = None,
    draft_model: flags.DraftModel = None,
    spec_adaptive: flags.Adaptive = None,
) -> None:
    """Generate text. Speculation (on by default, --spec-type auto) never changes the output."""
    from ..runtime.generation import generate as run_generate

    named_type = spec_type  # what the operator named (the demo's default is ours)
    if demo:
        # the demo drafts weight-free: the preferred weight-free algorithm installed (ngram)
        spec_type = spec_type or next(iter(STATE.catalog.speculators.weight_free()), "auto")
        chat, system = True, system or DEMO_SYSTEM
        max_tokens = DEMO_MAX_TOKENS if max_tokens == 128 else max_tokens
        text = demo_prompt() if prompt is None and prompt_file is None else _read_prompt(prompt, prompt_file)
    else:
        text = _read_prompt(prompt, prompt_file)
    options = flags.speculation_options(spec, spec_type, spec_draft, spec_pmin, spec_draft_model, draft_model,
                                        spec_adaptive)
    if options.enabled and not (demo and named_type is None):
        flags.check_spec_type(options.spec_type, STATE.catalog.speculators)
    sampling = flags.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    target = load_target(model, device, dtype, options, threads=threads, ctx_size=ctx_size)
    if getattr(target, "tokenizer", None) is None:
        raise GenerationError("this model has no tokenizer; the CLI needs one (use the Python API with token ids)")

    plain, common = None, dict(max_tokens=max_tokens, sampling=sampling, stop=stop or (), chat=chat, system=system)
    if demo:
        import attrs

        plain = run_generate(target, text, attrs.evolve(options, enabled=False), **common)
        typer.echo(f"[demo] {DEMO_REQUEST} (textwrap.indent)\n", err=True)

    def on_token(tok: int, piece: str):
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()

    sink = None if as_json else on_token
    result = run_generate(target, text, options, on_token=sink, registry=STATE.catalog.speculators, **common)
    if as_json:
        typer.echo(json.dumps(result.to_json()))
        return
    sys.stdout.write("\n")
    if result.decline is not None:
        typer.echo(f"[speculation off] {result.decline.code}: {result.decline.reason}", err=True)
    if stats or demo:
        line = f"[stats] {result.speculator or 'plain'}: {result.stats.one_line()}"
        typer.echo(line, err=True)
        typer.echo(f"[model] {describe_target(target)}", err=True)
        extra = dict(getattr(getattr(target, "config", None), "extra", None) or {})
        typer.echo(f"[lossless] {extra.get('lossless') or 'not stated by the model plugin'}", err=True)
    if plain is not None:
        same = "yes" if plain.tokens == result.tokens else "NO"
        ratio = result.stats.tokens_per_second / plain.stats.tokens_per_second if plain.stats.tokens_per_second else 0.0
        typer.echo(
            f"[demo] speed-up {ratio:.2f}x over plain decoding of the same request "
            f"({result.stats.tokens_per_second:.1f} vs {plain.stats.tokens_per_second:.1f} tok/s; "
            f"accepted {result.stats.accepted_tokens}/{result.stats.draft_tokens} drafted tokens; "
            f"output identical to plain: {same})",
            err=True,
        )
