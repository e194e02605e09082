"""The cost governor's goals, measured: paired runs on a toy with a real model's cost profile.

Goals: with a speculator that never gets a draft accepted, decoding with the governor
runs at >= 0.97x plain; with one that is always right, the governor costs <= 3% against
speculation without it. The float64 toy itself is so fast that every step costs the same, so
``CostProfileToy`` pads each forward by a FIXED cost profile (``VERIFY_COST_PROFILE``: once
measured on the embedded model, not this run's measurement), scaled to a base step of
``base_ms``. The governor then faces a real model's kind of trade-off - a verify of 9 rows costs
~2.6 one-row steps in this profile - with the machine's noise removed from the comparison.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Sequence

import attrs

from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget
from .prompts import EncodedCase, PromptCase
from .runner import BenchConfig, BenchRunner, RunRecord

# rows -> forward time relative to one row: the cost shape this synthetic benchmark simulates
# (the embedded SmolLM2-135M on the CPU block kernels, 2 threads, ~100-600 tokens of context,
# as once measured: 1 row 11 ms, 2: 12, 4: 15.3, 8: 26.5, 16: 46). It decides nothing at run
# time; targets measure their own cost (model_llama's spec_verify_row_ms).
VERIFY_COST_PROFILE = (
    (1, 1.0), (2, 1.091), (3, 1.236), (4, 1.391), (5, 1.818), (8, 2.409), (9, 2.591), (12, 3.273), (16, 4.182)
)
PREFILL_ROW_COST = 0.2  # each row past 16 (prefill): 84 rows took ~18 one-row steps
DEFAULT_BASE_MS = 8.0
DEFAULT_CASES = 4
CONFIG_COUNT = 5  # plain + never/always-accepting, each with and without the governor
GOAL = 0.97

WALL, VIRTUAL = "wall", "virtual"
NEVER, NEVER_OFF = "never-accepting", "never-accepting/no-governor"
ALWAYS, ALWAYS_OFF = "always-accepting", "always-accepting/no-governor"


def relative_cost(rows: int) -> float:
    """Forward time of ``rows`` rows in one-row steps (piecewise linear in the profile).

    >>> relative_cost(1), relative_cost(8), round(relative_cost(6), 4)
    (1.0, 2.409, 2.015)
    """
    points = VERIFY_COST_PROFILE
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    last_rows, last_cost = points[-1]
    return last_cost + PREFILL_ROW_COST * (rows - last_rows)


class VirtualClock:
    """Seconds that pass only when a forward says so: the governor's policy, measured without
    the machine's noise or the loop's own overhead (every step costs exactly the profile)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CostProfileToy(ToyTarget):
    """The exact toy, each forward costing ``base_ms * relative_cost(rows)``: padded with a
    sleep on the wall clock, or added to a ``VirtualClock``."""

    def __init__(self, *, base_ms: float = DEFAULT_BASE_MS, clock: Callable[[], float] = time.perf_counter, **kwargs):
        super().__init__(**kwargs)
        self.base_ms = base_ms
        self._clock = clock

    def spec_forward(self, tokens, *, all_logits_rows: bool, want_hidden: bool):
        cost = self.base_ms * relative_cost(len(tokens)) / 1000.0
        if isinstance(self._clock, VirtualClock):
            self._clock.advance(cost)
            return super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
        start = self._clock()
        out = super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
        wait = cost - (self._clock() - start)
        if wait > 0:
            time.sleep(wait)
        return out


@attrs.define
class GovernorFigure:
    """One goal: a configuration against its reference, per pair."""

    name: str
    config: str
    reference: str
    tokens_per_second: float
    reference_tokens_per_second: float
    ratio_median: float
    ratio_min: float
    ratio_max: float
    pairs: int
    goal: float | None  # None: informational
    wins: int
    losses: int
    parked_steps: int

    @property
    def passed(self) -> bool | None:
        return None if self.goal is None else self.ratio_median >= self.goal

    def to_json(self) -> dict:
        data = attrs.asdict(self)
        for key in ("tokens_per_second", "reference_tokens_per_second", "ratio_median", "ratio_min", "ratio_max"):
            data[key] = round(data[key], 4)
        data["passed"] = self.passed
        return data


