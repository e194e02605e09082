"""Speculation priced for the batch: the test of ``pays`` and the governor that applies it."""

from __future__ import annotations

from tsspec_serve.batch_pricing import BatchCosts, BatchGovernor, pays


def _costs(points) -> BatchCosts:
    costs = BatchCosts()
    for rows, ms in points:
        for _ in range(3):
            costs.record(rows, ms)
    return costs


def test_costs_come_from_measured_forwards_only():
    assert BatchCosts().cost(8) is None  # nothing measured, no target to ask
    costs = _costs([(1, 10.0), (8, 34.0)])
    assert costs.cost(1) == 10.0 and costs.cost(8) == 34.0 and costs.cost(12) > 34.0
    assert pays(BatchCosts(), 8, 4, 0.5) is None  # unknown costs: no verdict


def test_wide_rows_pay_alone_but_not_in_a_full_batch_at_low_acceptance():
    costs = _costs([(1, 10.0), (2, 13.0), (8, 34.0), (12, 46.0)])
    assert pays(costs, 1, 4, 1.0)  # alone: the ordinary governor's business
    # 8 streams: 4 drafts add 12 ms to a 34 ms batch of 8 tokens; they must land 12 * 8 / 34 = 2.8
    assert not pays(costs, 8, 4, 1.0)
    assert pays(costs, 8, 4, 3.0)


def test_the_governor_refuses_for_the_batch_and_retries_after_a_backoff():
    costs = _costs([(1, 10.0), (8, 34.0), (12, 46.0)])
    streams = [8]
    governor = BatchGovernor(costs, lambda: streams[0])
    assert governor.want_speculation()  # no verify yet: nothing to price
    governor.record(True, 30.0, 2, drafted=4)  # one landed of four
    answers = [governor.want_speculation() for _ in range(6)]
    assert answers[:4] == [False] * 4 and answers[4] is True  # four refused, then one re-try
    assert governor.batch_refusals >= 4
    streams[0] = 1  # alone again: only the ordinary governor decides
    assert all(governor.want_speculation() for _ in range(3)) or governor.state != "probe"


def test_a_disabled_governor_never_refuses():
    governor = BatchGovernor(_costs([(1, 10.0), (8, 34.0), (12, 46.0)]), lambda: 8, enabled=False)
    governor.record(True, 30.0, 1, drafted=4)
    assert all(governor.want_speculation() for _ in range(10))
