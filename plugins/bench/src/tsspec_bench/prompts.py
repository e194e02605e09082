"""The benchmark's prompt set: Spec-Bench-style classes, documents drawn from Python itself.

A prompt file is JSONL, one case per line::

    {"id": "qa-1", "class": "qa", "max_tokens": 80,
     "documents": [{"module": "functools", "object": "lru_cache", "part": "doc"}],
     "messages": [{"role": "user", "content": "Passage:\\n{doc0}\\n\\nWhat happens when maxsize is None?"}]}

``class`` and ``max_tokens`` are required, and one of ``prompt`` (one user message, or raw text
with ``"chat": false``) or ``messages`` (a chat, rendered with the model's template). Documents
are read at run time from the running Python's standard library (``inspect.getdoc`` for
``"part": "doc"``, ``inspect.getsource`` for ``"part": "source"``) and replace ``{doc0}``,
``{doc1}``... in the text, so the shipped set carries no third-party text. The standard library
differs slightly between Python versions, so the prompts do too: reports record the version.

Why these classes: acceptance, and therefore every speed-up, depends on how predictable the
continuation is. Spec-Bench's tasks (multi-turn chat, translation, summarisation, QA, math,
retrieval-grounded answers) span input-grounded work where prompt lookup shines and free
generation where it cannot help; code editing and free prose bracket the range.
"""

from __future__ import annotations

import importlib
import inspect
import json
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import attrs

from tsspec.errors import TsspecError

SHIPPED_PROMPTS = "bench.jsonl"  # in the package data folder tsspec_bench/data/prompts/
DOC_PARTS = ("doc", "source")
PLACEHOLDER = "{doc%d}"


class PromptSetError(TsspecError):
    """A prompt file that cannot be used; the message names the file and line."""


@attrs.frozen
class PromptCase:
    """One benchmark request, before tokenisation."""

    id: str
    cls: str  # the prompt class ("qa", "code-edit"...)
    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()  # (role, content), rendered with the chat template
    prompt: str | None = None  # raw text when the case is not a chat
    chat: bool = True

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@attrs.frozen
class EncodedCase:
    """A case as token ids for one target; ``trimmed`` counts prompt tokens cut to fit."""

    case: PromptCase
    prompt_ids: tuple[int, ...]
    max_tokens: int
    trimmed: int = 0

    @property
    def id(self) -> str:
        return self.case.id

    @property
    def cls(self) -> str:
        return self.case.cls


def shipped_prompts_path() -> Path:
    """The prompt set that ships with tsspec."""
    return Path(str(resources.files("tsspec_bench") / "data" / "prompts" / SHIPPED_PROMPTS))


def _resolve_object(module: str, dotted: str | None):
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"module {module!r} cannot be imported: {exc}") from None
    for part in (dotted or "").split(".") if dotted else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module} has no attribute path {dotted!r}") from None
    return obj


def read_document(spec: dict[str, Any]) -> str:
    """Text of one document reference: ``{"module", "object"?, "part", "max_chars"?}``.

    Long documents are cut at a line boundary below ``max_chars`` so prompts stay within what
    a small model on two cores handles in a benchmark's time.
    """
    part = spec.get("part", "doc")
    if part not in DOC_PARTS:
        raise ValueError(f"document part must be one of {DOC_PARTS}, got {part!r}")
    obj = _resolve_object(str(spec["module"]), spec.get("object"))
    if part == "doc":
        text = inspect.getdoc(obj) or ""
    else:
        try:
            text = inspect.getsource(obj)
        except (OSError, TypeError) as exc:
            raise ValueError(f"no source for {spec['module']}.{spec.get('object')}: {exc}") from None
    if not text.strip():
        raise ValueError(f"{spec['module']}.{spec.get('object')} has no {part} text")
    limit = spec.get("max_chars")
    if limit is not None and len(text) > int(limit):
        cut = text.rfind("\n", 0, int(limit))
        text = text[: cut if cut > 0 else int(limit)].rstrip() + "\n"
    return text


def _fill(text: str, documents: Sequence[str]) -> str:
    for i, doc in enumerate(documents):
        text = text.replace(PLACEHOLDER % i, doc)
    return text


