"""The generation engine: text or ids in, a ``Generation`` out. The same surface the CLI uses.

It resolves the speculator through the registry (or takes one given), builds the trunk, the
sampler and the governor, runs ``SpeculativeExecution`` and turns tokens back into text with
stop strings applied.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import attrs

from ..capabilities import speculator_info, target_info, verify_cost_shape
from ..errors import GenerationError
from .execution import SpeculativeExecution
from .governor import SpeculationCostGovernor
from .options import SpeculationOptions
from .registry import Decline
from .sampling import Sampler, SamplingParams, TokenLogprob
from .stats import SpecStats
from .text_stream import TextStream

log = logging.getLogger("tsspec.generation")

# on_token(token_id, text_piece) -> True to stop after this token
OnToken = Callable[[int, str], "bool | None"]


@attrs.define
class Generation:
    """The result of one request."""

    text: str | None  # None when the model has no tokenizer
    tokens: list[int]  # emitted ids (stop strings cut the text, not this list)
    prompt_tokens: int
    stats: SpecStats
    speculator: str | None  # the algorithm that ran, or None
    decline: Decline | None = None  # why none ran, when speculation was asked for
    finish_reason: str = "length"  # length | stop | context
    logprobs: list[TokenLogprob] | None = None  # one per emitted token, when asked for

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
            "speculator": self.speculator,
            "decline": None if self.decline is None else self.decline.to_json(),
            "stats": self.stats.to_json(),
        }


def encode_prompt(target, prompt: str | Sequence[int], *, chat: bool = False, system: str | None = None) -> list[int]:
    """Token ids for a prompt given as text (needs the target's tokenizer) or as ids."""
    if isinstance(prompt, str):
        tokenizer = getattr(target, "tokenizer", None)
        if tokenizer is None:
            raise GenerationError("this model has no tokenizer: give the prompt as token ids")
        if not prompt.strip():
            raise GenerationError("the prompt is empty")
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)
        return tokenizer.encode(prompt, add_special_tokens=True)
    ids = [int(t) for t in prompt]
    if not ids:
        raise GenerationError("the prompt is empty")
    vocab = target.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise GenerationError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    return ids


def draft_window(options: SpeculationOptions, target, speculator=None, name: str | None = None) -> int:
    """The draft window, decided once per sequence (speculators read it from DraftContext):
    the operator's --spec-draft, else the default narrowed by the target's preferred window;
    never more than the speculator's own ``max_draft_tokens``."""
    window = options.window(target_info(target).preferred_draft_window)
    if speculator is not None:
        limit = speculator_info(speculator).max_draft_tokens
        if limit is not None:
            window = max(0, min(window, limit))
    return window


def _park_memory(target, registry, options: SpeculationOptions, speculator, governor):
    """The registry's memory for the algorithm ``options`` resolved to on ``target`` when a
    lost park should carry to the next sequence (``SpeculatorRegistry.carries_parks``; never
    for auto's pair, whose weight-free primary's gain is the prompt's), else None."""
    if speculator is None or not governor.enabled:
        return None
    name = registry.resolve_name(target, options.spec_type)
    if not isinstance(name, str) or not registry.carries_parks(name) or speculator.name != name:
        return None  # the algorithm's own parks only: never a composition's (auto's pair)
    return registry.memory(target, f"loop:{name}")


def resolve_speculator(target, options: SpeculationOptions, registry=None):
    """(speculator | None, name | None, decline | None) for a request."""
    if not options.enabled:
        return None, None, None
    if registry is None:
        from .defaults import default_catalog

        registry = default_catalog().speculators
    made = registry.create(target, options)
    if isinstance(made, Decline):
        return None, None, made
    return made, made.name, None


def _plugin_label(target, options: SpeculationOptions, registry, name: str | None) -> str | None:
    """``"<name> (plugin <plugin>)"`` for a speculator the registry made, else ``name``."""
    if name is None:
        return None
    resolved = registry.resolve_name(target, options.spec_type)
    entry = registry.get(resolved) if isinstance(resolved, str) else None
    return f"{name} (plugin {entry.plugin})" if entry is not None and entry.plugin else name


