"""OpenAI request bodies -> validated generation settings, with errors that name the field.

Every problem becomes a ``RequestError`` (HTTP 400 unless said otherwise) whose ``param`` is the
offending field, as OpenAI's error body has it: ``{"error": {"message", "type", "param",
"code"}}``. Nothing here touches the model beyond its facts (context, tokenizer).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import attrs

from tsspec import SamplingParams, SpeculationOptions

MAX_STOP = 4  # OpenAI allows up to 4 stop sequences
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat's top_logprobs
MAX_LOGIT_BIAS = 300  # OpenAI's bound on logit_bias entries
DEFAULT_CHAT_MAX_TOKENS = 256
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
ROLES = ("system", "user", "assistant")


class RequestError(Exception):
    """A request the server will not run: ``message`` for people, ``param`` the field."""

    def __init__(self, message: str, param: str | None = None, *, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@attrs.frozen
class Prepared:
    """A validated request, ready for the scheduler."""

    kind: str  # "chat" | "completion"
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    options: SpeculationOptions
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # alternatives per token (0: the token's own only); None: off
    context: str = "the model's context"  # what limits the tokens, for messages
    memory: bool = True  # False: the request opted out of the draft memory (neither read nor kept)
    key: str = ""  # the id of the request's API key (its draft pool; set by the app)


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"'{name}' must be a number, got {value!r}", name)
    if not low <= value <= high:
        raise RequestError(f"'{name}' must be between {low:g} and {high:g}, got {value!r}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"'{name}' must be {bounds}, got {value}", name)
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    if len(value) > MAX_STOP:
        raise RequestError(f"'stop' takes at most {MAX_STOP} strings, got {len(value)}", "stop")
    return tuple(s for s in value if s)


def sampling_params(body: Mapping[str, Any]) -> SamplingParams:
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)  # OpenAI's default
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise RequestError("'top_p' must be greater than 0", "top_p")
    top_k = _integer(body, "top_k", 0, 0)
    min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    seed = _integer(body, "seed", 0, -(1 << 63), (1 << 64) - 1)
    presence = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    frequency = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                          presence_penalty=presence, frequency_penalty=frequency)


def logit_bias(body: Mapping[str, Any], vocab: int | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: {"token id": bias in [-100, 100]} -> sorted (id, bias) pairs."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must be an object {token id: bias}", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise RequestError(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens, got {len(value)}", "logit_bias")
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise RequestError(f"'logit_bias' key {key!r} is not a token id", "logit_bias") from None
        if token < 0 or (vocab is not None and token >= vocab):
            raise RequestError(f"'logit_bias' token id {token} is outside the vocabulary", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise RequestError(f"'logit_bias' values must be numbers between -100 and 100, got {bias!r}", "logit_bias")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


def _unsupported(body: Mapping[str, Any]) -> None:
    """Fields this server does not implement: a 400 naming the field, never a silent drop."""
    for name in ("tools", "functions"):
        if body.get(name):
            raise RequestError(f"'{name}' (tool calling) is not supported by this server", name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise RequestError(f"'{name}' (tool calling) is not supported by this server", name)
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind != "text":
            raise RequestError(f"'response_format' {kind or fmt!r} is not supported by this server (only 'text')",
                               "response_format")
    if body.get("suffix"):
        raise RequestError("'suffix' (insertion) is not supported by this server", "suffix")
    if body.get("echo"):
        raise RequestError("'echo' is not supported by this server", "echo")
    if body.get("best_of") not in (None, 1):
        raise RequestError("'best_of' must be 1 (one choice per request)", "best_of")


def _logprobs(body: Mapping[str, Any], kind: str) -> int | None:
    """chat: ``logprobs`` true and ``top_logprobs`` 0..20; completions: ``logprobs`` 0..20."""
    if kind == "chat":
        value = body.get("logprobs")
        if value is not None and not isinstance(value, bool):
            raise RequestError("'logprobs' must be true or false", "logprobs")
        top = _integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if top is not None and not value:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return (top or 0) if value else None
    return _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)


def speculation_options(body: Mapping[str, Any], default: SpeculationOptions, names: Sequence[str], max_draft: int) -> SpeculationOptions:
    """The per-request ``speculative: {type, draft, pmin, memory}`` over the server's defaults
    (``memory`` is read by ``draft_memory``)."""
    value = body.get("speculative")
    if value is None:
        return default
    if not isinstance(value, dict):
        raise RequestError("'speculative' must be an object {type, draft, pmin, memory}", "speculative")
    unknown = sorted(set(value) - {"type", "draft", "pmin", "memory"})
    if unknown:
        raise RequestError(f"'speculative' has unknown keys {unknown}; known: type, draft, pmin, memory",
                           f"speculative.{unknown[0]}")
    options = default
    kind = value.get("type")
    if kind is not None:
        if not isinstance(kind, str):
            raise RequestError("'speculative.type' must be a string", "speculative.type")
        if kind in ("none", "off"):
            options = attrs.evolve(options, enabled=False)
        elif kind == "auto" or kind in names:
            options = attrs.evolve(options, enabled=True, spec_type=kind)
        else:
            known = ", ".join(["auto", "none", *sorted(names)])
            raise RequestError(f"unknown speculation type {kind!r}; known: {known}", "speculative.type")
    draft = value.get("draft")
    if draft is not None:
        if isinstance(draft, bool) or not isinstance(draft, int) or not 1 <= draft <= max_draft:
            raise RequestError(f"'speculative.draft' must be an integer between 1 and {max_draft}, got {draft!r}", "speculative.draft")
        options = attrs.evolve(options, draft=draft)
    pmin = value.get("pmin")
    if pmin is not None:
        if isinstance(pmin, bool) or not isinstance(pmin, (int, float)) or not 0.0 <= pmin <= 1.0:
            raise RequestError(f"'speculative.pmin' must be a number between 0 and 1, got {pmin!r}", "speculative.pmin")
        options = attrs.evolve(options, pmin=float(pmin))
    return options


def draft_memory(body: Mapping[str, Any]) -> bool:
    """``speculative.memory``: false opts the request out of the server's draft memory."""
    value = body.get("speculative")
    flag = value.get("memory", True) if isinstance(value, dict) else True
    if not isinstance(flag, bool):
        raise RequestError("'speculative.memory' must be true or false", "speculative.memory")
    return flag


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", f"messages[{i}].role")
        content = message.get("content")
        if isinstance(content, list):  # [{type: text, text}] parts
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise RequestError(f"messages[{i}].content parts must be text parts", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", f"messages[{i}].content")
        out.append({"role": role, "content": content})
    return out


def _common(body: Mapping[str, Any], model_ids: Sequence[str]) -> None:
    model = body.get("model")  # omitted: the loaded model, as llama.cpp's server does
    if model is not None and (not isinstance(model, str) or model not in model_ids):
        raise RequestError(
            f"the model {model!r} does not exist; this server serves {', '.join(repr(m) for m in model_ids)}",
            "model", code="model_not_found",
        )
    n = _integer(body, "n", 1, 1)
    if n != 1:
        raise RequestError(f"'n' must be 1 (one choice per request), got {n}", "n")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError("'stream' must be true or false", "stream")
    _unsupported(body)


def _budget(body: Mapping[str, Any], prompt_len: int, context: int, default: int, prompt_param: str,
            label: str = "the model's context") -> int:
    if prompt_len >= context:
        raise RequestError(
            f"the prompt ('{prompt_param}') has {prompt_len} tokens and {label} holds {context}: shorten it",
            prompt_param, code="context_length_exceeded",
        )
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    room = context - prompt_len
    value = _integer(body, name, None, 1)
    if value is None:
        return min(default, room)
    if value > room:
        raise RequestError(
            f"'{name}' is {value} but {label} holds {context} tokens and the prompt takes {prompt_len}: "
            f"at most {room}", name, code="context_length_exceeded",
        )
    return value


def _stream_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", "stream_options")
    return bool(options.get("include_usage", False))


def _prepared(kind: str, body: Mapping[str, Any], ids: list[int], *, tokenizer, context: int, default: SpeculationOptions,
              spec_names: Sequence[str], max_draft: int, context_label: str, prompt_param: str, default_max: int) -> Prepared:
    sampling = sampling_params(body)
    bias = logit_bias(body, getattr(tokenizer, "vocab_size", None))
    if bias:
        sampling = attrs.evolve(sampling, logit_bias=bias)
    return Prepared(
        kind, ids, _budget(body, len(ids), context, default_max, prompt_param, context_label), sampling,
        speculation_options(body, default, spec_names, max_draft), _stop(body), bool(body.get("stream", False)),
        _stream_usage(body), _logprobs(body, kind), context_label, draft_memory(body),
    )


def prepare_chat(body: Any, *, tokenizer, context: int, model_ids: Sequence[str], default: SpeculationOptions,
                 spec_names: Sequence[str], max_draft: int, context_label: str = "the model's context") -> Prepared:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _common(body, model_ids)
    messages = _messages(body)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return _prepared("chat", body, ids, tokenizer=tokenizer, context=context, default=default, spec_names=spec_names,
                     max_draft=max_draft, context_label=context_label, prompt_param="messages",
                     default_max=DEFAULT_CHAT_MAX_TOKENS)


def prepare_completion(body: Any, *, tokenizer, context: int, model_ids: Sequence[str], default: SpeculationOptions,
                       spec_names: Sequence[str], max_draft: int, context_label: str = "the model's context") -> Prepared:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _common(body, model_ids)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("'prompt' is empty", "prompt")
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = tokenizer.vocab_size if hasattr(tokenizer, "vocab_size") else None
        bad = [t for t in prompt if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise RequestError(f"'prompt' token id {bad[0]} is outside the vocabulary", "prompt")
        ids = list(prompt)
    else:
        raise RequestError("'prompt' must be a string, a one-string list or a list of token ids", "prompt")
    return _prepared("completion", body, ids, tokenizer=tokenizer, context=context, default=default,
                     spec_names=spec_names, max_draft=max_draft, context_label=context_label, prompt_param="prompt",
                     default_max=DEFAULT_COMPLETION_MAX_TOKENS)
