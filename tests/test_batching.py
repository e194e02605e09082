"""The batched driver's pieces that need no model: the cost-by-rows interpolation and the verify
charge. (The driver on a real paged target: plugins/model_llama/tests/test_batched_serving.py.)"""

from __future__ import annotations

import types

import pytest

from tsspec.runtime.batching import BatchDriver, FreeBlocks, PlainTable, _Work, row_cost

PROFILE = ((1, 10.0), (4, 16.0), (8, 26.0))


def test_row_cost_interpolates_and_extrapolates():
    assert row_cost(None, 5) == 5.0
    assert row_cost(PROFILE, 1) == 10.0 and row_cost(PROFILE, 4) == 16.0
    assert row_cost(PROFILE, 6) == pytest.approx(21.0)
    assert row_cost(PROFILE, 12) == pytest.approx(36.0)


def _work(rows: int, all_logits: bool):
    trunk = types.SimpleNamespace(extra_cost_ms=-1.0)
    return _Work(trunk, [1] * rows, all_logits, False, 0, 0.0)


def test_a_verify_is_charged_what_its_rows_cost_the_others():
    driver = BatchDriver(types.SimpleNamespace(spec_verify_row_ms=PROFILE), None)
    verify, plain_a, plain_b, prefill = _work(4, True), _work(1, False), _work(1, False), _work(3, False)
    driver._charge([verify, plain_a, plain_b], 6, 42.0)
    # 6 rows cost 21, without the verify's 3 extra rows (3 rows) 14: a third of 42 ms, twice
    assert verify.trunk.extra_cost_ms == pytest.approx(42.0 * 7.0 / 21.0 * 2)
    assert plain_a.trunk.extra_cost_ms == 0.0
    driver._charge([verify], 4, 16.0)  # alone in its batch: nobody else pays
    assert verify.trunk.extra_cost_ms == 0.0
    driver._charge([prefill, plain_a], 4, 16.0)  # prefill chunks are not charged
    assert prefill.trunk.extra_cost_ms == 0.0


def test_plain_tables_take_consecutive_blocks_and_give_them_back():
    pool = FreeBlocks(6, 4)
    a, b = PlainTable(pool), PlainTable(pool)
    a.prepare_write(0, 5)  # two blocks
    b.prepare_write(0, 1)
    a.prepare_write(5, 9)  # a third: the one after a's last is taken, so the next free one
    assert a.blocks == [0, 1, 3] and b.blocks == [2]
    a.commit([1] * 9, 0)
    assert a.length == 9
    a.free()
    assert sorted(pool._free) == [0, 1, 3, 4, 5]
    b.prepare_write(1, 24)
    with pytest.raises(Exception, match="every KV block"):
        b.prepare_write(24, 25)


def test_generate_batched_refuses_a_target_without_a_paged_path():
    from tsspec.errors import GenerationError
    from tsspec.runtime.batching import generate_batched
    from tsspec.testing import ToyTarget

    with pytest.raises(GenerationError, match="no batched paged path"):
        generate_batched(ToyTarget(seed=1), [[1, 2]], max_tokens=2)
