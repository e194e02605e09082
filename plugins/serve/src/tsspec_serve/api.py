"""The HTTP surface: OpenAI-compatible endpoints, health, metrics and the chat page.

``create_app(engine)`` returns a FastAPI application. Responses follow OpenAI's shapes; on top
they carry llama.cpp's ``timings`` (with ``draft_n`` / ``draft_n_accepted`` when anything was
drafted) and a ``speculative`` object saying what ran (algorithm, drafts, prefix reuse, arming).
Streams are server-sent events ending in ``data: [DONE]``. Every refused request gets
``{"error": {message, type, param, code}}`` with HTTP 400 (404 for an unknown path, 401 for a
missing or wrong API key when the server has keys: ``Authorization: Bearer KEY``).
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from importlib import resources
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tsspec.errors import GenerationError

from .engine import Done, Piece, ServeEngine
from .memory import key_id
from .metrics import CONTENT_TYPE
from .payload import Prepared, RequestError, prepare_chat, prepare_completion


def timings(result) -> dict[str, Any]:
    """llama.cpp's ``timings`` object for a finished generation."""
    stats = result.stats
    prompt_n = max(0, result.prompt_tokens - stats.prefix_reused)
    prompt_ms = stats.phase_ms.get("prefill", 0.0)
    predicted_n = len(result.tokens)
    predicted_ms = stats.decode_ms
    out = {
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(1000.0 * prompt_n / prompt_ms, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(1000.0 * predicted_n / predicted_ms, 3) if predicted_ms > 0 else 0.0,
        "cache_n": stats.prefix_reused,
    }
    if stats.draft_tokens:
        out["draft_n"] = stats.draft_tokens
        out["draft_n_accepted"] = stats.accepted_tokens
    return out


def speculative(result, memory: dict | None = None) -> dict[str, Any]:
    """What ran; ``memory``: the draft memory's counts when the request drafted from a pool."""
    stats = result.stats
    out = {
        "type": result.speculator,
        "decline": None if result.decline is None else result.decline.to_json(),
        "drafts": stats.drafts,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "prefix_reused": stats.prefix_reused,
        "armed_after_reuse": stats.armed_after_reuse if stats.prefix_reused else None,
        "governor_parked_steps": stats.governor_parked_steps,
    }
    if memory is not None:
        out["memory"] = dict(memory)
    return out


def usage(result) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.tokens),
        "total_tokens": result.prompt_tokens + len(result.tokens),
    }


def finish_reason(result) -> str:
    return "stop" if result.finish_reason == "stop" else "length"


