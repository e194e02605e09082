"""Scheduler pieces that need no model: the cost-by-rows interpolation and the verify charge.
(The scheduler on a real paged target: plugins/model_llama/tests/test_batched_serving.py.)"""

from __future__ import annotations

import types

import pytest

from tsspec.runtime.scheduler import Scheduler, _Work, row_cost

PROFILE = ((1, 10.0), (4, 16.0), (8, 26.0))


def test_row_cost_interpolates_and_extrapolates():
    assert row_cost(None, 5) == 5.0
    assert row_cost(PROFILE, 1) == 10.0 and row_cost(PROFILE, 4) == 16.0
    assert row_cost(PROFILE, 6) == pytest.approx(21.0)
    assert row_cost(PROFILE, 12) == pytest.approx(36.0)


def _work(rows: int, all_logits: bool):
    handle = types.SimpleNamespace(trunk=types.SimpleNamespace(extra_cost_ms=-1.0))
    return _Work(handle, [1] * rows, all_logits, False, 0, 0.0)


def test_a_verify_is_charged_what_its_rows_cost_the_others():
    sched = object.__new__(Scheduler)  # only _charge is exercised: no target needed
    sched.target = types.SimpleNamespace(spec_verify_row_ms=PROFILE)
    verify, plain_a, plain_b, prefill = _work(4, True), _work(1, False), _work(1, False), _work(3, False)
    sched._charge([verify, plain_a, plain_b], 6, 42.0)
    # 6 rows cost 21, without the verify's 3 extra rows (3 rows) 14: a third of 42 ms, twice
    assert verify.handle.trunk.extra_cost_ms == pytest.approx(42.0 * 7.0 / 21.0 * 2)
    assert plain_a.handle.trunk.extra_cost_ms == 0.0
    sched._charge([verify], 4, 16.0)  # alone in its batch: nobody else pays
    assert verify.handle.trunk.extra_cost_ms == 0.0
    sched._charge([prefill, plain_a], 4, 16.0)  # prefill chunks are not charged
    assert prefill.handle.trunk.extra_cost_ms == 0.0
