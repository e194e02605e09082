"""Cross-request draft memory: n-gram pools over earlier requests' prompts and outputs.

A ``DraftPool`` maps a context (the last ``n`` tokens, ``n`` in ``ORDERS``) to the token that
most often followed it in the requests merged so far: one majority-vote counter per context
(``[token, votes, seen, tick]``; a different follower takes a vote, at zero it replaces the
token), so an entry is a few integers whatever the text. ``follower`` reads the longest context
that has a confident entry. Like llama.cpp's n-gram cache (its dynamic, cross-request part) and
SuffixDecoding's global tree, it spans requests; unlike them it is bounded and persisted.

* Bounded: past ``max_entries`` the pool drops a quarter of its entries, those with the lowest
  ``tick + FREQUENCY_TICKS * log2(seen)``: old entries go first, frequent ones last longer.
* One pool per API key (``PoolStore``; a key's id is a hash of the key, never the key), one
  pool when no key is set. Requests only read a pool; the server merges a finished request.
* Persisted: ``PoolStore.save`` writes every pool to one file (atomically); ``load`` reads it
  back. A file that cannot be read, or was written for another model or Python build, is
  ignored with a one-line warning and the server starts with empty pools.

Context keys are Python's ``hash`` of the token tuple (ints and tuples of ints hash the same on
every run of one build, which the file records). A collision can only cost a rejected draft.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import threading
from array import array
from pathlib import Path
from typing import Sequence

log = logging.getLogger("tsspec.serve.memory")

ORDERS = (8, 6, 5, 4, 3)  # context lengths, longest first
SURE_ORDER = 5  # a context this long may draft after one occurrence; shorter ones need two votes
DEFAULT_MAX_ENTRIES = 200_000  # per pool; an entry is a few hundred bytes of Python objects
FREQUENCY_TICKS = 4.0  # eviction: each doubling of an entry's count is worth this many requests of age
MAGIC = b"TSSPEC-DRAFT-POOL\n"
FORMAT = 1


def key_id(api_key: str | None) -> str:
    """The pool name of an API key: a hash, so the key itself is never stored ('' without one)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""


def _build() -> str:
    return f"python{sys.version_info[0]}.{sys.version_info[1]}/hash{sys.hash_info.width}/{sys.hash_info.algorithm}"


