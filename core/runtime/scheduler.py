"""The scheduler: many sequences on one batched paged target (continuous batching).

Each admitted sequence runs the ordinary generation engine (``generate``: its own speculator,
sampler, cost governor and stats) in its own worker thread, on a ``BatchedSpecTrunk``. Every
forward the loop asks for becomes a request here; the engine thread waits until every running
sequence has one (or ``batch_wait_ms`` passed), takes a batch under the row budget and runs it as
ONE ragged forward of the paged KV, then hands each sequence its rows.

* Admit: a queued request is admitted when a sequence slot is free and the pool can reserve
  the blocks it may need; its prompt first adopts the cached full blocks that start it (the
  prefix cache), so only the rest is prefilled.
* Step: one-row requests (plain steps) go first, then multi-row ones (verifies, prefill chunks)
  while the batch stays under ``max_batch_rows``; what does not fit waits one step. Verifies
  therefore never starve plain steps, and a batch never leaves the batch-invariant kernels.
* Finish / cancel: a finished, failed or cancelled sequence frees its blocks and reservation at
  once. ``cancel()`` takes effect at the sequence's next forward (at most one step later).
* Cost: a sequence's governor times its steps as they run here, i.e. the whole batch's forward
  (every row the batch adds). A verify's k extra rows also slow every other sequence of the
  batch, so the trunk adds that share to the verify's cost (``extra_cost_ms``): the batch's
  time times the fraction those rows add by the target's cost-by-rows profile
  (``spec_verify_row_ms``; rows counted linearly without one), times the other sequences.
  Speculation then has to win for the batch, not only for its own sequence.

A target without a paged path (no ``spec_open_paged``, or one that declines this load) is still
served: one sequence at a time on its own cache, without batching or the prefix cache
(``serial`` holds the reason; it is logged once).

Every bookkeeping call (pool, tables, queues) runs under one lock; the forward runs outside it,
one at a time. The worker whose request completes a batch runs it in its own thread; the engine
thread runs batches that are due by ``batch_wait_ms`` and admits requests.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import attrs

from ..errors import GenerationError
from ..protocols import PagedRows
from ..capabilities import paged_info, target_info, verify_cost_shape
from .batched_trunk import BatchedSpecTrunk, Cancelled
from .options import SpeculationOptions
from .prefix_cache import BlockPool, BlockTable
from .sampling import SamplingParams
from .stats import SpecStats

log = logging.getLogger("tsspec.scheduler")

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


@attrs.define(eq=False)
class _Work:
    handle: SequenceHandle
    tokens: list[int]
    all_logits: bool
    want_hidden: bool
    order: int
    at: float
    result: Any = None
    error: BaseException | None = None
    finished: bool = False


def row_cost(profile, rows: int) -> float:
    """The relative cost of a forward of ``rows`` rows: linear interpolation in a measured
    ((rows, ms), ...) profile (extrapolated from its last two points), or ``rows`` without one."""
    if not profile:
        return float(rows)
    points = sorted((int(r), float(ms)) for r, ms in profile)
    if rows <= points[0][0]:
        return points[0][1] * rows / points[0][0]
    for (r0, m0), (r1, m1) in zip(points, points[1:]):
        if rows <= r1:
            return m0 + (m1 - m0) * (rows - r0) / (r1 - r0)
    (r0, m0), (r1, m1) = points[-2], points[-1]
    return m1 + (m1 - m0) * (rows - r1) / (r1 - r0)


class Scheduler:
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
        self.target = target
        self.kv = None
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
                self.kv = target.spec_open_paged(num_blocks, block_size)
            except ValueError as exc:
                self.serial = str(exc)
        if self.serial is not None:
            log.warning("serving one sequence at a time: %s", self.serial)
            max_seqs = 1
        else:
            identity = identity if identity is not None else str(getattr(target, "path", "") or id(target))
            self.pool = BlockPool(self.kv.num_blocks, block_size, identity=identity)
        self.block_size = block_size
        self.max_seqs = max_seqs
        rows_cap = self.kv.max_batch_rows if self.kv is not None else 64
        self.max_batch_rows = min(max_batch_rows or rows_cap, rows_cap)
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
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.registry = registry
        self._cond = threading.Condition()
        self._waiting: collections.deque[SequenceHandle] = collections.deque()
        self._running: set[SequenceHandle] = set()
        self._pending: list[_Work] = []
        self._ids = itertools.count(1)
        self._order = itertools.count()
        self._closed = False
        self._engine: threading.Thread | None = None
        self._busy = False  # a batch's forward is running (in the engine thread or a worker)
        # counters (read by metrics)
        self.finished = {FINISHED: 0, CANCELLED: 0, FAILED: 0}
        self.totals = SpecStats()
        self.steps = 0
        self.batch_rows = 0
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
                handle.cancelled = True
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
            handle.cancelled = True
            self._cond.notify_all()

    # -- the worker side -------------------------------------------------------------------
    def submit(self, trunk: BatchedSpecTrunk, tokens: list[int], *, all_logits: bool, want_hidden: bool):
        """Called by a sequence's trunk: wait for this forward to run in a batch."""
        handle = trunk.handle
        with self._cond:
            if handle.cancelled:
                raise Cancelled()
            work = _Work(handle, tokens, all_logits, want_hidden, next(self._order), time.perf_counter())
            self._pending.append(work)
            while not work.finished:
                if not self._busy and self._ready():
                    self._run_batch()  # this request completed the batch: run it here
                else:
                    self._cond.notify_all()  # the engine thread runs it (or a timed-out batch)
                    self._cond.wait()
        if work.error is not None:
            raise work.error
        return work.result

    def _run_sequence(self, handle: SequenceHandle) -> None:
        from .generation import generate  # generation imports the loop; keep this module light

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
            handle.state = state
            self.finished[state] += 1
            if handle.result is not None:
                stats = handle.result.stats
                self.totals = self.totals.merge(stats)
                if stats.prefix_reused:
                    self.arming["armed" if stats.armed_after_reuse else "refused"] += 1
            self._cond.notify_all()
        handle.done.set()
        if request.on_done is not None:
            try:
                request.on_done(handle)
            except Exception as exc:  # a submitter's callback must not kill the worker
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
                if handle.request.on_done is not None:
                    handle.request.on_done(handle)
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
            )
            handle.trunk.handle = handle
            handle.reused_tokens = table.reused_tokens
            self._start(handle)

    def _start(self, handle: SequenceHandle) -> None:
        handle.state = RUNNING
        self._running.add(handle)
        threading.Thread(
            target=self._run_sequence, args=(handle,), name=f"tsspec-seq-{handle.id}", daemon=True
        ).start()

    def _take_batch(self) -> list[_Work]:
        """The batch of this step: one-row requests first, then the rest, under the budget."""
        live = []
        for work in self._pending:
            if work.handle.cancelled:
                work.error, work.finished = Cancelled(), True
            else:
                live.append(work)
        live.sort(key=lambda w: (len(w.tokens) > 1, w.order))
        batch, rows = [], 0
        for work in live:
            if rows + len(work.tokens) <= self.max_batch_rows or not batch:
                batch.append(work)
                rows += len(work.tokens)
        taken = set(map(id, batch))
        self._pending = [w for w in live if id(w) not in taken]
        return batch

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if any(w.handle.cancelled for w in self._pending):
            return True
        waiting_on = {w.handle for w in self._pending}
        if all(h in waiting_on for h in self._running):
            return True
        return time.perf_counter() - min(w.at for w in self._pending) >= self.batch_wait_s

    def _loop(self) -> None:
        with self._cond:
            while True:
                self._admit()
                if self._closed and not self._running and not self._pending:
                    for handle in list(self._waiting):  # closed before admission
                        handle.state = CANCELLED
                        handle.done.set()
                    self._waiting.clear()
                    return
                if self._busy or not self._ready():
                    self._cond.wait(self.batch_wait_s if self._pending else 0.5)
                    continue
                self._run_batch()

    def _run_batch(self) -> None:
        """Take this step's batch and run it as one forward. Called with the lock held, by the
        engine thread or by the worker whose request completed the batch (then a lone
        sequence's step costs no hand-off to another thread and back); the lock is released
        during the forward, and ``_busy`` keeps a second batch from starting meanwhile."""
        batch = self._take_batch()
        rows: list[PagedRows] = []
        runnable: list[_Work] = []
        for work in batch:
            if work.finished:
                continue
            trunk = work.handle.trunk
            try:
                trunk.table.prepare_write(trunk.cache_seq_len, trunk.cache_seq_len + len(work.tokens))
            except Exception as exc:
                work.error, work.finished = exc, True
                continue
            rows.append(PagedRows(
                list(trunk.table.blocks), trunk.cache_seq_len, work.tokens, work.all_logits, work.want_hidden,
                seq=work.handle.id,
            ))
            runnable.append(work)
        if not runnable:
            self._cond.notify_all()  # cancelled or failed work wakes its worker
            return
        self._busy = True
        self._cond.release()
        began = time.perf_counter()
        try:
            outputs = self.kv.forward(rows)
            error = None
        except Exception as exc:  # noqa: BLE001 - every sequence of the batch gets it
            outputs, error = None, exc
        finally:
            elapsed = (time.perf_counter() - began) * 1000.0
            self._cond.acquire()
            self._busy = False
        self.steps += 1
        total = sum(len(r.tokens) for r in rows)
        self.batch_rows += total
        self._charge(runnable, total, elapsed)
        for i, work in enumerate(runnable):
            if error is not None:
                work.error = error
            else:
                work.result = outputs[i]
            work.finished = True
        self._cond.notify_all()

    def _charge(self, batch: list[_Work], total_rows: int, ms: float) -> None:
        """Give each verify of the batch the time its extra rows cost the other sequences."""
        others = len(batch) - 1
        profile = verify_cost_shape(self.target)
        full = row_cost(profile, total_rows)
        for work in batch:
            extra = 0.0
            if work.all_logits and others and full > 0:
                without = row_cost(profile, total_rows - len(work.tokens) + 1)
                extra = ms * max(0.0, full - without) / full * others
            work.handle.trunk.extra_cost_ms = extra

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