def generate(
    target,
    prompt: str | Sequence[int],
    options: SpeculationOptions | None = None,
    *,
    max_tokens: int = 64,
    sampling: SamplingParams | None = None,
    speculator=None,
    registry=None,
    on_token: OnToken | None = None,
    stop: Sequence[str] = (),
    stop_tokens: Sequence[int] | None = None,
    governor: SpeculationCostGovernor | None = None,
    chat: bool = False,
    system: str | None = None,
    clock=None,
    trunk=None,
    arm_after_reuse: bool | None = None,
    logprobs: int | None = None,
    logprob_sink: list | None = None,
) -> Generation:
    """Generate up to ``max_tokens`` tokens. Speculation never changes the output.

    ``trunk``: the SpecTrunk to run on (default: the target itself, its own linear cache); the scheduler
    passes a ``BatchedSpecTrunk``. ``arm_after_reuse=False`` never arms a speculator after a
    reused KV prefix (the refuse-all rule, for comparisons; None lets the speculator decide).
    ``logprobs``: keep each emitted token's ``TokenLogprob`` with that many alternatives (0: the
    token's own only); they are appended to ``logprob_sink`` (when given) as each token is
    emitted, before ``on_token`` hears of it."""
    options = options or SpeculationOptions()
    if max_tokens < 1:
        raise GenerationError(f"max tokens must be >= 1, got {max_tokens}")
    ids = encode_prompt(target, prompt, chat=chat, system=system)
    max_ctx = target.max_context_length
    if len(ids) >= max_ctx:
        raise GenerationError(
            f"the prompt has {len(ids)} tokens and the context holds {max_ctx}: shorten it"
        )
    decline = None
    name = None
    label = None  # for the loop's fault log: names the plugin to blame
    if speculator is None:
        if registry is None and options.enabled:
            from .defaults import default_catalog

            registry = default_catalog().speculators
        speculator, name, decline = resolve_speculator(target, options, registry)
        label = _plugin_label(target, options, registry, name)
    elif options.enabled:
        name = speculator_info(speculator).name  # a wrong member: ContractError, named
    else:
        speculator = None
    tokenizer = getattr(target, "tokenizer", None)
    if stop_tokens is None:
        stop_tokens = sorted(getattr(tokenizer, "eos_token_ids", ()) or ())
    window = draft_window(options, target, speculator, name)
    sampler = Sampler(sampling or SamplingParams(), logprobs=logprobs)
    kept_logprobs = (logprob_sink if logprob_sink is not None else []) if logprobs is not None else None
    memory = None  # where the loop's governor carries a lost park to this target's next sequence
    if governor is None:
        # plain decoding (no speculator) gets no governor: there is nothing to park. Calibrated
        # drafts are priced by the target's cost by rows (spec_verify_row_ms) where it has one.
        enabled = options.adaptive and speculator is not None
        governor = SpeculationCostGovernor(enabled=enabled, cost_shape=lambda: verify_cost_shape(target))
        memory = _park_memory(target, registry, options, speculator, governor) if label is not None else None
        if memory is not None:
            governor.carried = memory.pop("park", None)
    execution = SpeculativeExecution(
        trunk if trunk is not None else target,
        sampler,
        vocab_size=target.config.vocab_size,
        speculator=speculator,
        window=window,
        governor=governor,
        stop_tokens=frozenset(stop_tokens),
        speculator_label=label or name,
        arm_after_reuse=arm_after_reuse,
        **({"clock": clock} if clock is not None else {}),
    )
    stream = TextStream(tokenizer, stop)
    streaming = on_token is not None or bool(stream.stop) or kept_logprobs is not None
    emitted = [0]

    def _on_token(tok: int) -> bool:
        if kept_logprobs is not None:  # emitted token i was drawn at position len(ids) + i
            kept_logprobs.append(sampler.recorded.pop(len(ids) + emitted[0]))
            emitted[0] += 1
        piece = stream.push(tok)
        stop_now = stream.stopped
        if on_token is not None and (piece or tokenizer is None or stop_now):
            if on_token(tok, piece):
                stop_now = True
        return stop_now

    try:
        # detokenise per token only when someone listens or stop strings need it
        tokens = execution.run(ids, max_tokens, on_token=_on_token if streaming else None)
    finally:
        carried = governor.carry_over() if memory is not None else None
        if carried is not None:
            memory["park"] = carried
        if speculator is not None:
            try:
                execution.info.close()  # the speculator's close, or the default (nothing)
            except Exception as exc:  # a plugin's close must not lose the output
                log.warning("speculator %s close raised: %r", name, exc)
    if streaming:
        tail = stream.finish()
        if tail and on_token is not None:
            on_token(tokens[-1] if tokens else -1, tail)
    finish = "length"
    if stream.stopped or (tokens and tokens[-1] in set(stop_tokens)):
        finish = "stop"
    elif len(tokens) < max_tokens:
        finish = "context"
    text = None
    if tokenizer is not None:
        text = stream.text if streaming else tokenizer.decode(tokens, skip_special_tokens=True)
    return Generation(
        text=text,
        tokens=tokens,
        prompt_tokens=len(ids),
        stats=execution.stats,
        speculator=name,
        decline=decline,
        finish_reason=finish,
        logprobs=kept_logprobs,
    )