class LogprobFormat:
    """OpenAI's ``logprobs`` objects from ``TokenLogprob`` entries: chat's ``{"content": [...]}``
    and the legacy completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _item(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def chat(self, entries) -> dict[str, Any]:
        return {"content": [
            {**self._item(e.token, e.logprob), "top_logprobs": [self._item(i, lp) for i, lp in e.top]}
            for e in entries
        ]}

    def completion(self, entries, offset: int = 0) -> dict[str, Any]:
        tokens = [self.text(e.token) for e in entries]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self.text(i): lp for i, lp in e.top} for e in entries],
            "text_offset": offsets,
        }


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(engine: ServeEngine, *, api_keys=()) -> FastAPI:
    """The application; ``api_keys``: the keys a ``/v1/`` request must bear (none: open)."""
    app = FastAPI(title="tsspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    keys = tuple(k.encode() for k in api_keys)
    formats = LogprobFormat(engine.tokenizer)

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        request.state.api_key = None  # the key's pool: one pool when the server has no keys
        if keys and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
            # compare with every key in constant time (no early exit on the first match)
            if not any([hmac.compare_digest(token, key) for key in keys]):
                engine.metrics.refused(401)
                message = "a valid API key is required: Authorization: Bearer KEY" if not token else "the API key is not valid"
                return JSONResponse(RequestError(message, code="invalid_api_key", status=401).body(), status_code=401)
            request.state.api_key = token.decode()
        return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        engine.metrics.refused(exc.status_code)
        body = RequestError(f"{request.method} {request.url.path}: {exc.detail}", code=str(exc.status_code), status=exc.status_code).body()
        return JSONResponse(body, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("tsspec_serve").joinpath("static/index.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        snap = engine.scheduler.snapshot()
        return {"status": "ok", "running": snap["running"], "waiting": snap["waiting"]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": engine.model_id, "object": "model", "created": engine.created, "owned_by": "tsspec",
            "max_model_len": engine.context,
            "meta": {"context_length": engine.context, "model_context_length": engine.target.max_context_length,
                     "architecture": engine.target.config.architecture},
        }]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE)

    async def _body(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the request body is not valid JSON: {exc}") from None

    async def _serve(request: Request, kind: str):
        try:
            body = await _body(request)
            prepare = prepare_chat if kind == "chat" else prepare_completion
            prepared = attrs.evolve(prepare(body, **engine.prepare_kwargs()), key=key_id(request.state.api_key))
            stream = engine.run(prepared)
            first = await _first(stream)
        except RequestError as exc:
            engine.metrics.refused(exc.status)
            return _error(exc)
        ident = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        if prepared.stream:
            return StreamingResponse(_events(kind, ident, prepared, first, stream), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(kind, ident, first, stream)

    async def _first(stream):
        """Submit (through the first step of the iterator) so admission errors become 400s."""
        try:
            return await stream.__anext__()
        except GenerationError as exc:
            raise RequestError(str(exc), "max_tokens") from None

    def _logprobs(kind: str, entries, offset: int = 0) -> dict[str, Any] | None:
        if entries is None:
            return None
        return formats.chat(entries) if kind == "chat" else formats.completion(entries, offset)

    def _chunk(kind: str, ident: str, created: int, text: str | None, reason: str | None, first: bool = False,
               logprobs: dict | None = None) -> dict:
        if kind == "chat":
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": engine.model_id, "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        return {"id": ident, "object": "text_completion", "created": created, "model": engine.model_id, "choices": [choice]}

    async def _events(kind: str, ident: str, prepared: Prepared, first, stream):
        created = int(time.time())
        wants = prepared.logprobs is not None
        sent, offset = 0, 0  # logprob entries streamed, and the text before the next one
        try:
            if kind == "chat":
                yield _sse(_chunk(kind, ident, created, None, None, first=True))
            event = first
            while True:
                if isinstance(event, Piece):
                    if event.text or event.logprobs:
                        logprobs = _logprobs(kind, event.logprobs, offset) if wants else None
                        sent += len(event.logprobs)
                        offset += len(event.text)
                        yield _sse(_chunk(kind, ident, created, event.text, None, logprobs=logprobs))
                else:
                    yield _final(kind, ident, created, prepared, event, sent, offset)
                    break
                event = await stream.__anext__()
            yield "data: [DONE]\n\n"
        finally:
            await stream.aclose()  # a client that left: the sequence is cancelled

    def _final(kind: str, ident: str, created: int, prepared: Prepared, done: Done, sent: int = 0, offset: int = 0) -> str:
        handle = done.handle
        result = handle.result
        if result is None:
            message = f"generation failed: {handle.error!r}" if handle.error is not None else "generation was cancelled"
            return _sse(RequestError(message, code=handle.state, status=500).body())
        rest = result.logprobs[sent:] if result.logprobs is not None else None  # tokens that had no text yet
        chunk = _chunk(kind, ident, created, None, finish_reason(result), logprobs=_logprobs(kind, rest, offset))
        chunk["usage"] = usage(result)
        chunk["timings"] = timings(result)
        chunk["speculative"] = speculative(result, done.memory)
        out = _sse(chunk)
        if prepared.include_usage:
            out += _sse({"id": ident, "object": chunk["object"], "created": created, "model": engine.model_id,
                         "choices": [], "usage": usage(result)})
        return out

    async def _whole(kind: str, ident: str, first, stream):
        event = first
        pieces: list[str] = []
        while isinstance(event, Piece):
            pieces.append(event.text)
            event = await stream.__anext__()
        handle, memory = event.handle, event.memory
        result = handle.result
        if result is None:
            message = f"generation failed: {handle.error!r}" if handle.error is not None else "generation was cancelled"
            return JSONResponse(RequestError(message, code=handle.state, status=500).body(), status_code=500)
        text = result.text if result.text is not None else "".join(pieces)
        created = int(time.time())
        logprobs = _logprobs(kind, result.logprobs)
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": finish_reason(result)}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(result)}
            obj = "text_completion"
        return JSONResponse({
            "id": ident, "object": obj, "created": created, "model": engine.model_id, "choices": [choice],
            "usage": usage(result), "timings": timings(result), "speculative": speculative(result, memory),
        })

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(request, "completion")

    return app
