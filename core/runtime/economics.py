"""DraftEconomics: how many tokens a step should draft, from what this run has measured.

A step that drafts k tokens costs ``C(k)`` milliseconds (drafting, a verify of k + 1 rows and
the commit, as the loop timed it) and emits ``E(k) = 1 + a1 + a1*a2 + ... + a1*...*ak`` tokens
on average, where ``ai`` is the measured chance that draft position i lands given that the
ones before it did. The best length is the k with the most tokens per millisecond,
``E(k) / C(k)``. Both sides are measured while the sequence runs, never taken from a table:
a weak drafter whose second token rarely lands drafts one token, because the extra verify row
and draft step cost more than the rare landing gains; a strong one opens the window.

Estimates where the run has no evidence yet are optimistic on purpose, so that a length that
might pay gets tried (and measured) once:

* acceptance at a position never reached: the position before it (``a(i) = a(i-1)``); with
  few samples the estimate is shrunk toward that neighbour (``PRIOR_WEIGHT`` pseudo-samples);
  position 1 starts from ``FIRST_PRIOR`` (one pseudo-sample of 0.5 landed out of one);
* cost of a length never drafted: the straight line through the nearest measured lengths
  (a plain step is length 0); with a single measured point, that point's cost (flat).

Worked example: plain 10 ms, one-token steps measured at 12 ms, acceptance a1 = 0.4 after 20
steps and position 2 never reached. E(1) = 1.4, C(1) = 12 -> 0.117 tokens/ms; E(2) = 1 + 0.4 +
0.16 = 1.56, C(2) = 14 (the line through 10 and 12) -> 0.111: one token it is. At a1 = 0.8,
E(2) = 2.44 -> 0.174 beats E(1) = 1.8 -> 0.15: the next step drafts two and measures C(2).
"""

from __future__ import annotations

import collections
from typing import Deque

FIRST_PRIOR = 0.5  # acceptance at position 1 before any evidence (one pseudo-sample)
PRIOR_WEIGHT = 2.0  # pseudo-samples pulling a position's estimate toward its predecessor's
COST_SAMPLES = 16  # rolling samples kept per draft length (context growth changes costs)
ACCEPT_SAMPLES = 64  # rolling speculative steps behind the acceptance estimates
MIN_COST_MS = 1e-9  # the least a step's estimated cost can be (ratios divide by it)


class DraftEconomics:
    """Per-position acceptance and per-length step cost of one run; ``best(window)``."""

    def __init__(self) -> None:
        self._costs: dict[int, Deque[float]] = {}
        self._steps: Deque[tuple[int, int]] = collections.deque(maxlen=ACCEPT_SAMPLES)

    # -- evidence --------------------------------------------------------------------------
    def record_plain(self, ms: float) -> None:
        """A plain one-row step (length 0)."""
        self._cost_samples(0).append(float(ms))

    def record_draft(self, drafted: int, accepted: int, ms: float) -> None:
        """A speculative step that drafted ``drafted`` tokens, of which ``accepted`` landed."""
        if drafted < 1:
            return
        self._cost_samples(drafted).append(float(ms))
        self._steps.append((int(drafted), max(0, min(int(accepted), int(drafted)))))

    def forget_acceptance(self) -> None:
        """A new sequence: acceptance is the prompt's (costs are the machine's and stay)."""
        self._steps.clear()

    def _cost_samples(self, length: int) -> Deque[float]:
        samples = self._costs.get(length)
        if samples is None:
            samples = self._costs[length] = collections.deque(maxlen=COST_SAMPLES)
        return samples

    # -- estimates -------------------------------------------------------------------------
    def acceptance(self, positions: int) -> list[float]:
        """Estimated conditional acceptance at draft positions 1..``positions``."""
        reached = [0] * (positions + 1)
        landed = [0] * (positions + 1)
        for drafted, accepted in self._steps:
            # position i was verified with 1..i-1 landed when i <= drafted and i <= accepted + 1
            for i in range(1, min(drafted, accepted + 1, positions) + 1):
                reached[i] += 1
                landed[i] += i <= accepted
        rates: list[float] = []
        previous, weight = FIRST_PRIOR, 1.0
        for i in range(1, positions + 1):
            rate = (landed[i] + weight * previous) / (reached[i] + weight)
            rates.append(rate)
            previous, weight = rate, PRIOR_WEIGHT
        return rates

    def _means(self) -> dict[int, float]:
        """Mean measured ms per draft length."""
        # a step measured at 0 ms (a coarse or frozen clock) counts as a tiny cost: never a divisor of 0
        return {k: max(sum(v) / len(v), MIN_COST_MS) for k, v in self._costs.items() if v}

    def cost(self, length: int, means: dict[int, float] | None = None) -> float | None:
        """Estimated ms of a step drafting ``length`` tokens (None: nothing measured at all);
        ``means``: ``_means()`` when the caller already has it."""
        means = self._means() if means is None else means
        if not means:
            return None
        if length in means:
            return means[length]
        below = [k for k in means if k < length]
        above = [k for k in means if k > length]
        if below and above:
            lo, hi = max(below), min(above)
        elif len(below) >= 2:
            lo, hi = sorted(below)[-2:]
        elif len(above) >= 2:
            lo, hi = sorted(above)[:2]
        else:  # one measured length: flat (optimistic, so the length gets tried)
            return means[(below or above)[0]]
        slope = (means[hi] - means[lo]) / (hi - lo)
        return max(means[lo] + slope * (length - lo), MIN_COST_MS)

    def expected_tokens(self, length: int, rates: list[float] | None = None) -> float:
        """E(length): tokens a step drafting ``length`` emits on average."""
        rates = rates if rates is not None else self.acceptance(length)
        total, chain = 1.0, 1.0
        for rate in rates[:length]:
            chain *= rate
            total += chain
        return total

    def best(self, window: int) -> int:
        """The draft length in 1..``window`` with the most tokens per ms (``window`` when no
        cost is measured yet; ties go to the shorter)."""
        if window <= 1:
            return max(0, window)
        rates, means = self.acceptance(window), self._means()
        best_k, best_rate = window, None
        for k in range(1, window + 1):
            cost = self.cost(k, means)
            if cost is None:
                return window
            rate = self.expected_tokens(k, rates) / cost
            if best_rate is None or rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        return best_k

    def gain(self, length: int) -> float | None:
        """Estimated speed-up over plain of drafting ``length`` tokens (None: plain steps or
        every draft length are unmeasured)."""
        plain_samples, cost = self._costs.get(0), self.cost(length)
        if not plain_samples or cost is None or len(self._costs) < 2:
            return None
        return self.expected_tokens(length) / cost * (sum(plain_samples) / len(plain_samples))
