"""DraftEconomics: draft length from measured acceptance by position and cost by length."""

import pytest

from tsspec.runtime.economics import FIRST_PRIOR, DraftEconomics


def feed(econ, *, plain_ms, cost_by_length, accept, steps, length):
    """``steps`` plain samples and ``steps`` speculative steps of ``length`` drafts each, of
    which the first ``accept(i)`` land on step i."""
    for i in range(steps):
        econ.record_plain(plain_ms)
        econ.record_draft(length, accept(i), cost_by_length(length))


def test_no_evidence_gives_the_window_and_the_prior():
    econ = DraftEconomics()
    assert econ.best(8) == 8 and econ.best(1) == 1 and econ.best(0) == 0
    assert econ.acceptance(3) == pytest.approx([FIRST_PRIOR] * 3)
    assert econ.cost(2) is None and econ.gain(1) is None


def test_acceptance_counts_only_positions_that_were_verified():
    econ = DraftEconomics()
    econ.record_draft(2, 0, 10.0)  # position 1 rejected: position 2 never verified
    econ.record_draft(2, 1, 10.0)  # position 1 landed, position 2 rejected
    econ.record_draft(2, 2, 10.0)  # both landed
    econ.record_draft(1, 1, 10.0)  # one drafted, landed
    # position 1: 3 landed of 4 reached, plus one pseudo-sample of 0.5
    a1 = (3 + FIRST_PRIOR) / (4 + 1)
    # position 2: 1 landed of 2 reached, plus 2 pseudo-samples of a1
    a2 = (1 + 2 * a1) / (2 + 2)
    assert econ.acceptance(3) == pytest.approx([a1, a2, a2])
    assert econ.expected_tokens(2) == pytest.approx(1 + a1 + a1 * a2)


def test_cost_interpolates_and_extrapolates_from_measured_lengths():
    econ = DraftEconomics()
    econ.record_plain(10.0)
    assert econ.cost(3) == 10.0  # one measured point: flat
    econ.record_draft(1, 0, 12.0)
    assert econ.cost(3) == pytest.approx(16.0)  # the line through (0, 10) and (1, 12)
    econ.record_draft(4, 0, 20.0)
    assert econ.cost(2) == pytest.approx(12.0 + 8.0 / 3)  # between 1 and 4
    assert econ.cost(6) == pytest.approx(20.0 + 2 * 8.0 / 3)  # beyond 4: the last two points


def test_weak_drafter_drafts_one_token():
    """Acceptance 0.4 at every position; rows cost like the CPU path (2 rows 1.14x, then
    ~0.3x a row) plus 0.1x a draft step each: one token pays (1.4 / 1.24), two do not."""
    econ = DraftEconomics()
    cost = lambda k: 10.0 * (1 + 0.14 + 0.28 * (k - 1) + 0.1 * k)
    feed(econ, plain_ms=10.0, cost_by_length=lambda k: cost(k), accept=lambda i: int(i % 5 < 2), steps=40, length=2)
    econ.record_draft(1, 0, cost(1))
    econ.record_draft(1, 1, cost(1))
    assert econ.best(8) == 1
    assert econ.gain(1) > 1.0 > econ.gain(3)


def test_strong_drafter_opens_the_window():
    econ = DraftEconomics()
    cost = lambda k: 10.0 * (1 + 0.15 * k)
    feed(econ, plain_ms=10.0, cost_by_length=cost, accept=lambda i: 4 if i % 10 else 2, steps=30, length=4)
    econ.record_draft(1, 1, cost(1))
    assert econ.best(8) >= 4


def test_acceptance_is_forgotten_with_a_new_sequence_but_costs_are_kept():
    econ = DraftEconomics()
    feed(econ, plain_ms=10.0, cost_by_length=lambda k: 12.0, accept=lambda i: 0, steps=10, length=1)
    assert econ.acceptance(1)[0] < 0.1
    econ.forget_acceptance()
    assert econ.acceptance(1) == [FIRST_PRIOR] and econ.cost(1) == 12.0


