"""SpeculationCostGovernor with synthetic costs: parks on loss, backs off, re-probes, holds a
win and drops it when it degrades. No clock is involved: costs are fed in directly."""

import pytest

from tsspec.runtime.governor import HOLD, PARKED, PROBE, SpeculationCostGovernor

PLAIN_MS = 10.0


def drive(gov, spec_ms_per_step, spec_tokens, steps):
    """Run ``steps`` loop steps: the governor chooses; we report the chosen step's cost."""
    choices = []
    for _ in range(steps):
        if gov.want_speculation():
            gov.record(True, spec_ms_per_step, spec_tokens)
            choices.append("S")
        else:
            gov.record(False, PLAIN_MS, 1)
            choices.append("P")
    return choices


def test_parks_when_speculation_loses():
    gov = SpeculationCostGovernor(min_samples=3, initial_backoff=8)
    # a verify step costs 14 ms and emits 1 token: 14 ms/token against 10 plain
    drive(gov, 14.0, 1, 20)
    assert gov.losses >= 1
    assert gov.state == PARKED or gov.parked_steps > 0


def test_holds_when_speculation_wins():
    gov = SpeculationCostGovernor(min_samples=3)
    choices = drive(gov, 14.0, 4, 60)  # 3.5 ms/token against 10
    assert gov.state == HOLD and gov.wins == 1 and gov.losses == 0
    # once won, almost every step speculates (plain refresh samples only now and then)
    assert choices[20:].count("S") >= 36


def test_backoff_doubles_and_reprobes():
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=64)
    parked_runs = []
    run = 0
    for _ in range(400):
        if gov.want_speculation():
            if run:
                parked_runs.append(run)
                run = 0
            gov.record(True, 30.0, 1)
        else:
            if gov.state == PARKED or gov.parked_left:
                run += 1
            gov.record(False, PLAIN_MS, 1)
    assert gov.losses >= 3
    # parked stretches grow geometrically until the cap
    long_runs = [r for r in parked_runs if r >= 4]
    assert long_runs == sorted(long_runs) and long_runs[-1] >= 16
    assert max(parked_runs) <= 64 + 1


def test_drops_a_degraded_win():
    gov = SpeculationCostGovernor(min_samples=3, window=8)
    drive(gov, 14.0, 4, 30)
    assert gov.state == HOLD
    drive(gov, 40.0, 1, 40)  # acceptance collapsed: 40 ms/token
    assert gov.losses >= 1 and gov.state in (PARKED, PROBE)


def test_empty_proposals_count_against_speculation():
    gov = SpeculationCostGovernor(min_samples=3)
    for _ in range(30):
        if gov.want_speculation():
            gov.record_empty_proposal(2.0)  # a drafter that finds nothing but costs 2 ms
            gov.record(True, 12.0, 1)  # and its rare verifies barely break even
        else:
            gov.record(False, PLAIN_MS, 1)
    assert gov.losses >= 1


def test_reset_reprobes_but_keeps_baseline():
    gov = SpeculationCostGovernor(min_samples=3, initial_backoff=8)
    drive(gov, 30.0, 1, 20)
    assert gov.losses >= 1
    plain_samples = gov.plain.count
    gov.reset()
    assert gov.state == PROBE and gov.parked_left == 0 and gov.plain.count == plain_samples
    assert gov.want_speculation()


def test_disabled_governor_always_speculates():
    gov = SpeculationCostGovernor(enabled=False)
    assert all(drive(gov, 100.0, 1, 50)[i] == "S" for i in range(50))
    assert gov.losses == 0 and gov.parked_steps == 0


def test_first_sample_of_each_side_is_discarded():
    gov = SpeculationCostGovernor(min_samples=1)
    gov.record(True, 1000.0, 1)  # warm-up outlier
    gov.record(False, 1000.0, 1)
    assert gov.spec.count == 0 and gov.plain.count == 0


def test_probes_draft_short_until_a_draft_lands():
    """A probe caps drafts at probe_draft until a speculative step lands a drafted token; a
    won state and a disabled governor do not cap; a re-probe after a park caps again."""
    g = SpeculationCostGovernor(probe_draft=2, min_samples=2)
    assert g.draft_limit(8) == 2 and g.draft_limit(1) == 1
    g.record(True, 10.0, 1)  # bonus token only: nothing landed
    assert g.draft_limit(8) == 2
    g.record(True, 10.0, 3)  # two drafted tokens landed
    assert g.draft_limit(8) == 8
    g._park()
    for _ in range(g.parked_left + 1):  # the park runs out; the next question re-probes
        g.want_speculation()
    assert g.state == "probe" and g.draft_limit(8) == 2
    assert SpeculationCostGovernor(enabled=False).draft_limit(8) == 8
    held = SpeculationCostGovernor()
    held.state = "hold"
    assert held.draft_limit(8) == 8


