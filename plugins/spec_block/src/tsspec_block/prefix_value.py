"""PrefixValue: how much of a block's guesses to propose, by expected landing against the cost
of the verify rows.

One block pass gives every row's guess with a confidence (the drafter's softmax at its argmax).
Verifying k of them costs a target forward of k + 1 rows instead of one row; it emits
``E(k) = 1 + p1 + p1*p2 + ... + p1*...*pk`` tokens on average, where ``pi`` is the chance row i
lands once rows 1..i-1 did. The prefix proposed is the k (0 included: propose nothing) with the
most tokens per unit of forward cost, ``E(k) / shape(k + 1)``, against ``1 / shape(1)`` for a
plain step. The block pass itself is not in the sum: it is spent before the choice is made
(whether passes pay at all is the cost governor's call, which times every attempt).

Both sides are measured where it runs, never taken from a table:

* ``shape``: the target's forward cost by rows as it measured it on this machine
  (``spec_verify_row_ms``; only the ratios matter). Without one there is no value rule (the
  caller keeps the plain confidence gate).
* ``pi``: the confidences calibrated online (``Calibration``): landed / reached counts per
  confidence bin, apart for row 1 and for later rows (on the shipped SmolLM2 drafter a later
  row lands far less often than row 1 at the same confidence), each estimate shrunk toward the
  confidence itself by ``PRIOR_WEIGHT`` pseudo-samples (optimistic until measured, so a length
  that might pay gets tried). A calibration belongs to one drafter and outlives a sequence.

Worked example: shape 1 row 10, 2 rows 12, 3 rows 13 (ratios 1.2, 1.3). Calibrated p1 = 0.5,
p2 = 0.05: E(1) = 1.5 -> 1.25 a unit, E(2) = 1.525 -> 1.17; a plain step 1.0: propose one
token. With p1 = 0.15: E(1) = 1.15 -> 0.96 < 1.0: propose nothing.

``worth_more(c1)`` answers, after row 1 alone was scored, whether a longer prefix would pay
with every later row at the rate later rows have landed at so far (pooled over confidences,
optimistic until measured): if not, the drafter need not score rows 2.. at all (their draft
head rows and, on the compiled kernels, their last layer: most of a CPU pass).

Whether a pass is worth running at all: every pass is charged its own milliseconds against a
plain step's (both timed where it runs), and credited what its chosen prefix is expected to
earn (``pass_gain``: ``E(k) - shape(k + 1) / shape(1)`` plain steps); a running mean of that
per drafter says whether passes pay (``passes_pay``). The speculator skips passes while they
do not (a skipped step proposes nothing), trying one again after 1, 2, 4 .. 512 skipped
steps (a backoff kept with the calibration, as are the skips a sequence left untaken and the
recent plain steps that price a pass, so a new sequence on the drafter resumes them), so a
drafter that is rarely sure costs a pass every 512 steps, and one that starts to pay is back
within that.

Nothing is condemned for good on early evidence: counts change only for rows that are
proposed and verified, so a row-1 bin that proposes nothing, or later rows that are never
scored, would keep their estimate forever (and a calibration outlives its sequences). So a
declined bin proposes its first guess anyway after ``EXPLORE_AFTER`` declines, and unscored
later rows are scored anyway after as many refusals, the wait doubling while the retries land
nothing (up to ``EXPLORE_MAX``) and starting over once one lands.

This is a speculator-local decision behind two calls (``length``, ``record``) so that a shared
confidence-keyed mechanism in the runtime can take its place later.
"""

from __future__ import annotations

import collections
import threading
from typing import Sequence

from tsspec.cost_shape import parse_cost_shape, rows_cost

__all__ = ["BINS", "PRIOR_WEIGHT", "Calibration", "PrefixValue", "shape_ratios"]

