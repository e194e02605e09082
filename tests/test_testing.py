"""The testing kit's helpers for sequences served at once: turns, recording, interleaving."""

from __future__ import annotations

import threading

import pytest

from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import (
    OracleSpeculator,
    TakingTurns,
    ToyTarget,
    WithoutViews,
    sequences_alone,
    sequences_interleaved,
)

OPTIONS = SpeculationOptions(adaptive=False, draft=4)
PROMPTS = ([3, 9, 1, 4, 7], [12, 2, 30, 5])


def test_taking_turns_alternates_the_two_sequences_calls():
    turns, order = TakingTurns(timeout_s=10), []

    def one(who):
        for _ in range(3):
            turns.run(who, order.append, who)
        turns.finish(who)

    threads = [threading.Thread(target=one, args=(who,)) for who in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 0, 1, 0, 1]


def test_a_finished_sequence_no_longer_holds_the_other_back():
    turns, order = TakingTurns(timeout_s=10), []
    turns.run(0, order.append, 0)
    turns.finish(0)
    for _ in range(3):  # would wait for sequence 0's turn without finish()
        turns.run(1, order.append, 1)
    assert order == [0, 1, 1, 1]


def test_a_turn_that_never_comes_fails_instead_of_running_both_at_once():
    turns = TakingTurns(timeout_s=0.05)
    with pytest.raises(TimeoutError, match="sequence 1"):
        turns.run(1, lambda: None)  # sequence 0 holds the turn and never finishes


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=5)])
def test_independent_speculators_draft_the_same_alone_and_interleaved(sampling):
    targets = (ToyTarget(seed=1), ToyTarget(seed=1))

    def make(target):
        prompt = PROMPTS[targets.index(target)]
        return OracleSpeculator.from_plain_run(ToyTarget(seed=1), prompt, 16, sampling=sampling, corrupt=0.3)

    alone = sequences_alone(targets, PROMPTS, make, OPTIONS, max_tokens=16, sampling=sampling)
    both = sequences_interleaved(targets, PROMPTS, make, OPTIONS, max_tokens=16, sampling=sampling)
    assert both == alone
    assert all(r["drafted"] > 0 and r["proposals"] for r in alone)


class LastCommitted:
    """A speculator whose state is the last token anybody committed: shared, it mixes sequences."""

    name = "last"
    needs_hidden_state = False

    def __init__(self):
        self.last = None

    def propose(self, ctx):
        return [] if self.last is None else [self.last]

    def commit(self, tokens, hidden_rows, start_pos):
        self.last = int(tokens[-1])

    def reset(self):
        pass


def test_one_shared_stateful_speculator_is_caught_mixing_the_sequences():
    targets = (ToyTarget(seed=2), ToyTarget(seed=2))
    alone = sequences_alone(targets, PROMPTS, lambda t: LastCommitted(), OPTIONS, max_tokens=12)
    shared = LastCommitted()
    both = sequences_interleaved(targets, PROMPTS, lambda t: shared, OPTIONS, max_tokens=12)
    assert [r["tokens"] for r in both] == [r["tokens"] for r in alone]  # lossless either way
    assert [r["proposals"] for r in both] != [r["proposals"] for r in alone]


def test_an_error_in_either_sequence_is_raised_by_the_caller():
    def make(target):
        raise RuntimeError("no speculator here")

    with pytest.raises(RuntimeError, match="no speculator here"):
        sequences_interleaved((ToyTarget(), ToyTarget()), PROMPTS, make, OPTIONS, max_tokens=4)


def test_without_views_hides_only_for_sequence():
    class Head:
        kind = "per_token"

        def for_sequence(self):
            return self

    hidden = WithoutViews(Head())
    assert hidden.kind == "per_token"
    assert not hasattr(hidden, "for_sequence")