def test_the_rolling_window_keeps_its_totals_as_samples_come_and_go():
    """count and ms per token equal the sums over the samples held, through warm-up, eviction
    and clearing."""
    import random

    from tsspec.runtime.governor import _Window

    rng = random.Random(7)
    w = _Window(5)
    for i in range(200):
        if i % 37 == 36:
            w.clear()
        w.add(rng.uniform(0.1, 20.0), rng.choice([0, 0, 1, 2, 5]))
        tokens = sum(t for _, t in w.samples)
        assert w.count == sum(1 for _, t in w.samples if t > 0)
        assert w.ms_per_token == (None if tokens == 0 else sum(ms for ms, _ in w.samples) / tokens)


def test_generation_governs_every_speculator_and_plain_decoding_not_at_all(monkeypatch):
    from tsspec.runtime import generation
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.testing import ToyTarget

    seen = []

    class Lookup:
        name = "lookup"

        def propose(self, ctx):
            return []

    real = generation.SpeculativeExecution

    def spy(*args, **kwargs):
        seen.append(kwargs["governor"].enabled)
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "SpeculativeExecution", spy)
    generation.generate(ToyTarget(), [1, 2, 3], max_tokens=2, speculator=Lookup())
    generation.generate(ToyTarget(), [1, 2, 3], SpeculationOptions(adaptive=False), max_tokens=2, speculator=Lookup())
    generation.generate(ToyTarget(), [1, 2, 3], SpeculationOptions(enabled=False), max_tokens=2)
    assert seen == [True, False, False]


def test_costly_empty_attempts_park_a_probe_and_cheap_ones_do_not():
    """Empty attempts count as zero-accept steps by their cost: each plain step's worth of
    draft milliseconds is one. A head gated shut (4 ms an attempt, plain 10 ms) parks after
    five attempts at the first probe's limit of two; a lookup that finds nothing (0.01 ms)
    never does."""
    def probe(attempt_ms, attempts):
        g = SpeculationCostGovernor(zero_accept_limit=2)
        for _ in range(3):
            g.record(False, PLAIN_MS, 1)  # a baseline (the first sample is warm-up)
        for _ in range(attempts):
            if not g.want_speculation():
                break
            g.record_empty_proposal(attempt_ms)
            g.record(False, PLAIN_MS, 1)
        return g

    costly = probe(4.0, 40)
    assert costly.state == PARKED and costly.losses == 1
    cheap = probe(0.01, 40)
    assert cheap.state == PROBE and cheap.losses == 0


def test_a_lost_park_carries_to_the_next_sequence_for_drafters_with_weights_only():
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec.testing import RandomSpeculator, ToyTarget

    reg = SpeculatorRegistry()
    make = lambda t, o: RandomSpeculator(t.config.vocab_size, max_draft_tokens=3, seed=1)
    reg.register("learned", make, requires_draft_head=False, weight_free=False)
    reg.register("lookup", make, requires_draft_head=False, weight_free=True)
    target, prompt = ToyTarget(), [3, 1, 4, 1, 5]
    first = generate(target, prompt, SpeculationOptions(spec_type="learned"), max_tokens=40, registry=reg)
    carried = reg.memory(target, "loop:learned").get("park")
    assert first.stats.governor_losses >= 1 and carried is not None  # random drafts never win
    second = generate(target, prompt, SpeculationOptions(spec_type="learned"), max_tokens=40, registry=reg)
    assert second.tokens == first.tokens
    assert second.stats.drafts < first.stats.drafts  # it started parked
    generate(target, prompt, SpeculationOptions(spec_type="lookup"), max_tokens=40, registry=reg)
    assert reg.memory(target, "loop:lookup") == {}  # weight-free: every prompt probes afresh
    # a disabled governor neither reads nor writes the memory
    off = generate(target, prompt, SpeculationOptions(spec_type="learned", adaptive=False), max_tokens=40, registry=reg)
    assert off.stats.governor_parked_steps == 0