def test_the_loop_drafts_the_length_that_pays_on_a_costed_toy():
    """A drafter landing 40% per token, each drafted token costing a tenth of a step, on the
    embedded model's verify-cost profile (virtual clock: deterministic). One token pays
    (1.4 tokens for ~1.19 steps), two pay less, four lose: the governor settles on one, beats
    plain and beats the fixed window of four."""
    from tsspec_bench.governor_check import CostProfileToy, VirtualClock
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.testing import OracleSpeculator

    clock = VirtualClock()
    target = CostProfileToy(base_ms=10.0, seed=3, recurrent=False, clock=clock, max_context=512)
    prompt = [5, 9, 2, 7, 1, 3, 8, 4]

    class CostlyOracle(OracleSpeculator):
        def propose(self, ctx):
            drafts = super().propose(ctx)
            clock.advance(0.001 * len(drafts))  # a head step per drafted token: 1 ms
            return drafts

    def run(adaptive):
        spec = CostlyOracle.from_plain_run(target, prompt, 300, corrupt=0.6, max_draft_tokens=4, seed=2)
        options = SpeculationOptions(spec_type="oracle", draft=4, adaptive=adaptive)
        return generate(target, prompt, options, max_tokens=300, speculator=spec, clock=clock).stats

    plain = generate(target, prompt, SpeculationOptions(enabled=False), max_tokens=300, clock=clock).stats
    sized, fixed = run(True), run(False)
    assert sized.draft_tokens / sized.drafts < 1.3  # mostly one token a step
    assert fixed.draft_tokens / fixed.drafts > 3
    assert sized.decode_ms < 0.95 * plain.decode_ms
    assert sized.decode_ms < fixed.decode_ms


def test_a_step_measured_at_zero_ms_is_never_a_divisor():
    econ = DraftEconomics()
    econ.record_plain(0.0)  # a clock that did not tick between two reads
    econ.record_draft(1, 1, 0.0)
    assert econ.cost(1) > 0 and econ.cost(3) > 0
    assert 1 <= econ.best(4) <= 4


# -- evidence keys -----------------------------------------------------------------------------


def costed(econ, plain_ms=10.0, per_token=1.5):
    """Measured costs: plain 10 ms, a draft of k tokens 10 + 1.5 k ms (lengths 1, 2 and 8)."""
    for _ in range(4):
        econ.record_plain(plain_ms)
    for k in (1, 2, 8):
        econ._add_cost(k, plain_ms + per_token * k)


def test_a_landing_key_opens_the_window_while_another_keys_drafts_are_declined():
    econ = DraftEconomics()
    costed(econ)
    for _ in range(20):
        econ.record_draft(8, 8, 22.0, evidence="span")  # inside a copied span: all land
        econ.record_draft(4, 0, 16.0, evidence="guess")  # new text: nothing lands
    assert econ.best(8, "span", decline=True) == 8
    assert econ.best(8, "guess", decline=True) == 0  # a plain step is worth more
    assert econ.best(8, "guess") == 1  # without decline the shortest draft is the least loss
    pooled = econ.acceptance(1)[0]
    assert econ.acceptance(1, "span")[0] > 0.9 > pooled > 0.1 > econ.acceptance(1, "guess")[0]
    assert econ.acceptance(2, "never seen") == econ.acceptance(2)  # an unknown key: the pool
    assert econ.samples("span") == 20 and econ.samples() == 40 and econ.samples("never seen") == 0


def test_length_zero_declines_only_against_a_measured_plain_step():
    econ = DraftEconomics()
    econ.record_draft(2, 0, 14.0, evidence="k")
    econ.record_draft(2, 0, 14.0, evidence="k")
    # no plain step measured: one measured length, flat cost, so any draft beats length 0
    assert econ.best(4, "k", decline=True) >= 1
    costed(econ)
    for _ in range(10):
        econ.record_draft(2, 0, 14.0, evidence="k")
    assert econ.best(4, "k", decline=True) == 0
    assert econ.best(0, "k", decline=True) == 0 and econ.best(1, "k", decline=True) == 0
    fresh = DraftEconomics()  # nothing measured at all: the window, never 0
    assert fresh.best(4, "k", decline=True) == 4


def test_a_key_with_few_samples_is_shrunk_toward_the_pooled_estimate():
    econ = DraftEconomics()
    for _ in range(30):
        econ.record_draft(1, 1, 12.0, evidence="a")  # the pool lands nearly always
    econ.record_draft(1, 0, 12.0, evidence="b")  # one miss of key b
    pooled = econ.acceptance(1)[0]
    b1 = econ.acceptance(1, "b")[0]
    assert b1 == pytest.approx((0 + 2 * pooled) / (1 + 2))  # two pseudo-samples of the pool
    for _ in range(30):
        econ.record_draft(1, 0, 12.0, evidence="b")
    assert econ.acceptance(1, "b")[0] < 0.5 * b1  # its own evidence dominates now


