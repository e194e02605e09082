"""DraftEconomics: how many tokens a step should draft, from what this run has measured.

A step that drafts k tokens costs ``C(k)`` milliseconds (drafting, a verify of k + 1 rows and
the commit, as the loop timed it) and emits ``E(k) = 1 + a1 + a1*a2 + ... + a1*...*ak`` tokens
on average, where ``ai`` is the measured chance that draft position i lands given that the
ones before it did. The best length is the k with the most tokens per millisecond,
``E(k) / C(k)``. Both sides are measured while the sequence runs, never taken from a table:
a weak drafter whose second token rarely lands drafts one token, because the extra verify row
and draft step cost more than the rare landing gains; a strong one opens the window.

Evidence. A proposal may carry a small hashable ``evidence`` key saying what the drafter knew
when it proposed (ngram: how long the matched suffix is, whether its last draft landed in
full). Acceptance is then measured per key as well as pooled over all drafts, and
``best(window, evidence, decline=True)`` sizes that one proposal from its key's acceptance,
length 0 included: a proposal whose best tokens per millisecond is below a plain step's
(``E(0) / C(0)``, one token for a plain step's cost) is not worth verifying. A drafter that
alternates spans it copies right with guesses it gets wrong thus verifies the first and
declines the second, instead of one pooled estimate sizing both.

Estimates where the run has no evidence yet are optimistic on purpose, so that a length that
might pay gets tried (and measured) once:

* acceptance at a position never reached: the position before it (``a(i) = a(i-1)``); with
  few samples the estimate is shrunk toward that neighbour (``PRIOR_WEIGHT`` pseudo-samples);
  position 1 starts from ``FIRST_PRIOR`` (one pseudo-sample of 0.5 landed out of one);
* a key's acceptance at a position: shrunk toward the pooled estimate at that position with
  ``PRIOR_WEIGHT`` pseudo-samples, so a key seen twice is mostly the pooled figure and one
  seen twenty times is mostly its own;
* cost of a length never drafted: the straight line through the nearest measured lengths
  (a plain step is length 0); with a single measured point, that point's cost (flat).

Cost shape. When the target measured its forward's cost by rows on this machine
(``spec_verify_row_ms``, given as ``cost_shape``), every length is priced by that shape, a draft
of k tokens being a forward of k + 1 rows: ``C(k) = scale * shape(k + 1)``, with ``scale`` the
median of ``ms / shape(rows)`` over this run's recent steps of every length. A sequence then
knows from its first steps that, say, 9 rows cost 4x one row here and 3 rows 1.7x, and one slow
step (a shared machine) moves no length's price: the median of all steps absorbs it, where a
per-length mean of a few samples would decline or shorten drafts for a while.

Worked example: plain 10 ms, one-token steps measured at 12 ms, acceptance a1 = 0.4 after 20
steps and position 2 never reached. E(1) = 1.4, C(1) = 12 -> 0.117 tokens/ms; E(2) = 1 + 0.4 +
0.16 = 1.56, C(2) = 14 (the line through 10 and 12) -> 0.111: one token it is. At a1 = 0.8,
E(2) = 2.44 -> 0.174 beats E(1) = 1.8 -> 0.15: the next step drafts two and measures C(2).
A key whose a1 is 0.1: E(1) = 1.1 for 12 ms -> 0.092 < 1 / 10 = 0.1 for a plain step: declined.
"""

from __future__ import annotations

import collections
from typing import Deque, Hashable

from ..cost_shape import parse_cost_shape, rows_cost

FIRST_PRIOR = 0.5  # acceptance at position 1 before any evidence (one pseudo-sample)
PRIOR_WEIGHT = 2.0  # pseudo-samples pulling an estimate toward its prior (neighbour or pool)
COST_SAMPLES = 16  # rolling samples kept per draft length (context growth changes costs)
ACCEPT_SAMPLES = 64  # rolling speculative steps behind the acceptance estimates (pooled, per key)
MAX_KEYS = 64  # distinct evidence keys measured apart in one run; later new keys count pooled only
MIN_COST_MS = 1e-9  # the least a step's estimated cost can be (ratios divide by it)