BINS = 10  # confidence bins of width 0.1
PRIOR_WEIGHT = 2.0  # pseudo-samples at the raw confidence behind each bin's estimate
MAX_COUNT = 256  # a bin's counts are halved past this: recent behaviour weighs more
FIRST, LATER = 0, 1  # row groups
PASS_WEIGHT = 1.0 / 16  # weight of the newest pass in the running mean of what passes earn
EXPLORE_AFTER = 8  # declines of a bin (or refusals to score later rows) before a retry
EXPLORE_MAX = 512  # the longest wait between retries (it doubles while retries land nothing)
PLAIN_SAMPLES = 16  # recent plain steps whose median prices a pass


def shape_ratios(cost_shape, rows: int) -> list[float] | None:
    """``[shape(1)/shape(1), shape(2)/shape(1), ..., shape(rows)/shape(1)]`` from a target's
    cost by rows (linear between its points, the last slope past its end, never below the last
    point), or None for a missing or malformed one."""
    shape = parse_cost_shape(cost_shape)
    if shape is None:
        return None
    one = rows_cost(shape, 1)
    return [rows_cost(shape, n) / one for n in range(1, rows + 1)]


class Calibration:
    """Landed / reached counts by (row group, confidence bin); thread-safe (sequence views of
    one drafter share it)."""

    def __init__(self) -> None:
        self.reached = [[0.0] * BINS for _ in range(2)]
        self.landed = [[0.0] * BINS for _ in range(2)]
        self.pass_gain: float | None = None  # running mean of what a pass earned, in plain steps
        self.skip_next = 1  # steps the block speculator runs no pass after a pass that did not pay
        # skipped steps a sequence had still to go when it ended: the next sequence skips them first
        self.skip_left = 0
        # the target's recent plain steps (ms), which price a pass: a new sequence's first pass
        # is judged against them instead of running unjudged before its own first plain step
        self.plain_ms: collections.deque[float] = collections.deque(maxlen=PLAIN_SAMPLES)
        # retries of what the rule refuses: [declines, wait] per row-1 bin, and for later rows
        self._explore = [[0, EXPLORE_AFTER] for _ in range(BINS)]
        self._explore_later = [0, EXPLORE_AFTER]
        self._lock = threading.Lock()

    def retry(self, confidence: float | None) -> bool:
        """A refusal of the rule: True when it should be overridden now (the row-1 bin of
        ``confidence``, or later rows when None), after its current wait of refusals."""
        with self._lock:
            slot = self._explore_later if confidence is None else self._explore[self.bin(confidence)]
            slot[0] += 1
            if slot[0] < slot[1]:
                return False
            slot[0], slot[1] = 0, min(EXPLORE_MAX, 2 * slot[1])
            return True

    def note_plain(self, ms: float) -> None:
        """A plain step of the target this drafter serves took ``ms``."""
        with self._lock:
            self.plain_ms.append(float(ms))

    def plain_step_ms(self) -> float:
        """The median of the recent plain steps (0.0: none timed yet)."""
        with self._lock:
            recent = sorted(self.plain_ms)
        return recent[len(recent) // 2] if recent else 0.0

    def note_pass(self, gain: float) -> None:
        """What one block pass earned, in plain steps (``PrefixValue.pass_gain``)."""
        with self._lock:
            g = float(gain)
            self.pass_gain = g if self.pass_gain is None else self.pass_gain + (g - self.pass_gain) * PASS_WEIGHT

    @staticmethod
    def bin(confidence: float) -> int:
        return min(BINS - 1, max(0, int(float(confidence) * BINS)))

    def rate(self, row: int, confidence: float) -> float:
        """Estimated chance that row ``row`` (0-based) lands given the rows before it did."""
        c = min(1.0, max(0.0, float(confidence))) if confidence == confidence else 0.0
        group, b = (FIRST if row == 0 else LATER), self.bin(c)
        return (self.landed[group][b] + PRIOR_WEIGHT * c) / (self.reached[group][b] + PRIOR_WEIGHT)

    def later_rate(self) -> float:
        """How often a later row lands once the rows before it did, over every confidence
        (pooled), shrunk toward 1 (optimistic until measured): the estimate for a row not
        scored yet."""
        reached, landed = sum(self.reached[LATER]), sum(self.landed[LATER])
        return (landed + PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)

    def record(self, confidences: Sequence[float], landed: int) -> None:
        """A verified proposal: rows 0..``landed`` were reached, rows before ``landed`` landed."""
        with self._lock:
            for row, conf in enumerate(confidences):
                if row > landed:
                    break
                group = FIRST if row == 0 else LATER
                b = self.bin(conf if conf == conf else 0.0)
                self.reached[group][b] += 1
                self.landed[group][b] += row < landed
                if row < landed:  # a landing: retries of what it belongs to start over
                    slot = self._explore_later if group == LATER else self._explore[b]
                    slot[0], slot[1] = 0, EXPLORE_AFTER
                if self.reached[group][b] > MAX_COUNT:
                    self.reached[group][b] /= 2
                    self.landed[group][b] /= 2


class PrefixValue:
    """The prefix of a block worth verifying (see the module docstring)."""

    def __init__(self, ratios: Sequence[float], calibration: Calibration | None = None) -> None:
        self.ratios = [float(r) for r in ratios]  # [rows]: cost of 1.. rows over one row's
        self.calibration = calibration or Calibration()
        self._later_retry: bool | None = None  # worth_more's answer on a refusal, for length()

    def _ratio(self, rows: int) -> float:
        return self.ratios[min(rows, len(self.ratios)) - 1]

    def _best(self, rates: Sequence[float]) -> tuple[int, float]:
        """(k, tokens per unit cost) of the best prefix under ``rates``; k 0 is a plain step."""
        best_k, best_value = 0, 1.0
        expected, chain = 1.0, 1.0
        for k, rate in enumerate(rates, start=1):
            chain *= rate
            expected += chain
            value = expected / self._ratio(k + 1)
            if value > best_value * (1 + 1e-9):
                best_k, best_value = k, value
        return best_k, best_value

    def length(self, confidences: Sequence[float]) -> int:
        """How many of the block's guesses (confidences of rows 1..) to propose."""
        cal = self.calibration
        k = self._best([cal.rate(i, c) for i, c in enumerate(confidences)])[0]
        if k == 0 and confidences and cal.retry(confidences[0]):
            k = 1  # a retry of a declined bin (see the module docstring)
        later, self._later_retry = self._later_retry, None
        if k == 1 and len(confidences) >= 2:
            if later is None:  # worth_more was not asked on this pass
                later = cal.retry(None)
            if later:
                k = 2  # a retry of the later rows: row 2 is verified, so its counts move
        return k

    def worth_more(self, first: float, rows: int) -> bool:
        """Would a prefix longer than one of ``rows`` guesses pay, row 1 at confidence ``first``
        and every later row at the later rows' pooled rate (``Calibration.later_rate``)?"""
        if rows <= 1:
            return False
        cal = self.calibration
        k, _ = self._best([cal.rate(0, first)] + [cal.later_rate()] * (rows - 1))
        if k > 1:
            self._later_retry = None
            return True
        self._later_retry = cal.retry(None)  # length() proposes row 2 on a retry
        return self._later_retry

    def record(self, confidences: Sequence[float], landed: int) -> None:
        """What a proposal of these confidences landed (``landed`` of ``len(confidences)``)."""
        self.calibration.record(confidences, int(landed))

    def pass_gain(self, confidences: Sequence[float], length: int, pass_cost: float) -> float:
        """What a pass whose prefix of ``length`` guesses is proposed earns, in plain steps:
        the expected tokens less the verify's cost (``E(k) - shape(k + 1) / shape(1)``: the
        plain steps those tokens would have taken, less the verify's cost in plain steps; 0 for
        a prefix of none), less the pass's own cost ``pass_cost`` (its ms over a plain step's)."""
        cal = self.calibration
        expected, chain = 1.0, 1.0
        for i, conf in enumerate(confidences[:length]):
            chain *= cal.rate(i, conf)
            expected += chain
        return (expected - self._ratio(length + 1) if length > 0 else 0.0) - float(pass_cost)

    def passes_pay(self) -> bool:
        """Do this drafter's passes earn more than they cost, on the running mean (True until
        one was measured)?"""
        gain = self.calibration.pass_gain
        return gain is None or gain >= 0.0
