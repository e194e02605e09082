"""ConfidenceCalibration and ChainWorth: what a drafter's confidence is worth in THIS run.

A learned drafter knows how sure it is of each token it drafts (its top-1 probability, say),
but that figure was learned elsewhere: whether a token of confidence 0.6 lands 60% of the time
on this prompt, with this sampler, is something only this run can say. ``ConfidenceCalibration``
measures it. Confidence in [0, 1] falls into one of ``BUCKETS`` equal-width buckets; each bucket
counts the draft tokens that were verified with every token before them landed (reached) and
those that landed. A bucket's landing chance is its count shrunk toward its own middle
confidence (the drafter's claim, ``PRIOR_WEIGHT`` pseudo-samples: the run's evidence replaces
it within a few verifies), then made non-decreasing across buckets by pooling adjacent
violators (isotonic regression): landing rises with confidence, so a bucket that measures
below a less confident one is pooled with it. Shrinking toward a POOLED figure instead (as
``DraftEconomics`` does for evidence keys) would let the many low-confidence drafts drag the
estimate of the few sure ones down; here a bucket leans only on its own claim and its
neighbours' order.

Worked example: bucket 0.8-0.9 (prior 0.85) saw 10 reached, 6 landed: (6 + 2 * 0.85) / 12 =
0.64; bucket 0.7-0.8 (prior 0.75) saw 4 reached, 4 landed: (4 + 1.5) / 6 = 0.92. They violate
the order, so both become the pooled (6 + 1.7 + 4 + 1.5) / (12 + 6) = 0.73.

``ChainWorth`` turns calibrated chances into decisions with the run's measured cost by length
(``DraftEconomics.cost``): a chain whose tokens land with conditional chances c1, c2, .. emits
``E(k) = 1 + c1 + c1*c2 + ..`` tokens when k are verified, for ``cost(k)`` ms (a plain step is
k = 0). ``length`` is the k with the most tokens per ms (0: a plain step pays more): the
governor verifies that many of a proposal's drafts.
"""

from __future__ import annotations

import math
from typing import Sequence

BUCKETS = 10  # equal-width confidence buckets over [0, 1]
PRIOR_WEIGHT = 2.0  # pseudo-samples at the bucket's middle confidence (the drafter's own claim)
HALVE_AT = 256  # a bucket's counts are halved past this many reached: later evidence weighs more


def bucket(confidence: float) -> int:
    """The bucket of ``confidence`` (clamped to [0, 1]; 1.0 falls in the top bucket).

    >>> bucket(0.0), bucket(0.35), bucket(1.0)
    (0, 3, 9)
    """
    return min(BUCKETS - 1, max(0, int(float(confidence) * BUCKETS)))


def valid_confidences(values: object, length: int) -> list[float] | None:
    """``values`` as ``length`` floats in [0, 1], or None when they are not that (wrong type or
    length, NaN, out of range). Total: whatever ``values`` does, it returns.

    >>> valid_confidences([0.5, 1], 2)
    [0.5, 1.0]
    >>> valid_confidences([0.5, float('nan')], 2) is None, valid_confidences([0.5], 2) is None
    (True, True)
    """
    try:
        if isinstance(values, (str, bytes, dict)) or len(values) != length:
            return None
        out = [float(v) for v in values]
    except Exception:
        return None
    if any(isinstance(v, bool) for v in values) or not all(0.0 <= v <= 1.0 for v in out):
        return None  # NaN fails the range test too
    return out


class ConfidenceCalibration:
    """Landing chance by confidence bucket, measured in this run (see the module docstring)."""

    def __init__(self) -> None:
        self.reached = [0.0] * BUCKETS
        self.landed = [0.0] * BUCKETS
        self._fitted: list[float] | None = None  # the isotonic fit, until the next record

    def record(self, confidences: Sequence[float], accepted: int) -> None:
        """A verify of drafts with these ``confidences`` (in order), of which the first
        ``accepted`` landed: positions 1..accepted landed, position accepted + 1 (if drafted)
        was reached and missed, the rest were never judged."""
        for i, confidence in enumerate(confidences[: accepted + 1]):
            b = bucket(confidence)
            self.reached[b] += 1.0
            self.landed[b] += 1.0 if i < accepted else 0.0
            if self.reached[b] > HALVE_AT:
                self.reached[b] /= 2.0
                self.landed[b] /= 2.0
        self._fitted = None

    def clear(self) -> None:
        self.__init__()

    def samples(self) -> int:
        """Draft tokens judged so far (rounded; halving makes them fractional)."""
        return int(round(sum(self.reached)))

    def chance(self, confidence: float) -> float:
        """The calibrated chance that a draft token of this confidence lands, given that every
        draft before it landed."""
        return self.table()[bucket(confidence)]

    def table(self) -> list[float]:
        """The calibrated chance of every bucket, non-decreasing."""
        if self._fitted is None:
            self._fitted = _isotonic(
                [(self.landed[b] + PRIOR_WEIGHT * _middle(b)) / (self.reached[b] + PRIOR_WEIGHT) for b in range(BUCKETS)],
                [self.reached[b] + PRIOR_WEIGHT for b in range(BUCKETS)],
            )
        return self._fitted


class ChainWorth:
    """The calibrated chances against the measured costs: how much of a chain to verify.

    ``economics`` is the governor's ``DraftEconomics`` (its ``cost(k)``: ms of a step verifying
    k drafts, k = 0 a plain step); ``calibration`` a ``ConfidenceCalibration``."""

    def __init__(self, calibration: ConfidenceCalibration, economics) -> None:
        self.calibration = calibration
        self.economics = economics

    def chance(self, confidence: float) -> float:
        """Calibrated landing chance of a draft token of this confidence (see ``ConfidenceCalibration``)."""
        return self.calibration.chance(confidence)

    def length(self, confidences: Sequence[float]) -> int:
        """How many of a chain's drafts (with these confidences) to verify: the k in 0..n with
        the most expected tokens per measured ms; n when no cost is measured yet (a length that
        might pay is tried); ties go to the shorter."""
        n = len(confidences)
        costs = self._costs(n)
        if costs is None or n == 0:
            return n
        best_k, best_rate = 0, None
        for k, expected in enumerate(self._expected(confidences)):
            rate = expected / costs[k]
            if best_rate is None or rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        return best_k

    def _expected(self, confidences: Sequence[float]) -> list[float]:
        """[E(0), E(1), .., E(n)] under the calibrated chances."""
        out, total, chain = [1.0], 1.0, 1.0
        for confidence in confidences:
            chain *= self.chance(confidence)
            total += chain
            out.append(total)
        return out

    def _costs(self, n: int) -> list[float] | None:
        """[cost(0) .. cost(n)] in ms, or None when nothing is measured."""
        return self.economics.costs(n)


def _middle(b: int) -> float:
    return (b + 0.5) / BUCKETS


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted squares (pool adjacent
    violators).

    >>> _isotonic([0.2, 0.6, 0.4, 0.9], [1, 1, 1, 1])
    [0.2, 0.5, 0.5, 0.9]
    """
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    out: list[float] = []
    for value, _, count in blocks:
        out.extend([value] * count)
    return [v if math.isfinite(v) else 0.0 for v in out]