class _Tally:
    """The last ``ACCEPT_SAMPLES`` (drafted, accepted) steps, with how often each position was
    reached and landed over them, kept up to date as steps come and go (O(drafted) a step)."""

    def __init__(self) -> None:
        self.steps: Deque[tuple[int, int]] = collections.deque()
        self.reached: list[int] = [0]  # [position]: verified with all before it landed
        self.landed: list[int] = [0]

    def add(self, drafted: int, accepted: int) -> None:
        if len(self.steps) == ACCEPT_SAMPLES:
            self._count(*self.steps.popleft(), -1)
        self.steps.append((drafted, accepted))
        self._count(drafted, accepted, 1)

    def _count(self, drafted: int, accepted: int, sign: int) -> None:
        # position i was verified with 1..i-1 landed when i <= drafted and i <= accepted + 1
        top = min(drafted, accepted + 1)
        while len(self.reached) <= top:
            self.reached.append(0)
            self.landed.append(0)
        for i in range(1, top + 1):
            self.reached[i] += sign
            self.landed[i] += sign * (i <= accepted)

    def clear(self) -> None:
        self.__init__()

    def rates(self, positions: int, priors: list[float] | None) -> list[float]:
        """Shrunk conditional acceptance at positions 1..``positions``: toward ``priors[i]``
        (the pooled rates) when given, else toward the previous position (``FIRST_PRIOR``
        for the first)."""
        reached, landed, top = self.reached, self.landed, len(self.reached) - 1
        rates: list[float] = []
        previous, weight = FIRST_PRIOR, 1.0 if priors is None else PRIOR_WEIGHT
        for i in range(1, positions + 1):
            prior = priors[i - 1] if priors is not None else previous
            n, k = (reached[i], landed[i]) if i <= top else (0, 0)
            rate = (k + weight * prior) / (n + weight)
            rates.append(rate)
            previous, weight = rate, PRIOR_WEIGHT
        return rates