class DraftPool:
    """See the module docstring. ``merge`` is serialised by a lock; reads take none (an entry
    read while another thread merges is at worst stale: it can only cost a draft)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES):
        if max_entries < 16:
            raise ValueError(f"a draft pool needs room for at least 16 entries, got {max_entries}")
        self.max_entries = max_entries
        self.entries: dict[int, list[int]] = {}  # context key -> [token, votes, seen, tick]
        self.tick = 0  # requests merged
        self.evicted = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def merge(self, tokens: Sequence[int]) -> None:
        """Count every (context, follower) pair of ``tokens``."""
        tokens = [int(t) for t in tokens]
        with self._lock:
            self.tick += 1
            tick, entries = self.tick, self.entries
            for i in range(ORDERS[-1], len(tokens)):
                nxt = tokens[i]
                for n in ORDERS:
                    if n > i:
                        continue
                    key = hash(tuple(tokens[i - n:i]))
                    entry = entries.get(key)
                    if entry is None:
                        entries[key] = [nxt, 1, 1, tick]
                        continue
                    if entry[0] == nxt:
                        entry[1] += 1
                    elif entry[1] > 1:
                        entry[1] -= 1
                    else:
                        entry[0] = nxt
                    entry[2] += 1
                    entry[3] = tick
            if len(entries) > self.max_entries:
                self._evict()

    def _evict(self) -> None:
        keep = self.max_entries * 3 // 4
        ranked = sorted(self.entries.items(), key=lambda kv: kv[1][3] + FREQUENCY_TICKS * math.log2(kv[1][2]))
        for key, _ in ranked[: len(ranked) - keep]:
            del self.entries[key]
        self.evicted += len(ranked) - keep

    def follower(self, context: Sequence[int], min_share: float) -> tuple[int, int, float] | None:
        """(token, order, confidence) for the longest context ending ``context`` whose entry's
        votes are at least ``min_share`` of its count, and at least 2 votes below ``SURE_ORDER``
        tokens of context (a short context seen once is common text more often than a repeat),
        or None. ``confidence``: votes over count plus one (a context seen once claims 0.5)."""
        entries = self.entries
        size = len(context)
        for n in ORDERS:
            if n > size:
                continue
            entry = entries.get(hash(tuple(context[size - n:])))
            if entry is None:
                continue
            token, votes, seen = entry[0], entry[1], entry[2]
            if votes >= min_share * seen and (n >= SURE_ORDER or votes >= 2):
                return token, n, votes / (seen + 1)
        return None

    # -- persistence -----------------------------------------------------------------------
    def to_array(self) -> array:
        flat = array("q")
        with self._lock:  # not while a merge changes the entries
            for key, (token, votes, seen, tick) in self.entries.items():
                flat.extend((key, token, votes, seen, tick))
        return flat

    def fill(self, flat: array, tick: int) -> None:
        self.tick = tick
        for i in range(0, len(flat), 5):
            self.entries[flat[i]] = [flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4]]
        if len(self.entries) > self.max_entries:
            self._evict()


class PoolStore:
    """The server's pools, by key id (see ``key_id``), with the file they persist to."""

    def __init__(self, identity: str, path: str | os.PathLike | None = None, *,
                 max_entries: int = DEFAULT_MAX_ENTRIES):
        self.identity = identity
        self.path = Path(path) if path else None
        self.max_entries = max_entries
        self.pools: dict[str, DraftPool] = {}
        self.warning: str | None = None  # why a pool file was ignored
        self._lock = threading.Lock()

    def pool(self, key: str) -> DraftPool:
        with self._lock:
            found = self.pools.get(key)
            if found is None:
                found = self.pools[key] = DraftPool(self.max_entries)
            return found

    def peek(self, key: str) -> DraftPool | None:
        return self.pools.get(key)

    def save(self) -> None:
        """Write every pool to ``path`` (a temporary file, then renamed over it)."""
        if self.path is None:
            return
        pools = {k: p for k, p in self.pools.items() if len(p)}
        arrays = {k: p.to_array() for k, p in pools.items()}
        header = {"format": FORMAT, "identity": self.identity, "build": _build(), "orders": list(ORDERS),
                  "pools": [{"id": k, "tick": pools[k].tick, "ints": len(arrays[k])} for k in pools]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(MAGIC)
            out.write(json.dumps(header).encode() + b"\n")
            for k in pools:
                arrays[k].tofile(out)
        os.replace(tmp, self.path)

    def load(self) -> int:
        """Read ``path`` when it exists: the entries loaded. A file that is not a pool of this
        model and build is ignored (``warning`` says why, logged once)."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            pools = self._read()
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            self.warning = f"draft memory {self.path} ignored: {exc}"
            log.warning(self.warning)
            return 0
        self.pools.update(pools)
        return sum(len(p) for p in pools.values())

    def _read(self) -> dict[str, DraftPool]:
        with open(self.path, "rb") as src:
            if src.read(len(MAGIC)) != MAGIC:
                raise ValueError("not a tsspec draft-pool file")
            try:
                header = json.loads(src.readline())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"its header is unreadable ({exc.__class__.__name__})") from None
            if header.get("format") != FORMAT or header.get("orders") != list(ORDERS):
                raise ValueError(f"format {header.get('format')} with orders {header.get('orders')} is not this version's")
            if header.get("identity") != self.identity:
                raise ValueError(f"it was written for model {header.get('identity')!r}, this server runs {self.identity!r}")
            if header.get("build") != _build():
                raise ValueError(f"it was written by {header.get('build')}, this is {_build()}")
            pools = {}
            for entry in header["pools"]:
                ints = int(entry["ints"])
                if ints < 0 or ints % 5:
                    raise ValueError(f"pool {entry['id']!r} has {ints} integers, not whole entries")
                flat = array("q")
                flat.fromfile(src, ints)  # EOFError when the file is cut short
                pool = DraftPool(self.max_entries)
                pool.fill(flat, int(entry["tick"]))
                pools[str(entry["id"])] = pool
            if src.read(1):
                raise ValueError("it has bytes after its last pool")
        return pools
