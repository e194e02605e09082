"""The forward's cost by rows, measured by the target itself on the machine it runs on.

Drafters that size drafts against cost (the ngram plugin's ``value`` policy) read a target's
optional ``spec_verify_row_ms``: ``((rows, ms), ...)`` from 1 row up, of which only the shape
matters. A profile measured on one machine must not decide behaviour on another, so the target
measures its own on first use: a warm-up pass, then ``REPS`` passes over ``ROWS`` (the order
reversed on every other pass, so drift does not favour any row count), the median per row count.
The result is cached on disk per file and machine (the weight cache's directory; off when that
cache is off), so a second process on the same machine pays nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from tsspec.modeling.cache import cache_dir

log = logging.getLogger("tsspec.llama")

ROWS = (1, 2, 3, 4, 5, 8, 9, 12, 16)  # verify widths drafters choose between (1 = a plain step)
REPS = 3
FORMAT = 1

RowCost = tuple[tuple[int, float], ...]


def measure(forward: Callable[[int], None], rows: Sequence[int] = ROWS, reps: int = REPS,
            clock: Callable[[], float] = time.perf_counter) -> RowCost:
    """Median milliseconds of ``forward(n)`` for each n in ``rows``."""
    samples: dict[int, list[float]] = {n: [] for n in rows}
    for n in rows:  # warm-up: first calls pay for allocation and page faults
        forward(n)
    for rep in range(reps):
        for n in (rows if rep % 2 == 0 else tuple(reversed(rows))):
            t0 = clock()
            forward(n)
            samples[n].append((clock() - t0) * 1000.0)
    return tuple((n, round(statistics.median(samples[n]), 3)) for n in rows)


def machine_key() -> str:
    """What makes a measurement valid elsewhere: the CPU, its count and torch's thread count."""
    import torch

    return "|".join([platform.machine(), platform.processor(), str(os.cpu_count()),
                     str(torch.get_num_threads()), platform.node()])


def kernel_build() -> str:
    """Which build of the compiled kernels measured (a rebuilt kernel costs differently)."""
    from tsspec.modeling import native

    module = native.kernels()
    where = getattr(module, "__file__", None) if module is not None else None
    if where is None:
        return "no-kernels"
    try:
        st = os.stat(where)
    except OSError:
        return "unknown-kernels"
    return f"{os.path.realpath(where)}|{st.st_size}|{st.st_mtime_ns}"


def _entry(path: str, tag: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = f"{FORMAT}|{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{tag}|{machine_key()}|{kernel_build()}"
    return root / "row-cost" / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


def cached(path: str | None, tag: str, forward: Callable[[int], None]) -> RowCost:
    """The profile for this file and machine: read from the cache, else measured and stored."""
    entry = _entry(path, tag) if path else None
    if entry is not None and entry.is_file():
        try:
            pairs = tuple((int(r), float(ms)) for r, ms in json.loads(entry.read_text()))
            if pairs and pairs[0][0] == 1:
                return pairs
        except (OSError, ValueError, TypeError):
            pass  # unreadable: measure again
    profile = measure(forward)
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(profile))
            tmp.replace(entry)
        except OSError as exc:
            log.debug("row-cost cache not written: %s", exc)
    return profile
