"""The server's scheduler: requests, admission, streaming, cancellation and the prefix cache,
on top of the core's batched driver (``tsspec.runtime.batching``: many sequences, one forward).

Each admitted request runs the ordinary generation engine (``generate``: its own speculator,
sampler, cost governor and stats) in its own worker thread, on a ``BatchedSpecTrunk``; the
driver batches their forwards (one-row steps first, verifies and prefill chunks under the row
budget) and charges a verify what its rows cost the others.

* Admit: a queued request is admitted when a sequence slot is free and the pool can reserve
  the blocks it may need; its prompt first adopts the cached full blocks that start it (the
  prefix cache, ``prefix_cache.py``), so only the rest is prefilled.
* Finish / cancel: a finished, failed or cancelled sequence frees its blocks and reservation at
  once. ``cancel()`` takes effect at the sequence's next forward or token (at most one step).

A target without a paged path (no ``spec_open_paged``, or one that declines this load) is still
served: one sequence at a time on its own cache, without batching or the prefix cache
(``serial`` holds the reason; it is logged once).

Every bookkeeping call (pool, tables, queues) runs under the driver's lock; the forward runs
outside it, one at a time. The engine thread admits requests and runs batches that are due by
``batch_wait_ms``; otherwise the worker whose work completes a batch runs it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import attrs

from tsspec import SamplingParams, SpeculationOptions
from tsspec.capabilities import paged_info, target_info, verify_cost_shape
from tsspec.errors import GenerationError
from tsspec.runtime.batched_trunk import BatchedSpecTrunk, Cancelled
from tsspec.runtime.batching import BatchDriver
from tsspec.runtime.stats import SpecStats

from .batch_pricing import BatchCosts, BatchGovernor
from .prefix_cache import BlockPool, BlockTable

log = logging.getLogger("tsspec.serve.scheduler")

WAITING, RUNNING, FINISHED, CANCELLED, FAILED = "waiting", "running", "finished", "cancelled", "failed"
MAX_WINDOW = 16  # the most draft tokens a served request may ask for (reservations cover it)


@attrs.define(eq=False)
class SequenceRequest:
    """One generation request as the scheduler takes it (ids already encoded)."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    options: SpeculationOptions = attrs.field(factory=lambda: SpeculationOptions(enabled=False))
    stop: Sequence[str] = ()
    # on_token(token_id, text_piece) -> True to stop; runs in the sequence's worker thread
    on_token: Callable[[int, str], Any] | None = None
    on_done: Callable[["SequenceHandle"], None] | None = None  # runs in the worker thread too
    arm_after_reuse: bool | None = None  # None: the speculator decides; False: refuse-all rule
    logprobs: int | None = None  # keep each token's TokenLogprob with this many alternatives
    logprob_sink: list | None = None  # ... appended here as tokens are emitted (before on_token)


