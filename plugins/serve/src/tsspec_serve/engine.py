"""The server's engine: a loaded target, the scheduler and the bridge to asyncio.

A request runs in the scheduler (its own worker thread, batched with everyone else's); its
tokens come back to the event loop through an ``asyncio.Queue`` as ``Piece`` events and one
``Done``. Leaving the stream early (a client that disconnected) cancels the sequence: the
scheduler frees its blocks at its next step.

The context the server advertises (``context``) is what one request can really hold: the
model's context, or less when the paged KV cache is smaller (``--kv-cache-mb``); left unset,
the cache is sized so that one request of the model's whole context fits.

Draft memory (``memory``: a ``PoolStore``; None: off): a finished request's prompt and output are
merged into the pool of its API key, unless it opted out; a request that runs ``ngram-pool``
(chosen, or ``auto`` where ``auto`` would run a weight-free algorithm) drafts from that pool.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator

import attrs

from tsspec import SpeculationOptions

from .memory import PoolStore
from .metrics import ServerMetrics
from .payload import Prepared
from .pool_speculator import NAME as POOL
from .scheduler import MAX_WINDOW, Scheduler, SequenceHandle, SequenceRequest


DEFAULT_KV_CACHE_MB = 256.0  # the least the paged cache gets when sized automatically


@attrs.frozen
class Piece:
    token: int
    text: str
    logprobs: tuple = ()  # the TokenLogprob of each token since the previous piece, when asked for


def kv_cache_mb_for_context(target, block_size: int) -> float:
    """MiB of paged KV that hold one request of the model's whole context (with the draft window
    and the copy-on-write block the scheduler reserves), at least ``DEFAULT_KV_CACHE_MB``."""
    per_block = getattr(target, "spec_kv_bytes_per_block", None)
    if not callable(per_block):
        return DEFAULT_KV_CACHE_MB
    blocks = math.ceil(target.max_context_length / block_size) + 2
    return max(DEFAULT_KV_CACHE_MB, math.ceil(blocks * per_block(block_size) / (1 << 20)) + 1.0)


@attrs.frozen
class Done:
    handle: SequenceHandle
    first_token_at: float | None
    arrived_at: float
    memory: dict | None = None  # the draft memory's counts for this request (None: not used)


class ServeEngine:
    """See the module docstring."""

    def __init__(
        self,
        target,
        *,
        model_id: str | None = None,
        options: SpeculationOptions | None = None,
        registry=None,
        kv_cache_mb: float | None = None,
        block_size: int = 16,
        max_seqs: int = 8,
        batch_wait_ms: float = 50.0,
        memory: PoolStore | None = None,
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
        self.kv_cache_mb = kv_cache_mb if kv_cache_mb is not None else kv_cache_mb_for_context(target, block_size)
        kv_cache_mb = self.kv_cache_mb
        self.scheduler = Scheduler(
            target, kv_cache_mb=kv_cache_mb, block_size=block_size, max_seqs=max_seqs,
            batch_wait_ms=batch_wait_ms, registry=registry,
        )
        self.metrics = ServerMetrics(self.scheduler)
        self.memory = memory
        self._merges = 0  # requests still to be merged into a pool (counted from submission)
        self._merged = threading.Condition()

    @property
    def context(self) -> int:
        """The most tokens (prompt + completion) one request can hold on this server."""
        model = self.target.max_context_length
        pool = self.scheduler.pool
        if pool is None:
            return model
        # the scheduler reserves ceil(min(n + MAX_WINDOW + 1, model) / block) + 1 blocks for n tokens
        held = (pool.num_blocks - 1) * pool.block_size
        return model if held >= model else held - MAX_WINDOW - 1

    @property
    def context_label(self) -> str:
        if self.context < self.target.max_context_length:
            return f"this server's KV cache (--kv-cache-mb {self.kv_cache_mb:g})"
        return "the model's context"

    def start(self) -> "ServeEngine":
        self.scheduler.start()
        return self

    def close(self) -> None:
        self.scheduler.close()
        if self.memory is not None:
            self.settle()
            self.memory.save()

    def settle(self, timeout: float = 60.0) -> bool:
        """Wait until every request that will be merged into a pool is merged (a request merges
        after its answer is sent); False on timeout."""
        with self._merged:
            return self._merged.wait_for(lambda: self._merges == 0, timeout)

    def memory_options(self, options: SpeculationOptions, key: str = "",
                       use: bool = True) -> tuple[SpeculationOptions, dict | None]:
        """A request's options with its key's pool wired in when it runs ``ngram-pool`` (and
        the dict its counts go to); unchanged when the memory is off or ``use`` is False."""
        if self.memory is None or not use or not options.enabled or POOL not in self.spec_names:
            return options, None
        if options.spec_type == "auto" and self.registry.resolve_name(self.target, "auto") in self.registry.weight_free():
            options = attrs.evolve(options, spec_type=POOL)
        if options.spec_type != POOL:
            return options, None
        report: dict = {"pool": key or "shared"}
        extra = {**options.extra, POOL: {"pool": self.memory.pool(key), "report": report}}
        return attrs.evolve(options, extra=extra), report

    def remember(self, key: str, tokens) -> None:
        """Merge a finished request's prompt and output into its key's pool."""
        if self.memory is not None:
            self.memory.pool(key).merge(tokens)

    def _merging(self, step: int) -> None:
        with self._merged:
            self._merges += step
            self._merged.notify_all()

    def prepare_kwargs(self) -> dict[str, Any]:
        return dict(tokenizer=self.tokenizer, context=self.context, model_ids=[self.model_id],
                    default=self.options, spec_names=self.spec_names, max_draft=self.max_draft,
                    context_label=self.context_label)

    async def run(self, prepared: Prepared) -> AsyncIterator[Piece | Done]:
        """Submit and yield the request's pieces, then one Done. Closing the iterator early
        cancels the sequence. ``prepared.key`` names the request's draft pool."""
        key = prepared.key
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        arrived = time.perf_counter()
        timing = {"first": None, "last": None}
        observe = self.metrics
        sink: list | None = [] if prepared.logprobs is not None else None
        sent = [0]  # logprob entries already handed out

        def on_token(token: int, text: str):  # the sequence's worker thread
            now = time.perf_counter()
            if timing["first"] is None:
                timing["first"] = now
                observe.ttft(now - arrived)
            else:
                observe.itl(now - timing["last"])
            timing["last"] = now
            entries = ()
            if sink is not None:
                entries, sent[0] = tuple(sink[sent[0]:]), len(sink)
            loop.call_soon_threadsafe(queue.put_nowait, Piece(token, text, entries))

        options, report = self.memory_options(prepared.options, key, prepared.memory)
        remember = self.memory is not None and prepared.memory

        def on_done(handle: SequenceHandle):  # the worker thread, whatever the outcome
            observe.finished(handle)
            loop.call_soon_threadsafe(queue.put_nowait, Done(handle, timing["first"], arrived, report))
            if remember:  # after the answer is on its way
                try:
                    if handle.result is not None:
                        self.remember(key, [*prepared.prompt_ids, *handle.result.tokens])
                finally:
                    self._merging(-1)

        request = SequenceRequest(
            prepared.prompt_ids, prepared.max_tokens, sampling=prepared.sampling, options=options,
            stop=prepared.stop, on_token=on_token, on_done=on_done, logprobs=prepared.logprobs, logprob_sink=sink,
        )
        if remember:
            self._merging(+1)
        try:
            handle = self.scheduler.submit_request(request)
        except BaseException:
            if remember:
                self._merging(-1)
            raise
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