class DraftEconomics:
    """Per-position acceptance (pooled and per evidence key) and per-length step cost of one
    run; ``best(window)``, ``best(window, evidence, decline=True)``."""

    def __init__(self, cost_shape=None) -> None:
        self._shape = parse_cost_shape(cost_shape)  # ((rows, ms), ..) or None
        self._costs: dict[int, Deque[float]] = {}
        self._sums: dict[int, float] = {}  # running sum of each length's cost samples
        self._scales: Deque[float] = collections.deque(maxlen=ACCEPT_SAMPLES)  # ms / shape(rows)
        self._median: float | None = None  # of _scales, until the next step changes them
        self._pooled = _Tally()
        self._keys: dict[Hashable, _Tally] = {}

    def set_cost_shape(self, cost_shape) -> None:
        """Price every length by this forward cost by rows (None: by each length's own mean)."""
        self._shape = parse_cost_shape(cost_shape)
        self._scales.clear()
        self._median = None
        if self._shape is not None:
            for length, samples in self._costs.items():
                for ms in samples:
                    self._scales.append(max(ms, MIN_COST_MS) / rows_cost(self._shape, length + 1))

    # -- evidence --------------------------------------------------------------------------
    def record_plain(self, ms: float) -> None:
        """A plain one-row step (length 0)."""
        self._add_cost(0, ms)

    def record_draft(self, drafted: int, accepted: int, ms: float, evidence: Hashable | None = None) -> None:
        """A speculative step that drafted ``drafted`` tokens, of which ``accepted`` landed;
        ``evidence``: the proposal's key (None: pooled only)."""
        if drafted < 1:
            return
        drafted, accepted = int(drafted), max(0, min(int(accepted), int(drafted)))
        self._add_cost(drafted, ms)
        self._pooled.add(drafted, accepted)
        tally = self._tally(evidence, create=True)
        if tally is not None:
            tally.add(drafted, accepted)

    def forget_acceptance(self) -> None:
        """A new sequence: acceptance is the prompt's (costs are the machine's and stay)."""
        self._pooled.clear()
        self._keys.clear()

    def _tally(self, evidence: Hashable | None, *, create: bool = False) -> _Tally | None:
        if evidence is None:
            return None
        tally = self._keys.get(evidence)
        if tally is None and create and len(self._keys) < MAX_KEYS:
            tally = self._keys[evidence] = _Tally()
        return tally

    def samples(self, evidence: Hashable | None = None) -> int:
        """Speculative steps behind the estimate of ``evidence`` (None: pooled)."""
        tally = self._pooled if evidence is None else self._tally(evidence)
        return 0 if tally is None else len(tally.steps)

    def _add_cost(self, length: int, ms: float) -> None:
        samples = self._costs.get(length)
        if samples is None:
            samples = self._costs[length] = collections.deque(maxlen=COST_SAMPLES)
            self._sums[length] = 0.0
        if len(samples) == COST_SAMPLES:
            self._sums[length] -= samples[0]
        samples.append(float(ms))
        self._sums[length] += float(ms)
        if self._shape is not None:
            self._scales.append(max(float(ms), MIN_COST_MS) / rows_cost(self._shape, length + 1))
            self._median = None

    # -- estimates -------------------------------------------------------------------------
    def acceptance(self, positions: int, evidence: Hashable | None = None) -> list[float]:
        """Estimated conditional acceptance at draft positions 1..``positions``: pooled, or for
        the key ``evidence`` (shrunk toward the pooled rates; a key never seen: the pooled)."""
        pooled = self._pooled.rates(positions, None)
        tally = self._tally(evidence)
        return pooled if tally is None else tally.rates(positions, pooled)

    def _means(self) -> dict[int, float]:
        """Mean measured ms per draft length."""
        # a step measured at 0 ms (a coarse or frozen clock) counts as a tiny cost: never a divisor of 0
        return {k: max(self._sums[k] / len(v), MIN_COST_MS) for k, v in self._costs.items() if v}

    def cost(self, length: int, means: dict[int, float] | None = None) -> float | None:
        """Estimated ms of a step drafting ``length`` tokens (None: nothing measured at all);
        ``means``: ``_means()`` when the caller already has it."""
        means = self._means() if means is None else means
        if not means:
            return None
        if self._scales:  # the target's shape, scaled by the median step of this run
            return max(self._scale() * rows_cost(self._shape, length + 1), MIN_COST_MS)
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

    def costs(self, longest: int) -> list[float] | None:
        """[cost(0) .. cost(``longest``)] in ms, or None when nothing is measured yet."""
        means = self._means()
        if not means:
            return None
        return [self.cost(k, means) for k in range(longest + 1)]

    def _scale(self) -> float:
        if self._median is None:
            ordered = sorted(self._scales)
            self._median = ordered[len(ordered) // 2]
        return self._median

    def expected_tokens(self, length: int, rates: list[float] | None = None) -> float:
        """E(length): tokens a step drafting ``length`` emits on average."""
        rates = rates if rates is not None else self.acceptance(length)
        total, chain = 1.0, 1.0
        for rate in rates[:length]:
            chain *= rate
            total += chain
        return total

    def best(self, window: int, evidence: Hashable | None = None, *, decline: bool = False) -> int:
        """The draft length in 1..``window`` (0..``window`` with ``decline``: 0 when a plain
        step is worth more) with the most tokens per ms under the acceptance of ``evidence``
        (pooled for None). ``window`` when no cost is measured yet (0 is never chosen without
        a measured cost); ties go to the shorter."""
        if window <= 1 and not decline:
            return max(0, window)
        if window <= 0:
            return 0
        rates, means = self.acceptance(window, evidence), self._means()
        if not means:
            return window
        best_k, best_rate = window, None
        for k in range(0 if decline else 1, window + 1):
            rate = self.expected_tokens(k, rates) / self.cost(k, means)
            if best_rate is None or rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        return best_k

    def gain(self, length: int, evidence: Hashable | None = None) -> float | None:
        """Estimated speed-up over plain of drafting ``length`` tokens (None: plain steps or
        every draft length are unmeasured)."""
        plain_samples, cost = self._costs.get(0), self.cost(length)
        if not plain_samples or cost is None or len(self._costs) < 2:
            return None
        rates = self.acceptance(length, evidence)
        return self.expected_tokens(length, rates) / cost * self.cost(0)
