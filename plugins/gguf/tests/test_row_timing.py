"""tsspec_gguf.row_timing: a forward's cost by rows timed as ratios to the one-row forward of
the same round, medians over rounds, monotone whatever the timings said."""

from __future__ import annotations

import pytest

from tsspec_gguf.row_timing import ROUNDS, RowTiming, monotone, time_rows


class FakeForwards:
    """Forwards whose cost is ``base[n] * load[round]`` on a clock that only they advance."""

    def __init__(self, base: dict[int, float], load=lambda i: 1.0):
        self.base, self.load, self.now, self.calls, self.resets = base, load, 0.0, [], 0
        self.round = -1  # the measurer's warm-up round first

    def clock(self) -> float:
        return self.now

    def forward(self, n: int) -> None:
        self.calls.append(n)
        self.now += self.base[n] * self.load(self.round) / 1000.0  # seconds
        if len(self.calls) % len(self.base) == 0:
            self.round += 1

    def reset(self) -> None:
        self.resets += 1


def test_widths_are_timed_in_alternating_rounds_after_a_warm_up_round():
    fake = FakeForwards({1: 10.0, 2: 12.0, 4: 20.0})
    timing = time_rows(fake.forward, (4, 2), rounds=3, reset=fake.reset, clock=fake.clock)
    assert fake.calls == [4, 2, 1] + [1, 2, 4] + [4, 2, 1] + [1, 2, 4]  # warm-up (not kept), then alternating
    assert fake.resets == len(fake.calls)  # every forward's rows dropped again
    assert timing.rounds == 3 and timing.one_row_ms == pytest.approx(10.0)
    assert dict(timing.ratios) == pytest.approx({1: 1.0, 2: 1.2, 4: 2.0})
    assert timing.profile() == ((1, 10.0), (2, 12.0), (4, 20.0))


def test_a_busy_round_moves_neither_the_ratios_nor_the_one_row_median():
    """A round slowed by another job as a whole keeps its ratios; the one-row time is a median."""
    fake = FakeForwards({1: 10.0, 2: 11.0, 3: 13.0}, load=lambda i: 3.0 if i in (1, 4) else 1.0)
    timing = time_rows(fake.forward, (2, 3), rounds=ROUNDS, clock=fake.clock)
    assert timing.one_row_ms == pytest.approx(10.0)
    assert dict(timing.ratios) == pytest.approx({1: 1.0, 2: 1.1, 3: 1.3})


def test_the_profile_is_monotone_whatever_the_timings_said():
    fake = FakeForwards({1: 10.0, 2: 9.0, 3: 14.0, 4: 13.0})  # 2 rows "cheaper" than 1, 4 than 3
    timing = time_rows(fake.forward, (2, 3, 4), rounds=3, clock=fake.clock)
    assert dict(timing.ratios) == pytest.approx({1: 1.0, 2: 1.0, 3: 1.4, 4: 1.4})
    profile = timing.profile()
    assert all(b >= a for (_, a), (_, b) in zip(profile, profile[1:]))


def test_monotone_sorts_and_raises_each_cost_to_the_largest_before_it():
    assert monotone([(3, 1.2), (1, 1.0), (2, 1.3), (4, 1.5)]) == ((1, 1.0), (2, 1.3), (3, 1.3), (4, 1.5))
    assert monotone([]) == ()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        time_rows(lambda n: None, (2,), rounds=0)
    with pytest.raises(ValueError, match="at least 1 row"):
        time_rows(lambda n: None, (0, 2))


def test_row_timing_is_a_public_toolkit_module():
    import tsspec_gguf

    assert "row_timing" in tsspec_gguf.__all__
    assert RowTiming(one_row_ms=2.0, ratios=((1, 1.0), (3, 1.5)), rounds=1).profile() == ((1, 2.0), (3, 3.0))


def test_the_docstring_examples_hold():
    import doctest

    from tsspec_gguf import row_timing

    result = doctest.testmod(row_timing)
    assert result.attempted > 0 and result.failed == 0