@attrs.define(eq=False)
class SequenceHandle:
    """A request's state, for its submitter: wait for it, cancel it, read its result."""

    id: int
    request: SequenceRequest
    state: str = WAITING
    result: Any = None  # a Generation when finished
    error: BaseException | None = None
    trunk: BatchedSpecTrunk | None = None
    reused_tokens: int = 0
    submitted_at: float = attrs.field(factory=time.perf_counter)
    cancelled: bool = False
    done: threading.Event = attrs.field(factory=threading.Event)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class Scheduler(BatchDriver):
    """See the module docstring. ``start()`` it, ``submit_request`` requests, ``close()`` it."""

    def __init__(
        self,
        target,
        *,
        kv_cache_mb: float = 256.0,
        block_size: int = 16,
        max_seqs: int = 8,
        max_batch_rows: int | None = None,
        chunk_rows: int = 32,
        batch_wait_ms: float = 50.0,
        registry=None,
        identity: str | None = None,
    ):
        if max_seqs < 1:
            raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
        kv = None
        self.pool: BlockPool | None = None
        # without a paged path the scheduler still serves, one sequence at a time on the
        # target's own cache (no batching, no prefix cache): ``serial`` says why
        self.serial: str | None = None
        if not target_info(target).batched:
            self.serial = f"{type(target).__name__} has no batched paged path"
        else:
            per_block = target.spec_kv_bytes_per_block(block_size)
            num_blocks = int(kv_cache_mb * (1 << 20) // per_block)
            if num_blocks < 2:
                raise GenerationError(
                    f"--kv-cache-mb {kv_cache_mb} holds {num_blocks} blocks of {block_size} tokens "
                    f"({per_block / (1 << 20):.2f} MiB each): give it more"
                )
            try:
                kv = target.spec_open_paged(num_blocks, block_size)
            except ValueError as exc:
                self.serial = str(exc)
        BatchDriver.__init__(self, target, kv, max_batch_rows=max_batch_rows, batch_wait_ms=batch_wait_ms)
        if self.serial is not None:
            log.warning("serving one sequence at a time: %s", self.serial)
            max_seqs = 1
        else:
            identity = identity if identity is not None else str(getattr(target, "path", "") or id(target))
            self.pool = BlockPool(self.kv.num_blocks, block_size, identity=identity)
        self.block_size = block_size
        self.max_seqs = max_seqs
        if self.max_batch_rows < MAX_WINDOW + 1:
            raise ValueError(f"max_batch_rows must be >= {MAX_WINDOW + 1} (a full verify), got {self.max_batch_rows}")
        self.chunk_rows = max(1, min(chunk_rows, self.max_batch_rows))
        # a paged KV that is not row-invariant (a hybrid running each sequence's own trunk
        # call) prefills a prompt in one piece, as the sequence's solo run does
        paged = paged_info(self.kv) if self.kv is not None else None
        if paged is not None and not paged.row_invariant:
            self.chunk_rows = self.target.max_context_length
        # a paged KV whose state cannot resume at a cached prefix refuses prefix reuse
        self.prefix_refusal: str | None = None
        if paged is not None and not paged.resumes_prefix:
            self.prefix_refusal = paged.prefix_refusal
            log.info("prefix reuse refused: %s", self.prefix_refusal)
        self.registry = registry
        # forward ms by rows of this scheduler's batches: what a weight-free sequence's drafts
        # are priced by while it shares a batch (``batch_pricing``)
        self.batch_costs = BatchCosts(target)
        self._waiting: collections.deque[SequenceHandle] = collections.deque()
        self._running: set[SequenceHandle] = set()
        self._ids = itertools.count(1)
        self._closed = False
        self._engine: threading.Thread | None = None
        # counters (read by metrics)
        self.finished = {FINISHED: 0, CANCELLED: 0, FAILED: 0}
        self.totals = SpecStats()
        self.arming = {"armed": 0, "refused": 0}  # decisions after prefix reuse

    # -- sizes -----------------------------------------------------------------------------
    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        positions = min(prompt_len + max_tokens + MAX_WINDOW + 1, self.target.max_context_length)
        return -(-positions // self.block_size) + 1  # +1: a copy-on-write block

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- life ------------------------------------------------------------------------------
    def start(self) -> "Scheduler":
        if self._engine is None:
            self._engine = threading.Thread(target=self._loop, name="tsspec-scheduler", daemon=True)
            self._engine.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Cancel everything and stop the engine thread."""
        with self._cond:
            self._closed = True
            handles = list(self._waiting) + list(self._running)
            for handle in handles:
                self._mark_cancelled(handle)
            self._cond.notify_all()
        for handle in handles:
            handle.wait(timeout)
        if self._engine is not None:
            self._engine.join(timeout)
            self._engine = None

    def __enter__(self) -> "Scheduler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------
    def submit_request(self, request: SequenceRequest) -> SequenceHandle:
        """Queue a request; GenerationError when it could never run here."""
        if not request.prompt:
            raise GenerationError("the prompt is empty")
        ctx = self.target.max_context_length
        if len(request.prompt) >= ctx:
            raise GenerationError(f"the prompt has {len(request.prompt)} tokens and the context holds {ctx}")
        need = self.blocks_needed(len(request.prompt), request.max_tokens)
        if self.pool is not None and need > self.pool.num_blocks:
            raise GenerationError(
                f"the request needs {need} KV blocks and the cache holds {self.pool.num_blocks}: "
                "raise --kv-cache-mb or lower max_tokens"
            )
        handle = SequenceHandle(next(self._ids), request)
        with self._cond:
            if self._closed:
                raise GenerationError("the scheduler is closed")
            self._waiting.append(handle)
            self._cond.notify_all()
        return handle

    def cancel(self, handle: SequenceHandle) -> None:
        """Stop a sequence at its next step (or drop it from the queue); frees everything."""
        with self._cond:
            self._mark_cancelled(handle)
            self._cond.notify_all()

    @staticmethod
    def _mark_cancelled(handle: SequenceHandle) -> None:
        handle.cancelled = True
        if handle.trunk is not None:
            handle.trunk.cancelled = True

    # -- the worker side -------------------------------------------------------------------
    def _run_sequence(self, handle: SequenceHandle) -> None:
        from tsspec import generate

        request = handle.request
        user_on_token = request.on_token

        def on_token(token: int, piece: str):  # a cancel takes effect at the next token too
            if handle.cancelled:
                raise Cancelled()
            return user_on_token(token, piece) if user_on_token is not None else None

        try:
            result = generate(
                self.target,
                request.prompt,
                request.options,
                max_tokens=request.max_tokens,
                sampling=request.sampling,
                registry=self.registry,
                on_token=on_token,
                stop=request.stop,
                trunk=handle.trunk,
                arm_after_reuse=request.arm_after_reuse,
                logprobs=request.logprobs,
                logprob_sink=request.logprob_sink,
                governor=self._governor(request.options),
            )
            handle.result = result
            state = FINISHED
        except Cancelled:
            state = CANCELLED
        except BaseException as exc:  # noqa: BLE001 - a request's failure is reported, never raised here
            handle.error = exc
            state = CANCELLED if handle.cancelled else FAILED
            if state == FAILED:
                log.warning("sequence %d failed: %r", handle.id, exc)
        with self._cond:
            if handle.trunk is not None:
                handle.trunk.table.free()
                release = paged_info(self.kv).release if self.kv is not None else None
                if release is not None:
                    release(handle.id)
            self._running.discard(handle)
            if handle.trunk is not None:
                self.leave(handle.trunk)
            handle.state = state
            self.finished[state] += 1
            if handle.result is not None:
                stats = handle.result.stats
                self.totals = self.totals.merge(stats)
                if stats.prefix_reused:
                    self.arming["armed" if stats.armed_after_reuse else "refused"] += 1
            self._cond.notify_all()
        handle.done.set()
        self._notify_done(handle)

    def _governor(self, options: SpeculationOptions) -> BatchGovernor | None:
        """A batch-priced governor for a weight-free algorithm under the governor (None: the
        loop makes its own; an algorithm with drafter weights keeps the park memory its own
        governor carries across sequences)."""
        if self.serial is not None or not options.enabled or not options.adaptive:
            return None
        registry = self.registry
        if registry is None:
            from tsspec.runtime.defaults import default_catalog

            registry = default_catalog().speculators
        name = registry.resolve_name(self.target, options.spec_type)
        if not isinstance(name, str) or name not in registry.weight_free():
            return None
        return BatchGovernor(self.batch_costs, lambda: len(self._live), enabled=True,
                             cost_shape=lambda: verify_cost_shape(self.target))

    def _charge(self, batch, total_rows: int, ms: float) -> None:
        """The driver's charge of a verify's extra rows to its batch where there is one to pay
        (a verify beside another sequence: a lone stream never reads the target's cost by rows,
        which a target may measure on first read), and the batch's cost by rows recorded."""
        if len(batch) > 1 and any(work.all_logits for work in batch):
            super()._charge(batch, total_rows, ms)
        else:
            for work in batch:
                work.trunk.extra_cost_ms = 0.0
        self.batch_costs.record(total_rows, ms)

    @staticmethod
    def _notify_done(handle: SequenceHandle) -> None:
        """The submitter's ``on_done``, whatever the outcome (a raising one is logged)."""
        if handle.request.on_done is not None:
            try:
                handle.request.on_done(handle)
            except Exception as exc:  # a submitter's callback must not kill the scheduler
                log.warning("on_done of sequence %d raised %r", handle.id, exc)

    # -- the engine ------------------------------------------------------------------------
    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_seqs:
            handle = self._waiting[0]
            if handle.cancelled:
                self._waiting.popleft()
                handle.state = CANCELLED
                self.finished[CANCELLED] += 1
                handle.done.set()
                self._notify_done(handle)
                continue
            request = handle.request
            if self.serial is not None:  # the target's own cache: nothing to reserve
                self._waiting.popleft()
                self._start(handle)
                continue
            table = BlockTable(self.pool, self.kv.copy_block)
            counters = (self.pool.queried_tokens, self.pool.hit_tokens)
            if self.prefix_refusal is None:
                table.adopt(request.prompt)
            need = max(0, self.blocks_needed(len(request.prompt), request.max_tokens) - len(table.blocks))
            if not self.pool.reserve(need):
                table.free()
                self.pool.queried_tokens, self.pool.hit_tokens = counters
                break  # first come, first served: wait until blocks come back
            table.reserved = need
            if not self._running:  # alone: consecutive blocks let its steps take one native call
                table.relocate(self.blocks_needed(len(request.prompt), request.max_tokens))
            self._waiting.popleft()
            handle.trunk = BatchedSpecTrunk(
                self,
                table,
                max_context_length=self.target.max_context_length,
                chunk_rows=self.chunk_rows,
                seq_id=handle.id,
            )
            self.join(handle.trunk)
            handle.reused_tokens = table.reused_tokens
            self._start(handle)

    def _start(self, handle: SequenceHandle) -> None:
        handle.state = RUNNING
        self._running.add(handle)
        threading.Thread(
            target=self._run_sequence, args=(handle,), name=f"tsspec-seq-{handle.id}", daemon=True
        ).start()

    def _loop(self) -> None:
        with self._cond:
            while True:
                self._admit()
                if self._closed and not self._running and not self._pending:
                    for handle in list(self._waiting):  # closed before admission
                        handle.state = CANCELLED
                        handle.done.set()
                        self._notify_done(handle)
                    self._waiting.clear()
                    return
                if self._busy or not self._ready():
                    self._cond.wait(self.batch_wait_s if self._pending else 0.5)
                    continue
                self._run_batch()

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counters and gauges for metrics (a consistent copy)."""
        with self._cond:
            pool = self.pool
            return {
                "running": len(self._running),
                "waiting": len(self._waiting),
                "finished": dict(self.finished),
                "serial": self.serial,
                "kv_blocks_total": pool.num_blocks if pool else 0,
                "kv_blocks_in_use": pool.in_use if pool else 0,
                "kv_blocks_cached": pool.cached if pool else 0,
                "kv_blocks_reserved": pool.reserved if pool else 0,
                "prefix_queried_tokens": pool.queried_tokens if pool else 0,
                "prefix_hit_tokens": pool.hit_tokens if pool else 0,
                "prefix_hit_rate": pool.hit_rate if pool else 0.0,
                "prefix_refusal": self.prefix_refusal,
                "steps": self.steps,
                "batch_rows": self.batch_rows,
                "arming": dict(self.arming),
                "totals": self.totals,
            }
