"""Option declarations shared by the commands (speculation, sampling, model), and their
conversion into SpeculationOptions / SamplingParams with one-line errors."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from ..errors import OptionsError
from ..runtime.options import SpeculationOptions
from .state import STATE

SPEC_PANEL = "Speculation"
SAMPLING_PANEL = "Sampling"


def _opt(kind, help: str | None, *names: str, panel: str | None = None):
    """``Optional[kind]`` annotated with a typer option."""
    return Annotated[Optional[kind], typer.Option(*names, help=help, rich_help_panel=panel)]


def _spec(kind, help: str, *names: str):
    return _opt(kind, help, *names, panel=SPEC_PANEL)


def _sampling(kind, name: str, help: str | None = None):
    return _opt(kind, help, name, panel=SAMPLING_PANEL)


Spec = _spec(bool, "Enable or disable speculative decoding.", "--spec/--no-spec", "--mtp-spec/--no-mtp-spec")
SpecType = _spec(str, "auto | draft-head | block | ngram | any plugin's algorithm.", "--spec-type")
SpecDraft = _spec(int, "Max tokens drafted per step (1-64, default 8).", "--spec-draft", "--mtp-draft")
SpecPmin = _spec(float, "Confidence gate; default per algorithm.", "--spec-pmin", "--mtp-pmin")
SpecDraftModel = _spec(str, "Separate draft-head GGUF.", "--spec-draft-model", "--mtp-draft-model")
DraftModel = _spec(str, "Block drafter GGUF (DFlash...).", "--draft-model")
Adaptive = _spec(bool, "Cost governor on/off (TS_SPEC_ADAPTIVE).", "--spec-adaptive/--no-spec-adaptive")
Temperature = _sampling(float, "--temperature", "0 = greedy (the default).")
TopK = _sampling(int, "--top-k")
TopP = _sampling(float, "--top-p")
MinP = _sampling(float, "--min-p")
RepeatPenalty = _sampling(float, "--repeat-penalty")
Seed = _sampling(int, "--seed")
_MODEL_HELP = "GGUF file or model name (`tsspec models`; default: the default model a plugin offers; 'toy': the test toy)."
Model = _opt(str, _MODEL_HELP, "--model", "-m")
Device = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
Threads = _opt(int, "CPU threads for torch and the compiled kernels (default: torch's).", "--threads", "-t")
CtxSize = _opt(int, "Context length in tokens, at most the model's (default: the model's).", "--ctx-size", "-c")
_DTYPE_HELP = (
    "Unset on cpu: the file's quantised blocks on the compiled kernels (the fast path). int8 = blocks with int8 "
    "activations (llama.cpp's arithmetic); float32-blocks = blocks with exact float32 math; float32 = dense float32 "
    "weights; float16, bfloat16 = 16-bit weights."
)
Dtype = _opt(str, _DTYPE_HELP, "--dtype")


def speculation_options(
    spec: bool | None,
    spec_type: str | None,
    draft: int | None,
    pmin: float | None,
    spec_draft_model: str | None,
    draft_model: str | None,
    adaptive: bool | None,
    *,
    warn: bool = True,
) -> SpeculationOptions:
    """Resolve flags + environment + config; print the no-effect warnings; publish TS_* env."""
    cli = dict(enabled=spec, spec_type=spec_type, draft=draft, pmin=pmin, spec_draft_model=spec_draft_model,
               draft_model=draft_model, adaptive=adaptive)
    options = SpeculationOptions.resolve(cli=cli, env=os.environ, config=STATE.config.get("spec"))
    if warn:
        for line in options.ignored_tuning_warnings():
            typer.echo(line, err=True)
    options.publish()
    return options


def check_spec_type(name: str, registry) -> None:
    """An algorithm named explicitly must exist: a typo is an error listing the known names."""
    from ..runtime.registry import AUTO

    if name != AUTO and registry.get(name) is None:
        known = ", ".join([AUTO, *registry.names()])
        raise OptionsError(f"unknown --spec-type {name!r}; known: {known}")


def sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed):
    from ..runtime.sampling import SamplingParams

    conf = STATE.config.get("sampling", {})
    values = {
        "temperature": temperature if temperature is not None else conf.get("temperature", 0.0),
        "top_k": top_k if top_k is not None else conf.get("top_k", 0),
        "top_p": top_p if top_p is not None else conf.get("top_p", 1.0),
        "min_p": min_p if min_p is not None else conf.get("min_p", 0.0),
        "repeat_penalty": repeat_penalty if repeat_penalty is not None else conf.get("repeat_penalty", 1.0),
        "seed": seed if seed is not None else conf.get("seed", 0),
    }
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None


def apply_threads(threads: int | None) -> None:
    """``-t/--threads``: torch's intra-op thread count, which the compiled kernels follow."""
    if threads is None:
        return
    if threads < 1:
        raise OptionsError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def apply_ctx_size(target, ctx_size: int | None) -> None:
    """``-c/--ctx-size``: cap the target's context (its optional ``spec_set_context_length``)."""
    if ctx_size is None:
        return
    if ctx_size < 1:
        raise OptionsError(f"--ctx-size must be >= 1, got {ctx_size}")
    setter = getattr(target, "spec_set_context_length", None)
    if setter is None:
        raise OptionsError(f"--ctx-size: this model ({type(target).__name__}) does not take a context length")
    setter(ctx_size)
