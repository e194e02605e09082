"""The block-hash prefix cache: who owns which fixed-size KV block, and which blocks hold what.

A batched target keeps its KV in ``num_blocks`` blocks of ``block_size`` token positions; this
module does the bookkeeping and never touches a tensor (the model plugin owns the storage).

* A sequence holds a ``BlockTable``: the blocks of its positions, in order.
* A block is FULL when every one of its positions holds a kept token. A full block is keyed by a
  hash chain: ``key_i = blake2b(key_{i-1} | identity | tokens of block i)``, so a key names the
  whole prefix up to the block's end (and the model file, through ``identity``).
* Blocks carry reference counts. A sequence whose prompt starts with cached full blocks takes
  them (``match``) instead of computing them: its KV starts with a prefix it never processed.
* A full block no sequence holds stays cached in LRU order; allocation takes a never-used block
  first, then evicts the least recently released cached one. The pool is sized once from the
  memory budget (``--kv-cache-mb``), so eviction is what keeps memory flat.
* Admission reserves the blocks a request may need (prompt, budget and a verify's rows), so a
  running sequence never waits for a block.
* A write into a block that is shared or cached (a rewind below a full block) first copies it
  to a private block (copy-on-write); the copy is the model's ``copy_block``.

Not thread-safe by itself: the scheduler (``scheduler.py``) serialises every call.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from typing import Callable, Sequence

ROOT = b"tsspec-prefix-v1"


def chain_key(parent: bytes, identity: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block whose tokens are ``tokens`` after the prefix keyed ``parent``."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(identity)
    digest.update(array("q", (int(t) for t in tokens)).tobytes())
    return digest.digest()


class OutOfBlocks(RuntimeError):
    """The pool cannot hand out a block (the scheduler's reservations should prevent this)."""


class BlockPool:
    """Reference-counted KV blocks with a hash index of full blocks and LRU eviction."""

    def __init__(self, num_blocks: int, block_size: int, *, identity: str = ""):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a block pool needs >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.identity = identity.encode()
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never used or unhashed
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}  # full block -> its chain key
        self._by_key: dict[bytes, int] = {}
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, ref 0
        self.reserved = 0
        # counters for metrics
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    # -- sizes -----------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks that could be handed out now and are not promised to anyone."""
        return len(self._free) + len(self._lru) - self.reserved

    @property
    def in_use(self) -> int:
        return sum(1 for r in self._refs if r > 0)

    @property
    def cached(self) -> int:
        return len(self._lru)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def refs(self, block: int) -> int:
        return self._refs[block]

    def is_cached_or_shared(self, block: int) -> bool:
        return self._refs[block] > 1 or block in self._key_of

    # -- keys --------------------------------------------------------------------------------
    def keys(self, tokens: Sequence[int], parent: bytes = ROOT, start_block: int = 0) -> list[bytes]:
        """Chain keys of the full blocks of ``tokens`` from block ``start_block`` on (``parent``:
        the key of the block before it)."""
        out: list[bytes] = []
        b = self.block_size
        for i in range(start_block, len(tokens) // b):
            parent = chain_key(parent, self.identity, tokens[i * b : (i + 1) * b])
            out.append(parent)
        return out

    # -- reservations --------------------------------------------------------------------------
    def reserve(self, n: int) -> bool:
        if n > self.available:
            return False
        self.reserved += n
        return True

    def unreserve(self, n: int) -> None:
        if not 0 <= n <= self.reserved:
            raise ValueError(f"cannot unreserve {n} of {self.reserved} blocks")
        self.reserved -= n

    # -- blocks ----------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], limit: int) -> tuple[list[int], list[bytes]]:
        """Take the longest run of cached full blocks that starts ``tokens`` and covers at most
        ``limit`` tokens: (blocks, their keys), each block's reference taken."""
        keys = self.keys(tokens[: max(0, limit)])
        blocks: list[int] = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            self._take(block)
            blocks.append(block)
        self.queried_tokens += len(tokens)
        self.hit_tokens += len(blocks) * self.block_size
        return blocks, keys[: len(blocks)]

    def _take(self, block: int) -> None:
        if self._refs[block] == 0:
            self._lru.pop(block, None)
        self._refs[block] += 1

    def free_run(self, length: int) -> int | None:
        """The first block of ``length`` consecutive free (unreferenced, unkeyed) blocks, or None."""
        run_start, run = None, 0
        for block in sorted(self._free):
            if run and block == run_start + run:
                run += 1
            else:
                run_start, run = block, 1
            if run >= length:
                return run_start
        return None

    def allocate(self, *, reserved: bool = True, after: int | None = None) -> int:
        """A private block (reference 1). ``reserved``: it comes out of the caller's reservation.
        ``after``: the caller's previous block; the one after it is taken when it is free (never
        a cached one), so a sequence's blocks tend to be consecutive and a paged forward can
        read its keys in place."""
        follower = None if after is None else after + 1
        if follower is not None and follower < self.num_blocks and self._refs[follower] == 0 \
                and follower not in self._key_of:
            self._free.remove(follower)  # unreferenced and unkeyed: on the free list
            block = follower
        elif self._free:
            block = self._free.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._by_key[self._key_of.pop(block)]
            self.evictions += 1
        else:
            raise OutOfBlocks("every KV block is in use")
        if reserved:
            self.reserved = max(0, self.reserved - 1)
        self._refs[block] = 1
        return block

    def release(self, block: int) -> None:
        refs = self._refs[block] - 1
        if refs < 0:
            raise ValueError(f"block {block} released more often than taken")
        self._refs[block] = refs
        if refs == 0:
            if block in self._key_of:
                self._lru[block] = None  # cached: most recently released last
            else:
                self._free.append(block)

    def register(self, block: int, key: bytes) -> None:
        """Record that ``block`` is full and keyed ``key`` (a block already holding that prefix
        keeps the key; this one then stays private)."""
        if block in self._key_of or key in self._by_key:
            return
        self._key_of[block] = key
        self._by_key[key] = block

    def unregister(self, block: int) -> None:
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._by_key[key]


class BlockTable:
    """One sequence's blocks, its kept tokens and the keys of its full blocks."""

    def __init__(self, pool: BlockPool, copy_block: Callable[[int, int], None]):
        self.pool = pool
        self.copy_block = copy_block
        self.blocks: list[int] = []
        self.tokens: list[int] = []  # the tokens whose KV is kept, in order
        self.keys: list[bytes] = []  # keys of blocks[0 .. len(keys)-1] (all full)
        self.reserved = 0  # blocks still promised to this sequence
        self.reused_tokens = 0  # positions adopted from the cache at admission

    @property
    def length(self) -> int:
        return len(self.tokens)

    def adopt(self, prompt: Sequence[int]) -> int:
        """Take the cached full blocks that start ``prompt`` (at least its last token is left to
        compute: its logits are needed). Returns the positions adopted."""
        blocks, keys = self.pool.match(prompt, len(prompt) - 1)
        self.blocks.extend(blocks)
        self.keys.extend(keys)
        self.tokens.extend(int(t) for t in prompt[: len(blocks) * self.pool.block_size])
        self.reused_tokens = len(self.tokens)
        return self.reused_tokens

    def relocate(self, total: int) -> bool:
        """Copy the adopted blocks to the start of a run of ``total`` free blocks when they could
        not otherwise be followed by consecutive ones (the block after them is cached or held),
        so that a paged forward can read the sequence's keys in place; the originals stay
        cached. Needs a reservation of as many blocks as it copies; False when nothing moved."""
        blocks, pool = self.blocks, self.pool
        if not blocks or len(blocks) >= total:
            return False
        consecutive = all(b == blocks[0] + i for i, b in enumerate(blocks))
        follower = blocks[-1] + 1
        if consecutive and follower < pool.num_blocks and pool.refs(follower) == 0 and follower not in pool._key_of:
            return False  # the block after them is free: later blocks follow on their own
        start = pool.free_run(total)
        if start is None or not pool.reserve(len(blocks)):
            return False
        fresh = []
        for i, old in enumerate(blocks):
            new = pool.allocate(after=start + i - 1)  # the run's next block (free: it is taken)
            self.copy_block(old, new)
            pool.release(old)
            fresh.append(new)
        self.blocks = fresh  # private copies: the keys stay with the cached originals
        return True

    def prepare_write(self, start: int, end: int) -> None:
        """Make positions ``start .. end-1`` writable: allocate blocks up to ``end`` and copy any
        shared or cached block the write lands in."""
        b = self.pool.block_size
        if start < end:
            for index in range(start // b, min(len(self.blocks), -(-end // b))):
                block = self.blocks[index]
                if self.pool.is_cached_or_shared(block):
                    fresh = self._allocate(self.blocks[index - 1] if index else None)
                    self.copy_block(block, fresh)
                    self.pool.release(block)
                    self.blocks[index] = fresh
                    del self.keys[index:]
        while len(self.blocks) * b < end:
            self.blocks.append(self._allocate(self.blocks[-1] if self.blocks else None))

    def _allocate(self, after: int | None = None) -> int:
        use_reserved = self.reserved > 0
        block = self.pool.allocate(reserved=use_reserved, after=after)
        if use_reserved:
            self.reserved -= 1
        return block

    def commit(self, tokens: Sequence[int], start: int) -> None:
        """Positions ``start ..`` now hold ``tokens`` for good (forwarded and kept); blocks that
        became full are keyed so other sequences can adopt them."""
        if start > len(self.tokens):
            raise ValueError(f"commit at {start} leaves a gap after {len(self.tokens)} tokens")
        del self.tokens[start:]
        self.tokens.extend(int(t) for t in tokens)
        b = self.pool.block_size
        full = len(self.tokens) // b
        if len(self.keys) > full:
            del self.keys[full:]
        if full > len(self.keys):
            parent = self.keys[-1] if self.keys else ROOT
            new = self.pool.keys(self.tokens[: full * b], parent, len(self.keys))
            for index, key in enumerate(new, start=len(self.keys)):
                self.pool.register(self.blocks[index], key)
            self.keys.extend(new)

    def truncate(self, length: int) -> None:
        """Forget positions from ``length`` on (their blocks stay held until ``free``)."""
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot rewind {len(self.tokens)} kept tokens to {length}")
        del self.tokens[length:]
        del self.keys[length // self.pool.block_size :]

    def free(self) -> None:
        """Give every block and the unused reservation back (idempotent)."""
        for block in self.blocks:
            self.pool.release(block)
        self.blocks.clear()
        self.keys.clear()
        self.tokens.clear()
        if self.reserved:
            self.pool.unreserve(self.reserved)
            self.reserved = 0
