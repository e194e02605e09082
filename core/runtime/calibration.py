"""What a drafter's confidence is worth in THIS run, and how much of a chain to verify.

``ConfidenceCalibration``: landing counts per confidence bucket, shrunk toward the bucket's
middle (``PRIOR_WEIGHT`` pseudo-samples) and made non-decreasing. ``StepCosts``: a step's ms by
drafts verified, measured here. ``ChainWorth.length``: the k with the most expected tokens
(``1 + c1 + c1*c2 + ..``) per ms."""

from __future__ import annotations

import collections
import math
from typing import Sequence

from ..cost_shape import parse_cost_shape, rows_cost

BUCKETS = 10  # equal-width confidence buckets over [0, 1]
PRIOR_WEIGHT = 2.0  # pseudo-samples at the bucket's middle confidence (the drafter's own claim)
HALVE_AT = 256  # a bucket's counts are halved past this many reached: later evidence weighs more
COST_SAMPLES = 16  # rolling samples kept per draft length (context growth changes costs)
MIN_COST_MS = 1e-9  # the least a step's cost can be (ratios divide by it)


def bucket(confidence: float) -> int:
    """The bucket of ``confidence``: ``bucket(0.35) == 3``, ``bucket(1.0) == 9``."""
    return min(BUCKETS - 1, max(0, int(float(confidence) * BUCKETS)))


def valid_confidences(values: object, length: int) -> list[float] | None:
    """``values`` as ``length`` floats in [0, 1], else None (never raises).

    >>> valid_confidences([0.5, 1], 2), valid_confidences([0.5], 2)
    ([0.5, 1.0], None)"""
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
        """Drafts with these confidences, the first ``accepted`` landed (the next one reached, missed)."""
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
        """The chance a draft of this confidence lands, given every draft before it did."""
        return self.table()[bucket(confidence)]

    def table(self) -> list[float]:
        """The calibrated chance of every bucket, non-decreasing."""
        if self._fitted is None:
            self._fitted = _isotonic(
                [(self.landed[b] + PRIOR_WEIGHT * (b + 0.5) / BUCKETS) / (self.reached[b] + PRIOR_WEIGHT) for b in range(BUCKETS)],
                [self.reached[b] + PRIOR_WEIGHT for b in range(BUCKETS)],
            )
        return self._fitted


class StepCosts:
    """A step's ms by drafts verified: with the target's cost by rows, that shape scaled by the
    median measured ratio; without, each length's rolling mean (interpolated)."""

    def __init__(self, shape=None) -> None:
        self._means: dict[int, collections.deque] = {}
        self.set_shape(shape)

    def set_shape(self, shape) -> None:
        """Price by this cost by rows from now on (None: by each length's mean)."""
        self.shape = parse_cost_shape(shape)
        self._scales: collections.deque = collections.deque(maxlen=4 * COST_SAMPLES)
        for length, samples in self._means.items() if self.shape is not None else ():
            self._scales.extend(ms / rows_cost(self.shape, length + 1) for ms in samples)

    def record(self, length: int, ms: float) -> None:
        ms = max(float(ms), MIN_COST_MS)
        self._means.setdefault(length, collections.deque(maxlen=COST_SAMPLES)).append(ms)
        if self.shape is not None:
            self._scales.append(ms / rows_cost(self.shape, length + 1))

    def costs(self, longest: int) -> list[float] | None:
        """[cost(0) .. cost(``longest``)] in ms, or None when nothing is measured yet."""
        means = {k: sum(v) / len(v) for k, v in self._means.items()}
        if not means:
            return None
        if self._scales:
            scale = sorted(self._scales)[len(self._scales) // 2]
            return [max(scale * rows_cost(self.shape, k + 1), MIN_COST_MS) for k in range(longest + 1)]
        return [_interpolate(means, k) for k in range(longest + 1)]


def _interpolate(means: dict[int, float], k: int) -> float:
    if k in means:
        return means[k]
    below, above = sorted(m for m in means if m < k), sorted(m for m in means if m > k)
    pair = [below[-1], above[0]] if below and above else below[-2:] if len(below) >= 2 else above[:2]
    if len(pair) < 2:
        return means[(below or above)[0]]
    lo, hi = pair
    return max(means[lo] + (means[hi] - means[lo]) / (hi - lo) * (k - lo), MIN_COST_MS)


class ChainWorth:
    """The calibrated chances against the measured ``StepCosts``: how much of a chain to verify."""

    def __init__(self, calibration: ConfidenceCalibration, costs: StepCosts) -> None:
        self.calibration = calibration
        self.costs = costs

    def length(self, confidences: Sequence[float]) -> int:
        """The k in 0..n with the most expected tokens per measured ms (n before any cost is known)."""
        n = len(confidences)
        costs = self.costs.costs(n)
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
            chain *= self.calibration.chance(confidence)
            total += chain
            out.append(total)
        return out


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool adjacent violators: the closest non-decreasing sequence.

    >>> _isotonic([0.2, 0.6, 0.4, 0.9], [1, 1, 1, 1])
    [0.2, 0.5, 0.5, 0.9]"""
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