def test_a_clock_that_never_ticks_changes_nothing():
    """Every step measured at 0 ms (a frozen or coarse clock): no division by zero, output ==
    plain, greedy and seeded."""
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.runtime.sampling import SamplingParams
    from tsspec.testing import OracleSpeculator, ToyTarget, plain_tokens

    target, prompt = ToyTarget(), [3, 1, 4, 1, 5, 9, 2, 6]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, top_k=8, seed=11)):
        want = plain_tokens(target, prompt, 60, sampling)
        oracle = OracleSpeculator.from_plain_run(target, prompt, 60, sampling=sampling, corrupt=0.5)
        got = generate(target, prompt, SpeculationOptions(), max_tokens=60, sampling=sampling, speculator=oracle,
                       clock=lambda: 0.0)
        assert got.tokens == want


def test_a_park_that_ran_out_carries_its_backoff():
    """A sequence that ends parked with no parked steps left (the next step would re-probe):
    the next sequence re-probes at once, as a re-probe, with the backoff still grown (x4: the
    probe landed nothing)."""
    first = SpeculationCostGovernor(min_samples=2, initial_backoff=4)
    first._park()
    while first.parked_left:
        assert not first.want_speculation()
    carried = first.carry_over()
    assert carried == (0, 16)
    second = SpeculationCostGovernor(min_samples=2, initial_backoff=4)
    second.carried = carried
    second.reset()
    assert second.want_speculation() and second.state == PROBE and second.reprobing
    second.record(True, 30.0, 1)  # a re-probe that lands nothing parks at once, for the grown backoff
    assert second.state == PARKED and second.parked_left == 16 and second.backoff == 64


# -- calibrated (confidence-carrying) steps -----------------------------------------------------


def test_calibrated_zero_accept_streaks_do_not_park_but_uncalibrated_ones_do():
    """A bursty drafter: three misses, then three steps landing four drafts each, over and
    over. Without confidence, the first two misses in a row park it; with it, the streaks are
    the per-bucket sizing's business and the drafting, which wins overall, holds."""

    def bursty(confident):
        g = SpeculationCostGovernor(min_samples=3)
        for step in range(120):
            if not g.want_speculation():
                g.record(False, PLAIN_MS, 1)
            elif step % 6 < 3:
                g.record(True, 12.0, 1, drafted=1, confidence=[0.5] if confident else None)
            else:
                g.record(True, 16.0, 5, drafted=4, confidence=[0.9] * 4 if confident else None)
        return g

    unkeyed, keyed = bursty(None), bursty(True)
    assert unkeyed.losses >= 1 and unkeyed.parked_steps > 0
    assert keyed.losses == 0 and keyed.parked_steps == 0 and keyed.state == HOLD


def test_calibrated_drafting_still_parks_when_it_loses_by_measured_cost():
    g = SpeculationCostGovernor(min_samples=3)
    for _ in range(40):
        if g.want_speculation():
            g.record(True, 14.0, 1, drafted=2, confidence=[0.9, 0.9])  # 14 ms a token against 10
        else:
            g.record(False, PLAIN_MS, 1)
    assert g.losses >= 1 and g.parked_steps > 0


# -- probes that back off, and the park's countdown ---------------------------------


def _park_lengths(gov, steps, spec_ms, spec_tokens):
    """Drive ``steps`` steps of a drafter that costs ``spec_ms`` for ``spec_tokens`` tokens a
    verify; returns the length of each parked stretch."""
    lengths, run = [], 0
    for _ in range(steps):
        if gov.want_speculation():
            if run:
                lengths.append(run)
                run = 0
            gov.record(True, spec_ms, spec_tokens)
        else:
            if gov.state == PARKED or gov.parked_left:
                run += 1
            gov.record(False, PLAIN_MS, 1)
    return lengths


def test_a_probe_that_landed_nothing_grows_the_next_park_four_times_up_to_the_cap():
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=64)
    # every verify keeps only its bonus token: each probe lands nothing
    assert _park_lengths(gov, 400, 12.0, 1)[:5] == [4, 16, 64, 64, 64]
    assert gov.wins == 0 and gov.backoff == 64


def test_a_probe_that_landed_but_lost_doubles_the_next_park():
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=64)
    # every verify lands a draft (2 tokens) but costs 30 ms: 15 ms a token against 10 plain
    lengths = _park_lengths(gov, 600, 30.0, 2)
    assert lengths[:5] == [4, 8, 16, 32, 64] and gov.backoff == 64