@attrs.define
class GovernorCheck:
    settings: dict
    figures: list[GovernorFigure]
    records: list[RunRecord]

    def to_json(self) -> dict:
        return {
            "settings": self.settings,
            "figures": [f.to_json() for f in self.figures],
            "runs": [r.to_json() for r in self.records],
        }


def _toy_cases(n: int, prompt_tokens: int, max_tokens: int, vocab: int, seed: int) -> list[EncodedCase]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = tuple(rng.randrange(vocab) for _ in range(prompt_tokens))
        case = PromptCase(f"toy-{i}", "toy", max_tokens, prompt="(token ids)", chat=False)
        out.append(EncodedCase(case, ids, max_tokens))
    return out


def _figure(records: Sequence[RunRecord], name: str, config: str, reference: str, goal: float | None) -> GovernorFigure:
    import statistics

    timed = [r for r in records if not r.warmup]
    ref = {(r.case_id, r.rep): r.tokens_per_second for r in timed if r.config == reference}
    mine = [r for r in timed if r.config == config]
    ratios = [r.tokens_per_second / ref[(r.case_id, r.rep)] for r in mine if ref.get((r.case_id, r.rep))]
    return GovernorFigure(
        name, config, reference,
        statistics.median(r.tokens_per_second for r in mine),
        statistics.median(ref.values()),
        statistics.median(ratios), min(ratios), max(ratios), len(ratios), goal,
        sum(r.stats.governor_wins for r in mine), sum(r.stats.governor_losses for r in mine),
        sum(r.stats.governor_parked_steps for r in mine),
    )


def run_governor_check(
    *,
    reps: int = 3,
    cases: int = DEFAULT_CASES,
    prompt_tokens: int = 64,
    max_tokens: int = 128,
    window: int = 8,
    base_ms: float = DEFAULT_BASE_MS,
    seed: int = 0,
    clock: str = WALL,
    on_run: Callable | None = None,
) -> GovernorCheck:
    """Plain vs never- and always-accepting oracles, each with and without the governor.

    ``clock`` is WALL (forwards sleep to their cost: the loop's real overhead counts, and so
    does the machine's noise) or VIRTUAL (time advances only by the profile: the policy alone,
    deterministic)."""
    import torch

    if clock not in (WALL, VIRTUAL):
        raise ValueError(f"clock must be {WALL!r} or {VIRTUAL!r}, got {clock!r}")
    timer = VirtualClock() if clock == VIRTUAL else time.perf_counter
    # pure KV like the embedded llama model: a rejected draft is rewound, not re-forwarded
    target = CostProfileToy(base_ms=base_ms, seed=seed, recurrent=False, clock=timer,
                            max_context=prompt_tokens + max_tokens + window + 8)
    configs = [
        BenchConfig.plain(),
        attrs.evolve(BenchConfig.oracle(0.0, adaptive=True), name=NEVER),
        attrs.evolve(BenchConfig.oracle(0.0, adaptive=False), name=NEVER_OFF),
        attrs.evolve(BenchConfig.oracle(1.0, adaptive=True), name=ALWAYS),
        attrs.evolve(BenchConfig.oracle(1.0, adaptive=False), name=ALWAYS_OFF),
    ]
    runner = BenchRunner(
        target, _toy_cases(cases, prompt_tokens, max_tokens, target.config.vocab_size, seed), configs,
        reps=reps, options=SpeculationOptions(draft=window), on_run=on_run,
        clock=timer if clock == VIRTUAL else None,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the toy's tiny float64 matmuls only pay thread wake-ups
    try:
        records = runner.run()
    finally:
        torch.set_num_threads(threads)
    figures = [
        _figure(records, "never-accepting, governor on vs plain", NEVER, "plain", GOAL),
        _figure(records, "always-accepting, governor on vs off", ALWAYS, ALWAYS_OFF, GOAL),
        _figure(records, "never-accepting, governor off vs plain", NEVER_OFF, "plain", None),
        _figure(records, "always-accepting, governor on vs plain", ALWAYS, "plain", None),
    ]
    settings = {
        "reps": reps, "cases": cases, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
        "window": window, "base_ms": base_ms, "cost_profile": [list(p) for p in VERIFY_COST_PROFILE],
        "clock": clock,
    }
    return GovernorCheck(settings, figures, records)
