"""A forward's cost by rows, timed as ratios to the one-row forward of the same round.

What a verify of ``k`` rows costs next to a one-row step decides which drafts pay, and on a
shared machine one busy second can double a single timing. So every width is timed in rounds:
each round runs the one-row forward and every other width once (the order reversed on every
other round, so drift favours no width), each width's time is divided by the one-row time of
its own round, and the ratio's median over the rounds is kept, as is the one-row time's median.
One untimed round first pays for allocation and page faults. The cost of ``w`` rows is then
``median one-row ms x median ratio``, made monotone (a running maximum over the widths, at
least the one-row cost: a forward of more rows never costs less, whatever the noise said).

Used by the llama target's own profile (``spec_verify_row_ms``) and by ``tsspec bench``'s
verify cost by rows, so both measure the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable, Sequence

import attrs

__all__ = ["ROUNDS", "RowTiming", "monotone", "time_rows"]

ROUNDS = 9  # timed rounds after one untimed warm-up round


@attrs.frozen
class RowTiming:
    """A forward's measured cost by rows."""

    one_row_ms: float  # median over the rounds of the one-row forward's milliseconds
    ratios: tuple[tuple[int, float], ...]  # (rows, cost over one row) from 1 row up, monotone
    rounds: int  # timed rounds the medians are over
    samples: tuple[tuple[int, tuple[float, ...]], ...] = ()  # (rows, each round's cost over one row)

    def profile(self, digits: int = 3) -> tuple[tuple[int, float], ...]:
        """``((rows, ms), ..)`` from 1 row up: the one-row median times each width's ratio."""
        return tuple((r, round(self.one_row_ms * c, digits)) for r, c in self.ratios)


def monotone(pairs: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """``(rows, cost)`` pairs sorted by rows with each cost raised to the largest before it.

    >>> monotone([(3, 1.2), (1, 1.0), (2, 1.3), (4, 1.5)])
    ((1, 1.0), (2, 1.3), (3, 1.3), (4, 1.5))
    """
    out, high = [], float("-inf")
    for rows, cost in sorted(pairs):
        high = max(high, cost)
        out.append((rows, high))
    return tuple(out)


def time_rows(forward: Callable[[int], object], widths: Sequence[int], *, rounds: int = ROUNDS,
              reset: Callable[[], object] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> RowTiming:
    """Time ``forward(n)`` (one forward of ``n`` rows) for 1 row and each of ``widths``, paired
    per round; ``reset()``, untimed, runs after every forward (drop the rows again)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    ordered = sorted({1, *(int(w) for w in widths)})
    if ordered[0] < 1:
        raise ValueError(f"widths must be at least 1 row, not {ordered[0]}")
    times: dict[int, list[float]] = {w: [] for w in ordered}
    for round_ in range(-1, rounds):  # round -1: the warm-up, not kept
        for w in (ordered if round_ % 2 == 0 else reversed(ordered)):
            start = clock()
            forward(w)
            elapsed = (clock() - start) * 1e3
            if reset is not None:
                reset()
            if round_ >= 0:
                times[w].append(elapsed)
    one = times[1]
    ratios = [(1, 1.0)] + [(w, statistics.median(t / max(o, 1e-9) for o, t in zip(one, times[w])))
                           for w in ordered if w > 1]
    samples = tuple((w, tuple(t / max(o, 1e-9) for o, t in zip(one, times[w]))) for w in ordered if w > 1)
    return RowTiming(one_row_ms=statistics.median(one), ratios=monotone(ratios), rounds=rounds, samples=samples)
