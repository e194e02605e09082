"""The batched driver: many sequences of one paged target, stepped together in one forward.

Each sequence runs the ordinary loop in its own thread on a ``BatchedSpecTrunk``; the worker whose
forward completes the batch runs it as one ragged forward under ``max_batch_rows``. A verify's
extra rows are charged what they cost the rest of the batch. ``generate_batched``: no prefix cache."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Sequence

import attrs

from ..capabilities import paged_info, target_info, verify_cost_shape
from ..cost_shape import parse_cost_shape, rows_cost
from ..errors import GenerationError
from ..protocols import PagedRows
from .batched_trunk import BatchedSpecTrunk, Cancelled
from .options import MAX_DRAFT_WINDOW


def row_cost(shape, rows: int) -> float:
    """The relative cost of a forward of ``rows`` rows by a cost shape, or ``rows`` without one."""
    return float(rows) if shape is None else rows_cost(shape, rows)


@attrs.define(eq=False)
class _Work:
    trunk: BatchedSpecTrunk
    tokens: list[int]
    all_logits: bool
    want_hidden: bool
    order: int
    at: float
    result: Any = None
    error: BaseException | None = None
    finished: bool = False


class FreeBlocks:
    """The paged KV's blocks; a sequence's next block follows its last when free."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = set(range(num_blocks))

    def take(self, after: int | None = None) -> int:
        block = None if after is None else after + 1
        if block not in self._free:
            if not self._free:
                raise GenerationError("every KV block is in use")
            block = min(self._free)
        self._free.discard(block)
        return block

    def give(self, blocks: Sequence[int]) -> None:
        self._free.update(blocks)


class PlainTable:
    """One sequence's blocks without a prefix cache."""

    reused_tokens = 0

    def __init__(self, pool: FreeBlocks):
        self.pool, self.blocks, self.length = pool, [], 0

    def prepare_write(self, start: int, end: int) -> None:
        while len(self.blocks) * self.pool.block_size < end:
            self.blocks.append(self.pool.take(self.blocks[-1] if self.blocks else None))

    def commit(self, tokens: Sequence[int], start: int) -> None:
        self.length = start + len(tokens)

    def truncate(self, length: int) -> None:
        self.length = length

    def free(self) -> None:
        self.pool.give(self.blocks)
        self.blocks = []