def test_a_middling_drafter_whose_reprobe_misses_keeps_doubling():
    """x4 needs a sequence in which nothing ever landed: a drafter that landed drafts but
    loses, then misses on a one-step re-probe, grows its park x2, not x4."""
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=4096)
    # lands drafts, loses on cost: parks 4, 8, 16, and 17 steps into the park of 32
    assert _park_lengths(gov, 60, 30.0, 2) == [4, 8, 16] and gov.landed and gov.backoff == 64
    # now every re-probe misses: the park ends (its 15 steps left), then 64, 128, 256
    assert _park_lengths(gov, 600, 12.0, 1)[:4] == [15, 64, 128, 256]
    gov.reset()  # a new sequence: nothing has landed in it yet
    assert not gov.landed and _park_lengths(gov, 400, 12.0, 1)[:3] == [4, 16, 64]


def test_a_win_resets_the_backoff():
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=64)
    _park_lengths(gov, 40, 12.0, 1)  # two landless losses: the backoff has grown
    assert gov.losses >= 2 and gov.backoff > 4
    for _ in range(200):  # the drafter turns good: 3 tokens for 12 ms
        if gov.want_speculation():
            gov.record(True, 12.0, 3)
        else:
            gov.record(False, PLAIN_MS, 1)
        if gov.state == HOLD:
            break
    assert gov.state == HOLD and gov.wins == 1 and gov.backoff == 4
    gov.record(True, 40.0, 1)  # it degrades again: parked for the initial backoff
    for _ in range(8):
        gov.record(True, 40.0, 1)
    assert gov.state == PARKED and gov.parked_left == 4


def test_a_drafter_that_loses_then_wins_is_not_held_back():
    """The backoff never outgrows its cap: a drafter that loses its first 60 steps and then wins
    is back to speculating within the cap's length, and keeps speculating."""
    gov = SpeculationCostGovernor(initial_backoff=24, max_backoff=128)
    choices = []
    for step in range(600):
        good = step >= 60
        if gov.want_speculation():
            gov.record(True, 12.0, 4 if good else 1)
            choices.append("S")
        else:
            gov.record(False, PLAIN_MS, 1)
            choices.append("P")
    first_hold = choices.index("S", 60 + 128 + 8)  # after at most one full park
    assert gov.state == HOLD and gov.wins >= 1
    assert choices[first_hold:].count("S") >= 0.9 * len(choices[first_hold:])


def test_empty_attempts_before_the_baseline_count_once_it_exists():
    """A drafter gated shut from the first step: its attempts before a plain baseline exists are
    not forgotten; the first baseline sample turns them into failed drafts."""
    gov = SpeculationCostGovernor()
    gov.record_empty_proposal(9.0)
    gov.record(False, PLAIN_MS, 1)  # warm-up sample: discarded, no baseline yet
    gov.record_empty_proposal(9.0)
    assert gov.state == PROBE and gov.zero_run == 0 and gov.wasted_ms == 18.0
    gov.record(False, PLAIN_MS, 1)  # the baseline: 18 ms of attempts = one failed draft
    assert gov.zero_run == 1 and gov.state == PROBE
    gov.record_empty_proposal(9.0)  # 17 ms: the second failed draft parks
    assert gov.state == PARKED and gov.losses == 1


def test_calibrated_drafting_backs_off_by_doubling():
    """Confidence-sized drafting parks only by measured cost, and its park doubles even when the
    probe landed nothing: its per-bucket declines already cut the losing drafts."""
    gov = SpeculationCostGovernor(min_samples=2, initial_backoff=4, max_backoff=64)
    lengths, run = [], 0
    for _ in range(300):
        if gov.want_speculation():
            if run:
                lengths.append(run)
                run = 0
            assert gov.size_proposal(1, [0.5]) in (0, 1)
            gov.record(True, 30.0, 1, drafted=1, confidence=[0.5])
        else:
            if gov.state == PARKED or gov.parked_left:
                run += 1
            gov.record(False, PLAIN_MS, 1)
    assert gov.calibrated and lengths[:4] == [4, 8, 16, 32]


# -- confidence-sized proposals (a learned drafter decides each step by its worth) ------