def parse_case(record: dict[str, Any], where: str) -> PromptCase:
    """One JSONL record -> PromptCase; errors name ``where`` (file:line)."""
    if not isinstance(record, dict):
        raise PromptSetError(f"{where}: each line must be a JSON object")
    try:
        cls = str(record["class"])
        max_tokens = int(record.get("max_tokens", 0))
    except KeyError:
        raise PromptSetError(f"{where}: the field 'class' is required") from None
    except (TypeError, ValueError):
        raise PromptSetError(f"{where}: max_tokens must be an integer") from None
    if max_tokens < 1:
        raise PromptSetError(f"{where}: max_tokens must be >= 1")
    try:
        documents = [read_document(d) for d in record.get("documents", ())]
    except (ValueError, KeyError) as exc:
        raise PromptSetError(f"{where}: {exc}") from None
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        raise PromptSetError(f"{where}: give exactly one of 'prompt' or 'messages'")
    case_id = str(record.get("id") or where)
    if has_prompt:
        text = record["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise PromptSetError(f"{where}: 'prompt' must be non-empty text")
        text = _fill(text, documents)
        chat = bool(record.get("chat", True))
        messages = (("user", text),) if chat else ()
        return PromptCase(case_id, cls, max_tokens, messages, None if chat else text, chat)
    raw = record["messages"]
    if not isinstance(raw, list) or not raw:
        raise PromptSetError(f"{where}: 'messages' must be a non-empty list")
    messages = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
            raise PromptSetError(f"{where}: each message needs 'role' and text 'content'")
        messages.append((str(m["role"]), _fill(m["content"], documents)))
    return PromptCase(case_id, cls, max_tokens, tuple(messages))


def load_prompt_set(path: str | Path | None = None) -> list[PromptCase]:
    """Cases from a JSONL file (default: the shipped set), in file order."""
    p = Path(path) if path is not None else shipped_prompts_path()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptSetError(f"{p}: cannot read the prompt file ({exc.strerror or exc})") from None
    cases = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSetError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        cases.append(parse_case(record, f"{p.name}:{n}"))
    if not cases:
        raise PromptSetError(f"{p}: no prompts in the file")
    ids = [c.id for c in cases]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise PromptSetError(f"{p}: duplicate prompt id {dup[0]!r}")
    return cases


def select_cases(cases: Sequence[PromptCase], classes: Sequence[str] | None, per_class: int | None) -> list[PromptCase]:
    """Keep the named classes (all when None) and at most ``per_class`` cases of each."""
    if classes:
        known = {c.cls for c in cases}
        unknown = [c for c in classes if c not in known]
        if unknown:
            raise PromptSetError(f"no prompt of class {unknown[0]!r} (classes: {', '.join(sorted(known))})")
    out, seen = [], {}
    for case in cases:
        if classes and case.cls not in classes:
            continue
        if per_class is not None and seen.get(case.cls, 0) >= per_class:
            continue
        seen[case.cls] = seen.get(case.cls, 0) + 1
        out.append(case)
    return out


def encode_case(target, case: PromptCase) -> EncodedCase:
    """Token ids of a case for ``target``, fitted into its context.

    Chats go through the model's chat template (a model without one gets the messages joined by
    blank lines). When prompt + budget exceed the context (the toy target holds 512), the
    prompt keeps its tail: the request and the most recent text are what the answer depends on.
    """
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        raise PromptSetError("the benchmark needs a model with a tokenizer")
    if case.chat:
        try:
            text = tokenizer.apply_chat_template(case.message_dicts(), add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
        except (AttributeError, NotImplementedError, ValueError):
            text = "\n\n".join(content for _, content in case.messages)
            ids = tokenizer.encode(text, add_special_tokens=True)
    else:
        ids = tokenizer.encode(case.prompt or "", add_special_tokens=True)
    max_ctx = int(target.max_context_length)
    budget = min(case.max_tokens, max(1, max_ctx // 4))
    room = max_ctx - budget - 1
    trimmed = max(0, len(ids) - room)
    if trimmed:
        ids = ids[trimmed:]
    return EncodedCase(case, tuple(int(t) for t in ids), budget, trimmed)
