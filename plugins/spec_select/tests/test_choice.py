"""MeasuredChoice on the exact toy with a fake clock: its pick follows the costs it measures
(not timings), it re-picks within a request and from the last one, and never changes a token."""

from __future__ import annotations

import pytest

from tsspec.runtime.generation import generate
from tsspec.runtime.options import SpeculationOptions
from tsspec.runtime.sampling import SamplingParams
from tsspec.testing import OracleSpeculator, RandomSpeculator, ToyTarget, assert_lossless, plain_tokens
from tsspec_select import MeasuredChoice
from tsspec_select.choice import PLAIN

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


class Clock:
    """Fake milliseconds: a forward of r rows costs ``base + per_row * (r - 1)``."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now / 1000.0

    def spend(self, ms: float) -> None:
        self.now += ms


def _timed_target(clock: Clock, per_row: float, base: float = 10.0) -> ToyTarget:
    target = ToyTarget()
    forward = target.spec_forward

    def timed(tokens, *args, **kwargs):
        clock.spend(base + per_row * (len(tokens) - 1))
        return forward(tokens, *args, **kwargs)

    target.spec_forward = timed
    return target


class Member:
    """The oracle's drafts (right with chance ~1 - corrupt), costing ``draft_ms`` a proposal;
    from ``switch_at`` on (a position) its drafts are all wrong."""

    can_arm_after_prefix_reuse = True

    def __init__(self, name, oracle, clock, *, draft_ms=0.5, tokens=3, switch_at=None, vocab=32):
        self.name, self.oracle, self.clock = name, oracle, clock
        self.draft_ms, self.tokens, self.switch_at, self.vocab = draft_ms, tokens, switch_at, vocab
        self.proposals = 0

    def propose(self, ctx):
        self.proposals += 1
        self.clock.spend(self.draft_ms)
        drafts = self.oracle.propose(ctx)[: self.tokens]
        if self.switch_at is not None and ctx.position >= self.switch_at:
            drafts = [(t + 1) % self.vocab for t in drafts]
        return drafts


def _run(target, choice, clock, n=96, sampling=None):
    return generate(target, PROMPT, SpeculationOptions(adaptive=False), max_tokens=n, sampling=sampling,
                    speculator=choice, clock=clock)


def _oracle(n=128, corrupt=0.0):
    return OracleSpeculator.from_plain_run(ToyTarget(), PROMPT, n, corrupt=corrupt)


def test_cheap_verify_rows_pick_the_member_that_lands():
    clock = Clock()
    target = _timed_target(clock, per_row=1.0)
    good, bad = Member("good", _oracle(), clock), Member("bad", _oracle(corrupt=1.0), clock)
    choice = MeasuredChoice({"good": good, "bad": bad}, clock=clock, probe_steps=4)
    gen = _run(target, choice, clock)
    assert gen.tokens == plain_tokens(ToyTarget(), PROMPT, 96)
    assert {c for _, c, _ in choice.picks} <= {"good", "good+bad"}
    assert choice.steps_by["bad"] <= 8 and choice.steps_by["bad"] < 0.25 * sum(choice.steps_by.values())  # probes only
    assert choice.gains()["good"] > 2.0 > 0.95 > choice.gains()["bad"]


def test_dear_verify_rows_keep_every_drafting_configuration_out():
    clock = Clock()
    target = _timed_target(clock, per_row=12.0)  # a row costs more than a plain step: nothing pays
    a, b = Member("a", _oracle(corrupt=0.5), clock), Member("b", _oracle(corrupt=0.5), clock)
    choice = MeasuredChoice({"a": a, "b": b}, clock=clock, probe_steps=4)
    _run(target, choice, clock)
    assert [c for _, c, _ in choice.picks] == [PLAIN]  # drafting runs only for its probes
    assert choice.steps_by[PLAIN] > 0.6 * sum(choice.steps_by.values())


def test_it_re_picks_within_a_request_when_the_running_member_stops_landing():
    clock = Clock()
    target = _timed_target(clock, per_row=1.0)
    fades = Member("fades", _oracle(), clock, draft_ms=0.2, switch_at=60)  # cheaper, until it stops landing
    steady = Member("steady", _oracle(), clock, draft_ms=3.0)
    choice = MeasuredChoice({"fades": fades, "steady": steady}, clock=clock, probe_steps=4)
    gen = _run(target, choice, clock, n=120)
    assert gen.tokens == plain_tokens(ToyTarget(), PROMPT, 120)
    picked = [c for _, c, _ in choice.picks]
    assert picked[0] in ("fades", "fades+steady") and picked[-1] == "steady"
    assert choice.picks[-1][0] < choice.step - 10  # it switched well before the request ended


def test_the_next_request_starts_from_the_last_ones_measured_gains():
    memory: dict = {}
    clock = Clock()
    for round_ in range(2):
        target = _timed_target(clock, per_row=1.0)
        good, bad = Member("good", _oracle(), clock), Member("bad", _oracle(corrupt=1.0), clock)
        choice = MeasuredChoice({"good": good, "bad": bad}, clock=clock, memory=memory, probe_steps=4)
        _run(target, choice, clock, n=60)
        if round_ == 0:
            assert memory["gain"]["good"] > 1.0 > memory["gain"]["bad"]
    assert choice.picks[0][0] == 0 and choice.picks[0][2] == "remembered from the last request"
    assert choice.picks[0][1] in ("good", "good+bad") and bad.proposals == 0


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=8, seed=11)],
                         ids=["greedy", "seeded"])
def test_the_choice_never_changes_the_output(sampling):
    def make(target):
        oracle = OracleSpeculator.from_plain_run(ToyTarget(), PROMPT, 48, sampling=sampling, corrupt=0.3)
        noise = RandomSpeculator(target.config.vocab_size, max_draft_tokens=2, seed=4)
        return MeasuredChoice({"oracle": oracle, "noise": noise}, probe_steps=2, first_gap=4)

    assert_lossless(ToyTarget, make, PROMPT, max_tokens=48, sampling=sampling)
    assert_lossless(ToyTarget, make, PROMPT, max_tokens=48, sampling=sampling,
                    options=SpeculationOptions(adaptive=True))


def test_members_see_every_commit_reset_and_close():
    seen = []

    class Noting:
        def __init__(self, name):
            self.name = name

        def propose(self, ctx):
            return []

        def commit(self, tokens, rows, start):
            seen.append((self.name, "commit"))

        def reset(self):
            seen.append((self.name, "reset"))

        def close(self):
            seen.append((self.name, "close"))

    choice = MeasuredChoice({"a": Noting("a"), "b": Noting("b")})
    choice.commit([1], None, 0)
    choice.reset()
    choice.close()
    assert seen == [("a", "commit"), ("b", "commit"), ("a", "reset"), ("b", "reset"), ("a", "close"), ("b", "close")]
    assert choice.candidates == ["a+b", "a", "b", PLAIN] and choice.name == "select"
    with pytest.raises(ValueError):
        MeasuredChoice({})