def _confident_run(sure, *, head_ms=0.5, n=300, prompt=(5, 9, 2, 7, 1, 3, 8, 4), seed=5, sampling=None, pmin=0.5):
    """A drafter on the embedded model's cost profile (virtual clock) that proposes with
    confidence: ``sure(position)`` -> (right?, confidence) for the token at that position; each
    drafted token costs ``head_ms`` (a head call) and the chain stops after the first token under
    ``pmin``. Returns (its generation, plain's)."""
    from tsspec_bench.governor_check import CostProfileToy, VirtualClock
    from tsspec.protocols import Proposal
    from tsspec.runtime.generation import generate
    from tsspec.runtime.options import SpeculationOptions
    from tsspec.testing import OracleSpeculator

    clock = VirtualClock()
    target = CostProfileToy(base_ms=10.0, seed=seed, recurrent=False, clock=clock, max_context=512)

    class Confident(OracleSpeculator):
        def propose(self, ctx):
            p, drafts, confidence = ctx.position, [], []
            for i, truth in enumerate(self.sequence[p + 1 : p + 1 + ctx.max_tokens]):
                clock.advance(head_ms / 1000.0)
                right, c = sure(p + 1 + i)
                drafts.append(truth if right else (truth + 1) % self.vocab_size)
                confidence.append(c)
                if c < pmin:  # its own gate (MinDraftProb) ends the chain; the loop sizes the rest
                    break
            return Proposal(drafts, confidence=confidence)

    spec = Confident.from_plain_run(target, list(prompt), n, max_draft_tokens=8, sampling=sampling)
    options = SpeculationOptions(spec_type="oracle", draft=8)
    run = generate(target, list(prompt), options, max_tokens=n, speculator=spec, clock=clock, sampling=sampling)
    plain = generate(target, list(prompt), SpeculationOptions(enabled=False), max_tokens=n, clock=clock,
                     sampling=sampling)
    return run, plain


def test_size_proposal_by_confidence_keeps_the_sure_and_declines_the_unsure():
    gov = SpeculationCostGovernor(cost_shape=((1, 10.0), (2, 12.0), (3, 14.0), (9, 26.0)))
    for _ in range(6):
        gov.record(False, PLAIN_MS, 1)
    for _ in range(12):  # the run's evidence: ~0.9 lands, ~0.3 does not
        gov.record(True, 12.0, 2, drafted=1, confidence=[0.93])
        gov.record(True, 12.0, 1, drafted=1, confidence=[0.33])
    assert gov.state != PARKED
    assert gov.size_proposal(3, [0.93, 0.94, 0.92]) == 3 and gov.calibrated
    assert gov.size_proposal(3, [0.93, 0.33, 0.92]) == 1
    declined = gov.declined
    assert gov.size_proposal(2, [0.33, 0.93]) == 0 and gov.declined == declined + 1


def test_a_declined_confidence_bucket_is_retried_now_and_then():
    gov = SpeculationCostGovernor(cost_shape=((1, 10.0), (2, 12.0)), explore_after=4)
    for _ in range(6):
        gov.record(False, PLAIN_MS, 1)
    for _ in range(10):
        gov.record(True, 12.0, 1, drafted=1, confidence=[0.15])
    sizes = [gov.size_proposal(1, [0.15]) for _ in range(12)]
    assert sizes.count(0) >= 9 and 1 in sizes


