"""The governor check: the emulated cost profile and the paired figures it produces."""

from __future__ import annotations

import time

import pytest
import torch

from tsspec_bench.governor_check import (
    ALWAYS, ALWAYS_OFF, NEVER, NEVER_OFF, CostProfileToy, relative_cost, run_governor_check,
)
from tsspec.testing import ToyTarget


def test_relative_cost_follows_the_measured_profile_and_grows_for_prefill():
    assert relative_cost(1) == 1.0
    assert relative_cost(2) == pytest.approx(1.091)
    assert relative_cost(8) == pytest.approx(2.409)
    assert relative_cost(6) == pytest.approx(1.818 + (2.409 - 1.818) / 3)
    assert relative_cost(16) < relative_cost(17) < relative_cost(200)
    costs = [relative_cost(r) for r in range(1, 40)]
    assert costs == sorted(costs)


def test_cost_profile_toy_pads_each_forward_and_stays_exact():
    slow, exact = CostProfileToy(base_ms=4.0, seed=5, recurrent=False), ToyTarget(seed=5, recurrent=False)
    start = time.perf_counter()
    a, _ = slow.spec_forward([1, 2, 3, 4], all_logits_rows=True, want_hidden=False)
    assert time.perf_counter() - start >= 4.0 * relative_cost(4) / 1000.0
    b, _ = exact.spec_forward([1, 2, 3, 4], all_logits_rows=True, want_hidden=False)
    assert torch.equal(a, b)


def test_governor_check_runs_every_configuration_paired_and_lossless():
    check = run_governor_check(reps=1, cases=1, prompt_tokens=8, max_tokens=12, base_ms=0.5)
    timed = [r for r in check.records if not r.warmup]
    assert [r.config for r in timed] == ["plain", NEVER, NEVER_OFF, ALWAYS, ALWAYS_OFF]
    assert all(r.verdict.ok for r in check.records)
    never_off = next(r for r in timed if r.config == NEVER_OFF)
    always_off = next(r for r in timed if r.config == ALWAYS_OFF)
    assert never_off.stats.accepted_tokens == 0 and never_off.stats.draft_tokens > 0
    assert always_off.stats.accepted_tokens == always_off.stats.draft_tokens > 0
    names = [f.name for f in check.figures]
    assert names[0].startswith("never-accepting, governor on vs plain")
    assert [f.goal for f in check.figures] == [0.97, 0.97, None, None]
    data = check.to_json()
    assert data["figures"][0]["passed"] in (True, False)
    assert data["settings"]["base_ms"] == 0.5


# -- the governor rules the goals rely on (synthetic costs, no clock) -------------------------

from tsspec.runtime.governor import HOLD, PARKED, SpeculationCostGovernor  # noqa: E402

PLAIN_MS = 10.0


def _drive(gov, spec_ms, spec_tokens, steps):
    choices = []
    for _ in range(steps):
        if gov.want_speculation():
            gov.record(True, spec_ms, spec_tokens)
            choices.append("S")
        else:
            gov.record(False, PLAIN_MS, 1)
            choices.append("P")
    return "".join(choices)


def test_zero_acceptance_parks_after_two_steps_and_reprobes_with_one():
    gov = SpeculationCostGovernor(initial_backoff=4)
    choices = _drive(gov, 17.0, 1, 40)
    # S P S (parked 4) S (parked 16) S (parked 64) ...: no timing baseline needed to park, and
    # a probe that landed nothing grows the next park four times
    assert choices.startswith("SPS" + "P" * 4 + "S" + "P" * 16 + "S")
    assert gov.losses >= 3 and gov.wins == 0


def test_productive_speculation_spaces_its_baseline_samples():
    gov = SpeculationCostGovernor()
    choices = _drive(gov, 17.0, 9, 14)  # 9 tokens per step: a plain sample would cost 8/9 of a step
    assert choices == "S" * 14
    assert gov.state != PARKED


def test_decisive_evidence_wins_before_min_samples():
    gov = SpeculationCostGovernor(min_samples=6, plain_spacing=0.5)
    _drive(gov, 14.0, 5, 12)  # 2.8 ms/token against 10: far beyond the 2x decisive ratio
    assert gov.state == HOLD and gov.wins == 1 and gov.plain.count < 6