def test_per_key_tallies_roll_and_forget_with_the_sequence():
    from tsspec.runtime.economics import ACCEPT_SAMPLES, MAX_KEYS

    econ = DraftEconomics()
    for _ in range(ACCEPT_SAMPLES):
        econ.record_draft(3, 0, 12.0, evidence="k")
    for _ in range(ACCEPT_SAMPLES):
        econ.record_draft(3, 3, 12.0, evidence="k")  # the old misses roll out of the window
    rates = econ.acceptance(3, "k")
    assert min(rates) > 0.95 and econ.samples("k") == ACCEPT_SAMPLES
    for key in range(2 * MAX_KEYS):  # a drafter inventing keys cannot grow the tallies
        econ.record_draft(1, 0, 12.0, evidence=("invented", key))
    assert len(econ._keys) == MAX_KEYS and econ.samples() == ACCEPT_SAMPLES
    econ.forget_acceptance()
    assert econ.samples("k") == 0 and econ.acceptance(1, "k") == [FIRST_PRIOR] and econ.cost(3) == 12.0


def test_a_cost_shape_prices_every_length_from_the_median_step():
    """With the target's measured cost by rows, C(k) = scale * shape(k + 1), the scale being the
    median of ms / shape(rows) over the run's steps: untried lengths are priced by the shape
    and one slow step (a busy machine) moves no price."""
    from tsspec.cost_shape import parse_cost_shape

    shape = ((1, 10.0), (2, 12.0), (4, 20.0), (9, 40.0))
    econ = DraftEconomics(cost_shape=shape)
    for _ in range(5):
        econ.record_plain(5.0)  # the machine runs at half the shape's scale
        econ.record_draft(1, 1, 6.0)
    assert econ.cost(0) == pytest.approx(5.0) and econ.cost(3) == pytest.approx(10.0)
    assert econ.cost(8) == pytest.approx(20.0) and econ.cost(12) > econ.cost(8)  # past the last point
    econ.record_draft(3, 3, 400.0)  # one step stalled by another process
    assert econ.cost(3) == pytest.approx(10.0) and econ.cost(0) == pytest.approx(5.0)
    plain = DraftEconomics()  # without a shape: each length's own mean
    plain.record_plain(5.0)
    plain.record_draft(3, 3, 400.0)
    assert plain.cost(3) == 400.0
    # set later (as generate does), the steps already measured are rescaled too
    late = DraftEconomics()
    late.record_plain(5.0)
    late.set_cost_shape(shape)
    assert late.cost(8) == pytest.approx(20.0)
    for bad in (None, "1:2", ((2, 5.0), (4, 6.0)), ((1, 5.0),), ((1, 5.0), (2, -1.0)), ((1, 5.0), (1, 6.0)),
                ((1, 26.2), (2, 23.5), (3, 30.8))):  # 1 row dearer than 2: timed while another job ran
        assert parse_cost_shape(bad) is None
    noisy = DraftEconomics(cost_shape=((1, 26.2), (2, 23.5), (3, 30.8)))  # not used: each length's own mean
    noisy.record_plain(5.0)
    noisy.record_draft(3, 3, 400.0)
    assert noisy.cost(3) == 400.0


def test_generate_gives_the_governor_the_targets_measured_cost_by_rows(monkeypatch):
    from tsspec.runtime import generation
    from tsspec.testing import OracleSpeculator, ToyTarget

    seen = []
    real = generation.SpeculativeExecution

    def spy(*args, **kwargs):
        if kwargs["governor"].enabled:  # (the oracle's own plain run has none)
            seen.append(kwargs["governor"].economics._shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "SpeculativeExecution", spy)

    class Measured(ToyTarget):
        spec_verify_row_ms = ((1, 7.0), (2, 8.0), (9, 30.0))

    class Broken(ToyTarget):
        @property
        def spec_verify_row_ms(self):
            raise RuntimeError("no room to measure")

    for target in (Measured(), Broken(), ToyTarget()):
        spec = OracleSpeculator.from_plain_run(target, [1, 2, 3], 6)
        generation.generate(target, [1, 2, 3], max_tokens=6, speculator=spec)
    assert seen == [((1, 7.0), (2, 8.0), (9, 30.0)), None, None]
