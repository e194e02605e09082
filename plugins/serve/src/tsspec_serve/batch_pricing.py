"""Speculation priced for the whole batch: a sequence drafts only where its drafts pay for the
batch it runs in.

In a batch of k one-row steps, a sequence that verifies d drafts widens the forward from k to
k + d rows. Its drafts pay for the batch when the tokens they add per millisecond they add beat
the batch's plain rate: ``accepted * C(k) >= k * (C(k + d) - C(k))``, with ``C(rows)`` the
forward's measured cost by rows and ``accepted`` the tokens a verify of this sequence lands
(its own recent verifies). ``BatchCosts`` is measured from the scheduler's own batches in this
run (until two row counts are seen, the target's cost by rows where it publishes one); nothing
comes from a table measured elsewhere. ``BatchGovernor`` is the ordinary cost governor with that
test in front: a refused step is a plain step, and a refusal is re-tried with one verify after a
backoff (doubling to ``MAX_GAP`` steps) so the acceptance it rests on stays current. A lone
sequence (k = 1) is the ordinary governor's alone. It decides whether to draft, never a token.
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Callable
from typing import Deque

from tsspec import SpeculationCostGovernor
from tsspec.capabilities import verify_cost_shape
from tsspec.runtime.batching import row_cost

SAMPLES = 16  # the most recent forwards kept per row count, and verifies per sequence
MIN_SAMPLES = 3  # forwards of a row count behind its median
FIRST_GAP, MAX_GAP = 4, 64  # plain steps before a refused sequence re-tries one verify


class BatchCosts:
    """Forward milliseconds by total rows, from the scheduler's batches (thread-safe)."""

    def __init__(self, target=None):
        self._ms: dict[int, collections.deque[float]] = collections.defaultdict(lambda: collections.deque(maxlen=SAMPLES))
        self._lock = threading.Lock()
        self._target = target

    def record(self, rows: int, ms: float) -> None:
        with self._lock:
            self._ms[int(rows)].append(float(ms))

    def profile(self) -> list[tuple[int, float]]:
        """(rows, median ms) of every row count with enough forwards."""
        with self._lock:
            return sorted((r, statistics.median(v)) for r, v in self._ms.items() if len(v) >= MIN_SAMPLES)

    def cost(self, rows: int) -> float | None:
        """The cost of a forward of ``rows`` rows (ms, or the target's relative units before
        two row counts are measured); None when neither is known."""
        measured = self.profile()
        if len(measured) >= 2:
            return row_cost(measured, rows)
        shape = verify_cost_shape(self._target) if self._target is not None else None
        return row_cost(shape, rows) if shape else None


def pays(costs: BatchCosts, streams: int, drafts: float, accepted: float) -> bool | None:
    """Do ``drafts`` drafts landing ``accepted`` tokens (means) pay in a batch of ``streams``
    one-row steps? None when the costs are not known yet."""
    if streams <= 1 or drafts <= 0:
        return True
    plain, wide = costs.cost(streams), costs.cost(streams + max(1, round(drafts)))
    if plain is None or wide is None or plain <= 0:
        return None
    return accepted * plain >= streams * max(0.0, wide - plain)


class BatchGovernor(SpeculationCostGovernor):
    """The cost governor of one served sequence, with the batch's price in front (see the
    module docstring); ``streams()`` reads how many sequences share the batch now."""

    def __init__(self, costs: BatchCosts, streams: Callable[[], int], **kwargs):
        super().__init__(**kwargs)
        self.batch_costs, self.streams = costs, streams
        self._drafted: collections.deque[int] = collections.deque(maxlen=SAMPLES)
        self._accepted: collections.deque[int] = collections.deque(maxlen=SAMPLES)
        self._refused, self._gap = 0, FIRST_GAP
        self.batch_refusals = 0  # steps this governor made plain for the batch's sake

    def want_speculation(self) -> bool:
        if not super().want_speculation():
            return False
        if not self.enabled or not self._drafted:
            return True  # no verify yet: nothing to price it by
        verdict = pays(self.batch_costs, self.streams(), statistics.fmean(self._drafted),
                       statistics.fmean(self._accepted))
        if verdict is not False:
            self._gap = FIRST_GAP
            return True
        if self._refused < self._gap:
            self._refused += 1
            self.batch_refusals += 1
            return False
        self._refused, self._gap = 0, min(MAX_GAP, 2 * self._gap)  # re-try one verify
        return True

    def record(self, speculative: bool, ms: float, tokens: int, drafted: int | None = None, confidence=None) -> None:
        if speculative and drafted:
            self._drafted.append(int(drafted))
            self._accepted.append(max(0, int(tokens) - 1))
        super().record(speculative, ms, tokens, drafted=drafted, confidence=confidence)
