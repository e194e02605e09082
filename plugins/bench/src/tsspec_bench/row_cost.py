"""The target's verify cost by rows, measured again inside the bench run.

What a drafter needs turns on what a verify of k + 1 rows costs next to a one-row step, here and
now. The target's own profile (``spec_verify_row_ms``) is measured once, at its own context, and
cached per file and machine, so the machine's state at that moment stays in it; the loop's steps
pair runs that happen seconds apart. So the bench measures the shape once more, in this run, at
this run's context: after ``context`` tokens of the run's own prompts, forwards of 1, 2, ... rows (every
row's logits, as a verify) timed by the toolkit's ``tsspec_gguf.row_timing`` (the same
measurer as the llama target's profile: each width over the 1-row forward of the same round,
order alternating, the median over rounds, monotone), the cache rewound after each. A second or
so of forwards; targets whose state is not all in the KV cache (recurrent layers cannot be
rewound to a length) are not measured.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from tsspec_gguf.row_timing import ROUNDS, RowTiming, time_rows


def bench_context(cases) -> int:
    """The context the widths are timed at: the middle of a typical generation of this run (the
    median over its prompts of prompt tokens + half the token budget).

    >>> class C:
    ...     def __init__(self, n, m): self.prompt_ids, self.max_tokens = (0,) * n, m
    >>> bench_context([C(100, 64), C(300, 128), C(80, 32)])
    132
    """
    values = sorted(len(c.prompt_ids) + c.max_tokens // 2 for c in cases)
    return int(statistics.median(values)) if values else 0


def measure_row_costs(target, stream: Sequence[int], widths: Sequence[int], *, context: int,
                      rounds: int = ROUNDS) -> dict | None:
    """{"context", "rounds", "one_row_ms", "cost": {rows: time over one row}} for each width in
    ``widths`` (> 1), timed after ``context`` tokens of ``stream``; None for a target whose
    cache cannot be rewound to a length, or without room or tokens for the widths."""
    from tsspec.capabilities import target_info

    if not target_info(target).verify_persists_accepted_kv:
        return None
    widest = max([1, *widths])
    context = min(int(context), int(target.max_context_length) - widest)
    if context < 1 or len(stream) < context + widest:
        return None
    timing = time_after_context(target, stream, sorted({1, *(int(w) for w in widths)}), context=context,
                                rounds=rounds)
    return {"context": context, "rounds": rounds, "one_row_ms": timing.one_row_ms,
            "cost": {w: c for w, c in timing.ratios if w > 1}}


def time_after_context(target, stream: Sequence[int], widths: Sequence[int], *, context: int,
                       rounds: int = ROUNDS) -> RowTiming:
    """``time_rows`` over ``widths`` forwards (every row's logits, as a verify) of the tokens of
    ``stream`` after its first ``context``, which are forwarded first into an emptied cache;
    each round rewinds to ``context``, and the cache is emptied again after."""
    widest = max(widths)
    new = [int(t) for t in stream[context:context + widest]]
    target.spec_rewind_cache(0)
    ensure = getattr(target, "spec_ensure_capacity", None)
    if ensure is not None:
        ensure(context + widest)
    target.spec_forward([int(t) for t in stream[:context]], all_logits_rows=False, want_hidden=False)
    try:
        return time_rows(lambda w: target.spec_forward(new[:w], all_logits_rows=True, want_hidden=False),
                         widths, rounds=rounds, reset=lambda: target.spec_rewind_cache(context))
    finally:
        target.spec_rewind_cache(0)
