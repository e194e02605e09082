"""The server's engine: a loaded target, the core's scheduler and the bridge to asyncio.

A request runs in the scheduler (its own worker thread, batched with everyone else's); its
tokens come back to the event loop through an ``asyncio.Queue`` as ``Piece`` events and one
``Done``. Leaving the stream early (a client that disconnected) cancels the sequence: the
scheduler frees its blocks at its next step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator

import attrs

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.scheduler import MAX_WINDOW, Scheduler, SequenceHandle, SequenceRequest

from .metrics import ServerMetrics
from .payload import Prepared


@attrs.frozen
class Piece:
    token: int
    text: str


@attrs.frozen
class Done:
    handle: SequenceHandle
    first_token_at: float | None
    arrived_at: float


class ServeEngine:
    """See the module docstring."""

    def __init__(
        self,
        target,
        *,
        model_id: str | None = None,
        options: SpeculationOptions | None = None,
        registry=None,
        kv_cache_mb: float = 256.0,
        block_size: int = 16,
        max_seqs: int = 8,
        batch_wait_ms: float = 50.0,
    ):
        if getattr(target, "tokenizer", None) is None:
            raise ValueError("the model has no tokenizer: the server needs one")
        if registry is None:
            from tsspec.runtime.defaults import default_catalog

            registry = default_catalog().speculators
        self.target = target
        self.tokenizer = target.tokenizer
        self.model_id = model_id or Path(str(getattr(target, "path", None) or "model")).stem
        self.options = options or SpeculationOptions()
        self.registry = registry
        self.spec_names = list(registry.names())
        self.max_draft = MAX_WINDOW
        self.created = int(time.time())
        self.scheduler = Scheduler(
            target, kv_cache_mb=kv_cache_mb, block_size=block_size, max_seqs=max_seqs,
            batch_wait_ms=batch_wait_ms, registry=registry,
        )
        self.metrics = ServerMetrics(self.scheduler)

    @property
    def context(self) -> int:
        return self.target.max_context_length

    def start(self) -> "ServeEngine":
        self.scheduler.start()
        return self

    def close(self) -> None:
        self.scheduler.close()

    def prepare_kwargs(self) -> dict[str, Any]:
        return dict(tokenizer=self.tokenizer, context=self.context, model_ids=[self.model_id],
                    default=self.options, spec_names=self.spec_names, max_draft=self.max_draft)

    async def run(self, prepared: Prepared) -> AsyncIterator[Piece | Done]:
        """Submit and yield the request's pieces, then one Done. Closing the iterator early
        cancels the sequence."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        arrived = time.perf_counter()
        timing = {"first": None, "last": None}
        observe = self.metrics

        def on_token(token: int, text: str):  # the sequence's worker thread
            now = time.perf_counter()
            if timing["first"] is None:
                timing["first"] = now
                observe.ttft(now - arrived)
            else:
                observe.itl(now - timing["last"])
            timing["last"] = now
            loop.call_soon_threadsafe(queue.put_nowait, Piece(token, text))

        def on_done(handle: SequenceHandle):  # the worker thread, whatever the outcome
            observe.finished(handle)
            loop.call_soon_threadsafe(queue.put_nowait, Done(handle, timing["first"], arrived))

        request = SequenceRequest(
            prepared.prompt_ids, prepared.max_tokens, sampling=prepared.sampling, options=prepared.options,
            stop=prepared.stop, on_token=on_token, on_done=on_done,
        )
        handle = self.scheduler.submit_request(request)
        finished = False
        try:
            while True:
                event = await queue.get()
                if isinstance(event, Done):
                    finished = True
                    yield event
                    return
                yield event
        finally:
            if not finished:
                self.scheduler.cancel(handle)
