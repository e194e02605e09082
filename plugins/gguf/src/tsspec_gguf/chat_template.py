"""Rendering a model's chat template (``tokenizer.chat_template``, jinja2) the way HF does.

Templates are written against the Hugging Face rendering environment, so the same globals and
filters must exist here or templates break: a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception(msg)``, ``strftime_now(fmt)``,
a ``tojson`` that does not HTML-escape, and the ``{% generation %}`` block (rendered as its body).

Example::

    template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)  # "<user>hi"
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

from tsspec.errors import GenerationError

__all__ = ["ChatTemplate", "ChatTemplateError"]


class ChatTemplateError(GenerationError):
    """The template cannot be compiled or refused the conversation (``raise_exception``)."""


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _generation_extension():
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; for
    rendering it is just its body."""
    import jinja2
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    return GenerationBlock


class ChatTemplate:
    """A compiled chat template; ``render`` gives the prompt text (special tokens as text)."""

    def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_generation_extension(), jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        import jinja2

        variables = {**self.special_tokens, **extra}
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=None if tools is None else [dict(t) for t in tools],
                documents=None if documents is None else [dict(d) for d in documents],
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template: {exc}") from None
