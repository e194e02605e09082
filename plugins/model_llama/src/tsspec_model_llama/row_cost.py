"""The forward's cost by rows, measured by the target itself on the machine it runs on.

Drafters and the cost governor read a target's optional ``spec_verify_row_ms``: ``((rows, ms),
...)`` from 1 row up, of which only the shape matters. A profile measured on one machine must not
decide behaviour on another, so the target measures its own on first use, with the toolkit's
``tsspec_gguf.row_timing`` (each width over the one-row forward of its own round, order
alternating, a warm-up round, medians over its ``ROUNDS`` rounds; monotone by construction), at
``CONTEXT`` cached tokens (more when the cache already holds more): a verify's rows attend to
every cached token, so the cost by rows moves with the context, and a few hundred tokens is where
a typical request's verifies run (a prompt and part of its answer).
The result is cached on disk per file and machine (the weight cache's directory; off when that
cache is off). A cached profile is only a candidate: measured under another load it can be far
off (on one shared machine, five cached profiles had a 1-row cost of 11.6-22.0 ms and a 9-row
cost of 33.9-72.3 ms), and its shape then prices every draft wrong for as long as the process
runs. So each process re-measures the widest width's ratio to one row in a few quick paired
rounds (``check``) and keeps the cached profile only when its ratio lies within the spread of
those rounds (widened by ``AGREE``); otherwise it measures in full and replaces the entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Callable, Sequence

from tsspec.cost_shape import parse_cost_shape
from tsspec_gguf.cache import cache_dir

log = logging.getLogger("tsspec.llama")

ROWS = (1, 2, 3, 4, 5, 8, 9, 16)  # verify widths drafters choose between (1 = a plain step; 12 is interpolated)
CONTEXT = 256  # cached tokens the widths are timed after (see the module docstring)
# 2: paired rounds at CONTEXT tokens, monotone (1: three unpaired passes at whatever was cached)
FORMAT = 2

CHECK_ROUNDS = 3  # quick paired rounds that validate a cached profile at load
AGREE = 0.10  # slack around the quick rounds' min-max ratio within which a cached ratio agrees

RowCost = tuple[tuple[int, float], ...]


def machine_key() -> str:
    """What makes a measurement valid elsewhere: the CPU, its count and torch's thread count."""
    import torch

    return "|".join([platform.machine(), platform.processor(), str(os.cpu_count()),
                     str(torch.get_num_threads()), platform.node()])


def kernel_build() -> str:
    """Which build of the compiled kernels measured (a rebuilt kernel costs differently)."""
    from tsspec_gguf import native

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


def agrees(profile: RowCost, width: int, ratios: Sequence[float]) -> bool:
    """Whether ``profile``'s cost of ``width`` rows over one row lies within the spread of the
    quick rounds' ``ratios`` (widened by AGREE on each side).

    >>> agrees(((1, 10.0), (9, 38.0)), 9, [3.6, 3.9, 4.1])
    True
    >>> agrees(((1, 12.0), (9, 72.3)), 9, [3.6, 3.9, 4.1])
    False
    """
    costs = dict(profile)
    if width not in costs or not ratios or costs.get(1, 0) <= 0:
        return False
    ratio = costs[width] / costs[1]
    return min(ratios) * (1 - AGREE) <= ratio <= max(ratios) * (1 + AGREE)


def cached(path: str | None, tag: str, measure: Callable[[], RowCost],
           check: Callable[[], tuple[int, Sequence[float]]] | None = None) -> RowCost:
    """The profile for this file and machine: read from the cache when ``check()`` (a quick
    re-measure: the widest width and its per-round ratios to one row) agrees with it, else
    ``measure()`` and stored."""
    entry = _entry(path, tag) if path else None
    if entry is not None and entry.is_file():
        try:
            pairs = tuple((int(r), float(ms)) for r, ms in json.loads(entry.read_text()))
            if parse_cost_shape(pairs) == pairs:  # a profile the runtime would use, as written
                if check is None:
                    return pairs
                width, ratios = check()
                if agrees(pairs, width, ratios):
                    return pairs
                log.info("cached row-cost profile disagrees with this load (%s rows: cached %.2fx, now %s): "
                         "measured again", width, dict(pairs).get(width, 0) / dict(pairs)[1],
                         ", ".join(f"{r:.2f}x" for r in ratios))
        except (OSError, ValueError, TypeError):
            pass  # unreadable: measure again
    profile = measure()
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(profile))
            tmp.replace(entry)
        except OSError as exc:
            log.debug("row-cost cache not written: %s", exc)
    return profile
