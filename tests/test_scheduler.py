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


def test_a_target_without_a_paged_path_is_served_one_sequence_at_a_time():
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec.runtime.scheduler import CANCELLED, FINISHED, SequenceRequest
    from tsspec.testing import RandomSpeculator, ToyTarget, plain_tokens

    target = ToyTarget(seed=3)
    registry = SpeculatorRegistry()
    registry.register("random", lambda t, o: RandomSpeculator(32, seed=2), requires_draft_head=False)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    expected = [plain_tokens(ToyTarget(seed=3), p, 12) for p in prompts]
    with Scheduler(target, registry=registry) as sched:
        assert sched.serial and sched.max_seqs == 1
        handles = [sched.submit_request(SequenceRequest(p, 12, options=SpeculationOptions(spec_type="random", adaptive=False)))
                   for p in prompts]
        holder = {}
        seen = []

        def on_token(tok, piece):
            seen.append(tok)
            if len(seen) == 2:
                sched.cancel(holder["h"])

        holder["h"] = sched.submit_request(SequenceRequest([3, 3, 3], 50, on_token=on_token))
        for h in handles + [holder["h"]]:
            assert h.wait(60)
        assert [h.result.tokens for h in handles] == expected
        assert [h.state for h in handles] == [FINISHED] * 3 and holder["h"].state == CANCELLED
        snap = sched.snapshot()
        assert snap["kv_blocks_total"] == 0 and snap["finished"][CANCELLED] == 1 and snap["running"] == 0