@pytest.mark.parametrize("sampling", [None, "seeded"])
def test_a_drafter_whose_confidence_is_informative_wins_and_is_not_parked(sampling):
    """Right and sure inside 16-token spans, wrong and unsure (0.3) between them: its unsure
    drafts are declined, its sure ones verified in long chains, drafting is never parked, and
    decoding beats plain (virtual clock, the embedded model's verify cost profile). Output is
    plain decoding's, greedy and sampled."""
    from tsspec.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=20, seed=3) if sampling else None
    in_span = lambda pos: (pos // 16) % 2 == 0
    run, plain = _confident_run(lambda pos: (True, 0.95) if in_span(pos) else (False, 0.3), sampling=params)
    assert run.tokens == plain.tokens
    assert run.stats.governor_losses == 0 and run.stats.governor_parked_steps == 0
    assert run.stats.declined_drafts > 50
    assert run.stats.tokens_per_verify > 3.0 and run.stats.acceptance_rate > 0.8
    assert run.stats.decode_ms < 0.75 * plain.stats.decode_ms  # half the tokens lie between spans


def test_a_drafter_whose_every_bucket_loses_is_parked():
    """Always wrong, at confidences spread over [0, 1]: the calibration learns that no bucket
    lands, its proposals are declined and their head calls park drafting; decoding stays within
    3% of plain."""
    run, plain = _confident_run(lambda pos: (False, ((pos * 37) % 100) / 100.0), head_ms=1.0)
    assert run.tokens == plain.tokens and run.stats.accepted_tokens == 0
    assert run.stats.governor_losses >= 1 and run.stats.governor_parked_steps > 0.5 * len(run.tokens)
    assert run.stats.decode_ms <= plain.stats.decode_ms / 0.97


@pytest.mark.parametrize("verify_ms, verdict", [(16.0, HOLD), (21.0, PARKED)])
def test_a_landed_probe_of_mostly_declined_attempts_still_gets_a_verdict(verify_ms, verdict):
    """calibrated_samples counts verified steps in the rolling window; where most attempts are
    declined (empty, costing the head's milliseconds) the window fills before twelve verified
    steps: the probe is then judged at min_samples, not left in PROBE without a verdict."""
    gov = SpeculationCostGovernor(cost_shape=((1, 10.0), (2, 12.0)), window=16)
    for _ in range(6):
        gov.record(False, PLAIN_MS, 1)
    gov.size_proposal(1, [0.9])
    gov.record(True, 12.5, 2, drafted=1, confidence=[0.9])  # the warm-up sample
    steps = 0
    while gov.state == PROBE and steps < 200:
        steps += 1
        if steps % 5 == 0:  # one verified step in five, landing its draft
            assert gov.size_proposal(1, [0.9]) == 1
            gov.record(True, verify_ms, 2, drafted=1, confidence=[0.9])
        else:  # declined: the head's call is spent, a plain step emits
            gov.record_empty_proposal(0.2)
            gov.record(False, PLAIN_MS, 1)
    assert gov.landed and gov.state == verdict and steps < 40


@pytest.mark.parametrize("samples", [4, 12])
def test_a_calibrated_drafter_near_break_even_gets_a_fair_trial(samples):
    """Confidence-sized steps are the ones worth verifying, so a probe sits near break-even:
    four unlucky landings park it at min_samples, twelve give it the verdict its landing earns."""
    gov = SpeculationCostGovernor(cost_shape=((1, 10.0), (2, 12.0)), calibrated_samples=samples)
    for _ in range(6):
        gov.record(False, PLAIN_MS, 1)
    for tokens in [2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2]:  # the first is the warm-up sample
        if gov.state == PARKED:
            break
        assert gov.size_proposal(1, [0.9]) == 1
        gov.record(True, 12.5, tokens, drafted=1, confidence=[0.9])
    assert gov.state == (PARKED if samples == 4 else HOLD)


def test_one_stalled_step_does_not_park_a_win():
    """Under a competing load one verify can take twenty times its usual time (a descheduled
    thread); a win of 7.5 against 10 ms a token is held all the same: the step counts at most
    STALL_CAP times the median step (counted whole, it made the probe's 29 steps lose)."""
    gov = SpeculationCostGovernor(min_samples=4)
    spec_steps = 0
    for _ in range(80):
        if gov.want_speculation():
            spec_steps += 1
            gov.record(True, 600.0 if spec_steps == 12 else 30.0, 4)
        else:
            gov.record(False, PLAIN_MS, 1)
    assert gov.wins == 1 and gov.losses == 0 and gov.state == HOLD


def test_an_early_verdict_needs_every_sample_to_agree():
    """Two samples a side decide early only when every speculative sample loses (or wins) to
    every plain one by the decisive ratio: one stalled plain step makes no early verdict."""
    gov = SpeculationCostGovernor(min_samples=4)
    for ms in (10.0, 10.0, 10.0):  # the first is the discarded warm-up
        gov.plain.add(ms, 1)
    for ms in (25.0, 25.0, 25.0):  # 25 ms a token against 10: lopsided
        gov.spec.add(ms, 1)
    gov._decide()
    assert gov.state == PARKED
    gov = SpeculationCostGovernor(min_samples=4)
    for ms in (10.0, 10.0, 100.0):  # one stalled plain step
        gov.plain.add(ms, 1)
    for ms in (25.0, 25.0, 25.0):
        gov.spec.add(ms, 1)
    gov._decide()
    assert gov.state == PROBE and gov.wins == gov.losses == 0