class BatchDriver:
    """See the module docstring; sequences ``join`` before their first forward and ``leave`` after."""

    def __init__(self, target, kv, *, max_batch_rows: int | None = None, batch_wait_ms: float = 50.0):
        self.target, self.kv = target, kv
        rows_cap = kv.max_batch_rows if kv is not None else 64
        self.max_batch_rows = min(max_batch_rows or rows_cap, rows_cap)
        self.batch_wait_s = batch_wait_ms / 1000.0
        self._cond = threading.Condition()
        self._live: set[BatchedSpecTrunk] = set()
        self._pending: list[_Work] = []
        self._order = itertools.count()
        self._busy = False  # a batch's forward is running
        self.steps = 0
        self.batch_rows = 0

    def join(self, trunk: BatchedSpecTrunk) -> None:
        self._live.add(trunk)

    def leave(self, trunk: BatchedSpecTrunk) -> None:
        self._live.discard(trunk)
        self._cond.notify_all()

    def submit(self, trunk: BatchedSpecTrunk, tokens: list[int], *, all_logits: bool, want_hidden: bool):
        """Called by a sequence's trunk: wait for this forward to run in a batch."""
        with self._cond:
            if trunk.cancelled:
                raise Cancelled()
            work = _Work(trunk, tokens, all_logits, want_hidden, next(self._order), time.perf_counter())
            self._pending.append(work)
            self._cond.notify_all()  # once: a notify per wake-up would wake the waiters in a loop
            while not work.finished:
                if not self._busy and self._ready():
                    self._run_batch()  # this work completed the batch: run it here
                else:
                    self._cond.wait(self.batch_wait_s)
        if work.error is not None:
            raise work.error
        return work.result

    def _take_batch(self) -> list[_Work]:
        live = []
        for work in self._pending:
            if work.trunk.cancelled:
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
        if any(w.trunk.cancelled for w in self._pending):
            return True
        waiting_on = {w.trunk for w in self._pending}
        if all(t in waiting_on for t in self._live):
            return True
        return time.perf_counter() - min(w.at for w in self._pending) >= self.batch_wait_s

    def _run_batch(self) -> None:
        """Run this step's batch as one forward (the lock is released during it; ``_busy`` holds)."""
        batch = self._take_batch()
        rows: list[PagedRows] = []
        runnable: list[_Work] = []
        for work in batch:
            if work.finished:
                continue
            trunk = work.trunk
            try:
                trunk.table.prepare_write(trunk.cache_seq_len, trunk.cache_seq_len + len(work.tokens))
            except Exception as exc:
                work.error, work.finished = exc, True
                continue
            rows.append(PagedRows(list(trunk.table.blocks), trunk.cache_seq_len, work.tokens, work.all_logits,
                                  work.want_hidden, seq=trunk.seq_id))
            runnable.append(work)
        if not runnable:
            self._cond.notify_all()  # cancelled or failed work wakes its worker
            return
        self._busy = True
        self._cond.release()
        began = time.perf_counter()
        try:
            outputs, error = self.kv.forward(rows), None
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
            work.error, work.result = (error, None) if error is not None else (None, outputs[i])
            work.finished = True
        self._cond.notify_all()

    def _charge(self, batch: list[_Work], total_rows: int, ms: float) -> None:
        """Give each verify the time its extra rows cost the other sequences of the batch."""
        others = len(batch) - 1
        profile = parse_cost_shape(verify_cost_shape(self.target))
        full = row_cost(profile, total_rows)
        for work in batch:
            extra = 0.0
            if work.all_logits and others and full > 0:
                without = row_cost(profile, total_rows - len(work.tokens) + 1)
                extra = ms * max(0.0, full - without) / full * others
            work.trunk.extra_cost_ms = extra


def generate_batched(target, prompts: Sequence[Sequence[int]], options=None, *, max_tokens: int,
                     sampling=None, registry=None, kv_cache_mb: float = 256.0, block_size: int = 16,
                     chunk_rows: int = 32, batch_wait_ms: float = 50.0) -> list:
    """Run ``prompts`` together on ``target``'s paged KV, one thread each; their Generations in order
    (each equals the prompt decoded alone). ``sampling``: one, or one per prompt."""
    from .generation import generate

    if not target_info(target).batched:
        raise GenerationError(f"{type(target).__name__} has no batched paged path")
    per_block = target.spec_kv_bytes_per_block(block_size)
    kv = target.spec_open_paged(max(2, int(kv_cache_mb * (1 << 20) // per_block)), block_size)
    pool = FreeBlocks(kv.num_blocks, block_size)
    need = sum(-(-min(len(p) + max_tokens + MAX_DRAFT_WINDOW + 1, target.max_context_length) // block_size) for p in prompts)
    if need > pool.num_blocks:
        raise GenerationError(f"{len(prompts)} sequences need up to {need} KV blocks, the cache holds {pool.num_blocks}")
    samplings = sampling if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
    driver = BatchDriver(target, kv, batch_wait_ms=batch_wait_ms)
    trunks = [BatchedSpecTrunk(driver, PlainTable(pool), max_context_length=target.max_context_length,
                               chunk_rows=chunk_rows, seq_id=i + 1) for i in range(len(prompts))]
    results: list[Any] = [None] * len(prompts)
    release = paged_info(kv).release

    def run(i: int) -> None:
        try:
            results[i] = generate(target, list(prompts[i]), options, max_tokens=max_tokens, sampling=samplings[i],
                                  registry=registry, trunk=trunks[i])
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            results[i] = exc
        finally:
            with driver._cond:
                trunks[i].table.free()
                if release is not None:
                    release(trunks[i].seq_id)
                driver.leave(trunks[i])

    with driver._cond:
        for trunk in trunks:
            driver.join(trunk)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
