"""SpeculationCostGovernor: speculation must never make decoding slower.

The loop asks ``want_speculation()`` before each step and reports each step's cost with
``record``. The governor compares ms per emitted token of speculative against plain steps (a
rolling window, each side's first sample discarded, a step counted at most ``STALL_CAP`` times
its side's median step: one step stalled by another process decides nothing), parks drafting
while speculation loses and re-probes with exponential backoff (x``landless_growth`` while
nothing landed, else x2, capped at ``max_backoff``); a won state is dropped when it degrades.
Its own cost stays small: ``zero_accept_limit`` landless verifies park at once (empty attempts
count by their cost), baseline samples are spaced by what they give up, a ratio decides after
two samples a side when every sample of one side beats every one of the other by
``decisive_ratio``, and a probe drafts ``probe_draft`` tokens until one lands. How much: a
proposal with per-draft ``confidence`` is cut to the prefix worth its rows
(``calibration.ChainWorth``; 0: a plain step). It never changes the output.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Deque, Sequence

from .calibration import ChainWorth, ConfidenceCalibration, StepCosts, bucket

PROBE, HOLD, PARKED = "probe", "hold", "parked"
DECISIVE_SAMPLES = 2  # samples per side behind an early (decisive) decision
STALL_CAP = 3.0  # a step counts at most this many times the median step of its side
CAPPED_FROM = 3  # samples that emitted tokens before the cap applies (a median of 2 is their mean)


class _Window:
    """Rolling (ms, tokens) samples; cost is the ratio of sums. The governor reads it several
    times a step, so the token total and the count are kept as samples come and go (integers:
    exact) and the ms sum is one C-level ``sum`` over the ms in order (the same float as ever)."""

    def __init__(self, size: int):
        self.samples: Deque[tuple[float, int]] = collections.deque(maxlen=size)
        self._ms: Deque[float] = collections.deque(maxlen=size)  # the samples' ms, in order
        self._tokens = 0  # sum of the samples' tokens
        self._counted = 0  # samples with tokens > 0
        self.seen = 0  # including the discarded warm-up sample

    def add(self, ms: float, tokens: int) -> None:
        self.seen += 1
        if self.seen == 1:
            return  # first sample of each side: warm-up (allocations, caches)
        if len(self.samples) == self.samples.maxlen:
            _, dropped = self.samples[0]
            self._tokens -= dropped
            self._counted -= dropped > 0
        self.samples.append((ms, tokens))
        self._ms.append(ms)
        self._tokens += tokens
        self._counted += tokens > 0

    def clear(self) -> None:
        self.samples.clear()
        self._ms.clear()
        self._tokens = self._counted = 0

    @property
    def full(self) -> bool:
        """The window holds its most samples (older ones are dropped from now on)."""
        return len(self.samples) == self.samples.maxlen

    @property
    def count(self) -> int:
        """Samples that emitted tokens (empty-proposal costs ride along but do not count)."""
        return self._counted

    @property
    def ms_per_token(self) -> float | None:
        if self._tokens == 0:
            return None
        return sum(self._ms) / self._tokens

    @property
    def capped_ms_per_token(self) -> float | None:
        """``ms_per_token`` with each step's ms capped at STALL_CAP x the median of the steps
        that emitted tokens: a step stalled by another process moves the cost by at most that."""
        if self._tokens == 0 or self._counted < CAPPED_FROM:
            return self.ms_per_token
        cap = STALL_CAP * statistics.median(ms for ms, tokens in self.samples if tokens > 0)
        return sum(min(ms, cap) for ms in self._ms) / self._tokens

    def per_token_range(self) -> tuple[float, float] | None:
        """(fastest, slowest) ms per token of the samples that emitted tokens."""
        rates = [ms / tokens for ms, tokens in self.samples if tokens > 0]
        return (min(rates), max(rates)) if rates else None


class SpeculationCostGovernor:
    def __init__(
        self,
        *,
        enabled: bool = True,
        min_samples: int = 4,
        window: int = 64,
        initial_backoff: int = 24,
        max_backoff: int = 512,
        landless_growth: int = 4,
        plain_refresh_interval: int = 48,
        margin: float = 1.0,
        zero_accept_limit: int = 2,
        plain_spacing: float = 2.0,
        decisive_ratio: float = 2.0,
        probe_draft: int = 1,
        explore_after: int = 8,
        cost_shape=None,
        calibrated_samples: int = 12,
    ):
        self.enabled = enabled
        self.min_samples = min_samples
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.landless_growth = max(2, int(landless_growth))  # backoff growth after a probe that landed nothing
        self.plain_refresh_interval = plain_refresh_interval
        self.margin = margin  # speculation wins when spec_cost < plain_cost * margin
        self.zero_accept_limit = zero_accept_limit
        self.plain_spacing = plain_spacing
        self.decisive_ratio = decisive_ratio
        self.probe_draft = probe_draft
        self.explore_after = explore_after  # declines of one bucket before it is re-tried
        # verified steps a probe of confidence-sized drafting that has landed a token in this
        # sequence needs before a (non-decisive) verdict: its steps are the ones worth
        # verifying, so it sits near break-even where a few Bernoulli landings decide nothing;
        # a clear loser is still parked by decisive_ratio, one that never lands by min_samples
        self.calibrated_samples = max(min_samples, int(calibrated_samples))
        self.calibrated = False  # a proposal carried confidence: its drafts are sized after proposing
        # cost_shape: the target's measured cost by rows, or a function that reads it (called
        # when a proposal first carries confidence: a target may measure it on first read)
        self._shape_source = cost_shape if callable(cost_shape) else None
        self.costs = StepCosts(None if callable(cost_shape) else cost_shape)
        self.calibration = ConfidenceCalibration()  # landing by confidence bucket, this sequence
        self.worth = ChainWorth(self.calibration, self.costs)
        self.declined = 0  # proposals not verified because their drafts do not pay
        self._declines: dict[int, int] = {}  # first draft's bucket -> declines since last verified
        self._explore_gap: dict[int, int] = {}  # bucket -> declines before the next re-try
        self.carried: tuple[int, int] | None = None  # a park to start the next sequence with (reset)
        self.probe_landed = False  # has a step of this probe accepted a drafted token?
        self.landed = False  # has any step of this sequence accepted one (the x4 backoff's test)
        self.zero_run = 0  # consecutive speculative steps (in PROBE) that accepted nothing
        self.wasted_ms = 0.0  # empty draft attempts' ms (in PROBE) not yet counted in zero_run
        self.reprobing = False  # the current probe follows a park
        self.probe_steps = 0  # speculative steps and their tokens in this probe (warm-up
        self.probe_tokens = 0  # included: token counts are not skewed by it)
        self.spec = _Window(window)
        self.plain = _Window(window)
        self.state = PROBE
        self.backoff = initial_backoff
        self.parked_left = 0
        self.since_plain = 0
        self.spec_since_check = 0
        self.wins = 0
        self.losses = 0
        self.parked_steps = 0

    # -- the loop's questions --------------------------------------------------------------
    def want_speculation(self) -> bool:
        """Should this step draft? False means a plain one-row step."""
        if not self.enabled:
            return True
        if self.state == PARKED:
            if self.parked_left > 0:
                self.parked_left -= 1
                self.parked_steps += 1
                return False
            self.state = PROBE
            self.spec.clear()
            self.spec.seen = 1  # keep the warm-up discard for the first probe only
            self.spec_since_check = 0
            self._start_probe(reprobe=True)
        if self.plain.count < self.min_samples and self.since_plain >= self._plain_gap():
            return False  # interleave plain samples until there is a baseline
        if self.state == HOLD and self.since_plain >= self.plain_refresh_interval:
            return False  # refresh the baseline now and then: context growth changes it
        return True

    def draft_limit(self, window: int) -> int:
        """The most tokens this step may draft: ``window``, capped at ``probe_draft`` while a
        probe has not yet landed a drafted token."""
        if self.enabled and self.state == PROBE and not self.probe_landed:
            return min(window, self.probe_draft)
        return window

    def size_proposal(self, proposed: int, confidence: Sequence[float] | None = None) -> int:
        """How many of a proposal's ``proposed`` drafts to verify given their per-draft
        ``confidence``: the length the calibrated chances pay for (``ChainWorth.length``; 0:
        decline, the step is a plain one), one token when the first draft's bucket declined
        ``explore_after`` times in a row is re-tried, capped at ``probe_draft`` while a probe
        has landed nothing. Without confidence, or with the governor off: all of them."""
        if confidence is None or not self.enabled or proposed <= 0:
            return proposed
        self.calibrated = True
        if self._shape_source is not None:
            source, self._shape_source = self._shape_source, None
            self.costs.set_shape(source())
        keep = self.worth.length(list(confidence)[:proposed])
        key = bucket(confidence[0])
        if keep == 0:
            declines = self._declines.get(key, 0) + 1
            if declines < self._explore_gap.get(key, self.explore_after):
                self._declines[key] = declines
                self.declined += 1
                return 0
            keep = 1  # re-try the bucket with one token: its estimate moves only when verified
            self._explore_gap[key] = min(self.max_backoff, 2 * self._explore_gap.get(key, self.explore_after))
        else:
            self._explore_gap.pop(key, None)
        self._declines.pop(key, None)
        if self.state == PROBE and not self.probe_landed:
            keep = min(keep, self.probe_draft)
        return keep

    def _plain_gap(self) -> int:
        """Speculative steps between baseline samples while the baseline is short."""
        if not self.probe_steps:
            return 1
        gained = self.probe_tokens / self.probe_steps - 1.0  # extra tokens per speculative step
        return max(1, math.ceil(self.plain_spacing * gained))

    def _start_probe(self, *, reprobe: bool) -> None:
        self.zero_run = 0
        self.wasted_ms = 0.0
        self.probe_landed = False
        self.reprobing = reprobe
        self.probe_steps = 0
        self.probe_tokens = 0

    def record(self, speculative: bool, ms: float, tokens: int, drafted: int | None = None,
               confidence: Sequence[float] | None = None) -> None:
        """Report a step: speculative (drafted, verified) or plain, its ms and emitted tokens;
        ``drafted``: how many tokens the speculative step verified; ``confidence``: the verified
        drafts' confidences (the calibration learns what landed by bucket)."""
        key = None
        if confidence is not None and speculative and drafted:
            self.calibration.record(list(confidence)[:drafted], tokens - 1)
            key = bucket(confidence[0])
        if not speculative or drafted:
            self.costs.record(drafted if speculative else 0, ms)
        if speculative:
            self.spec.add(ms, tokens)
            self.since_plain += 1
            self.spec_since_check += 1
            self.probe_steps += 1
            self.probe_tokens += tokens
            if tokens > 1:
                self.zero_run = 0
                if key is not None:
                    self._explore_gap.pop(key, None)  # a re-tried bucket landed: judge it afresh
            elif key is None:  # calibrated steps are judged per bucket, not by streaks
                self.zero_run += 1
            if tokens > 1:
                self.wasted_ms = 0.0
            self.probe_landed = self.probe_landed or tokens > 1
            self.landed = self.landed or tokens > 1
        else:
            self.plain.add(ms, tokens)
            self.since_plain = 0
        if self.enabled:
            if speculative and self.state == PROBE and self.zero_run >= self._zero_limit():
                self._park()  # nothing accepted: these steps cannot have beaten plain ones
                return
            if not speculative and self.state == PROBE and self.wasted_ms > 0:
                self._count_waste()  # attempts made before this baseline sample existed
                if self.state == PARKED:
                    return
            self._decide()

    def _zero_limit(self) -> int:
        return 1 if self.reprobing else self.zero_accept_limit

    def record_empty_proposal(self, ms: float) -> None:
        """A draft attempt that proposed nothing: its cost is speculation's, with no tokens."""
        if not (self.enabled and self.state != PARKED):
            return
        self.spec.add(ms, 0)
        if self.state != PROBE:
            return
        self.wasted_ms += max(0.0, float(ms))  # counted now, or once a baseline exists
        self._count_waste()

    def _count_waste(self) -> None:
        """Turn the probe's wasted attempt milliseconds into zero-accept steps, one per plain
        step's worth (the measured baseline; nothing happens until it exists), parking at the
        zero-accept limit."""
        plain = self.plain.capped_ms_per_token
        if plain is None or plain <= 0 or self.wasted_ms < plain:
            return
        steps = int(self.wasted_ms // plain)  # a plain step's worth of attempts that found nothing
        self.wasted_ms -= steps * plain
        self.zero_run += steps
        if self.zero_run >= self._zero_limit():
            self._park()

    def reset(self) -> None:
        """A new sequence: acceptance depends on the prompt, so re-probe; keep the plain
        baseline (it is the machine's, not the prompt's) and restart the backoff."""
        self.state = PROBE
        self.spec.clear()
        self.backoff = self.initial_backoff
        self.parked_left = 0
        self.spec_since_check = 0
        self.calibration.clear()
        self.landed = False
        self._declines.clear()
        self._explore_gap.clear()
        self._start_probe(reprobe=False)
        carried, self.carried = self.carried, None
        if carried is not None:
            self.start_parked(*carried)

    def carry_over(self) -> tuple[int, int] | None:
        """(steps still to park, backoff) when drafting lost and is parked now, else None: what a
        later sequence on the same drafter may start from (``start_parked``)."""
        if self.state != PARKED:
            return None
        return self.parked_left, self.backoff

    def start_parked(self, steps: int, backoff: int) -> None:
        """Begin a sequence parked for ``steps`` steps with ``backoff`` as the next park's
        length (call after ``reset``): the drafter lost on an earlier sequence of this target.
        ``steps`` 0: the park ran out, and the first step re-probes (as a re-probe, with that
        backoff)."""
        if not self.enabled or steps < 0:
            return
        self.state = PARKED
        self.parked_left = int(steps)
        self.backoff = max(self.initial_backoff, min(self.max_backoff, int(backoff)))
        self.spec.clear()

    # -- policy ----------------------------------------------------------------------------
    def _decide(self) -> None:
        if self.state == PARKED:
            return
        spec_cost, plain_cost = self.spec.capped_ms_per_token, self.plain.capped_ms_per_token
        if spec_cost is None or plain_cost is None or plain_cost <= 0:
            return  # no baseline yet, or one a clock could not resolve: nothing to compare
        # a landless one is judged as before; so is one whose window filled (mostly declined
        # attempts) before it gathered calibrated_samples verified steps: no verdict-less probe
        near = self.calibrated and self.landed and self.state == PROBE and not self.spec.full
        spec_samples = self.calibrated_samples if near else self.min_samples
        enough = self.spec.count >= spec_samples and self.plain.count >= self.min_samples
        decisive = (
            self.state == PROBE
            and min(self.spec.count, self.plain.count) >= DECISIVE_SAMPLES
            and self._lopsided()
        )
        if not (enough or decisive):
            return
        winning = spec_cost < plain_cost * self.margin
        if self.state == PROBE:
            if winning:
                self.state = HOLD
                self.wins += 1
                self.backoff = self.initial_backoff
                self.spec_since_check = 0
            else:
                self._park()
        elif self.state == HOLD and self.spec_since_check >= self.min_samples:
            self.spec_since_check = 0
            if not winning:  # a won state that degraded
                self.backoff = self.initial_backoff
                self._park()

    def _lopsided(self) -> bool:
        """Every sample of one side beats every sample of the other by ``decisive_ratio`` (ms
        per token): an early verdict that no single stalled step can make."""
        spec, plain = self.spec.per_token_range(), self.plain.per_token_range()
        if spec is None or plain is None or min(spec[0], plain[0]) <= 0:
            return False
        return spec[0] > self.decisive_ratio * plain[1] or plain[0] > self.decisive_ratio * spec[1]

    def _park(self) -> None:
        """Park for ``backoff`` plain steps and grow the next park: x``landless_growth`` while
        no step of this sequence has landed a drafted token (uncalibrated drafting), else x2 (a
        drafter that landed some, a won state that degraded, calibrated drafting: its per-bucket
        declines already cut the losing drafts); capped at ``max_backoff``. A win resets it (``_decide``)."""
        self.losses += 1
        landless = not (self.landed or self.calibrated or self.state == HOLD)
        growth = self.landless_growth if landless else 2
        self.state = PARKED
        self.parked_left = self.backoff
        self.backoff = min(self.max_backoff, self.backoff * growth)
        self.spec.clear()
