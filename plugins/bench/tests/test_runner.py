"""The paired runner on the exact toy: alternation order, pairing, summaries, lossless check."""

from __future__ import annotations

import itertools

import pytest
import torch

from tsspec_bench.lossless import IDENTICAL, MISMATCH, TIE, check_lossless, first_divergence
from tsspec_bench.prompts import EncodedCase, PromptCase
from tsspec_bench.runner import WARMUP_REP, BenchConfig, BenchRunner, schedule
from tsspec_bench.summary import ALL_CLASSES, pair_ratios, summarise
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget



def _cases(target, n=2, prompt_len=24, max_tokens=20, classes=("a", "b")):
    out = []
    for i in range(n):
        ids = tuple((7 * i + 3 * j) % target.config.vocab_size for j in range(prompt_len))
        out.append(EncodedCase(PromptCase(f"case-{i}", classes[i % len(classes)], max_tokens, prompt="x", chat=False), ids, max_tokens))
    return out


def test_schedule_alternates_the_order_of_configs_every_round_after_a_warmup():
    slots = schedule(2, 3, 3)
    warm = [s for s in slots if s.rep == WARMUP_REP]
    assert [(s.case, s.config) for s in warm] == [(0, 0), (0, 1), (0, 2)]
    timed = [(s.case, s.rep, s.config) for s in slots if s.rep != WARMUP_REP]
    order = {0: [0, 1, 2], 1: [2, 1, 0], 2: [0, 1, 2]}
    assert timed == [(c, r, k) for c in range(2) for r in range(3) for k in order[r]]
    # no configuration always runs first: plain opens the even rounds and closes the odd ones
    firsts = {timed[i][2] for i in range(0, len(timed), 3)}
    assert firsts == {0, 2}


def test_schedule_drops_configs_from_cases_they_do_not_apply_to_but_keeps_plain():
    slots = schedule(2, 2, 1, warmup=False, runs_on=lambda case, config: case == 1)
    assert [(s.case, s.config) for s in slots] == [(0, 0), (1, 0), (1, 1)]


def test_runner_executes_in_schedule_order_and_checks_every_run():
    target = ToyTarget(seed=3)
    configs = [BenchConfig.plain(), BenchConfig.oracle(1.0), BenchConfig.oracle(0.5)]
    runner = BenchRunner(target, _cases(target), configs, reps=2)
    records = runner.run()
    assert [r.order for r in records] == list(range(len(runner.slots())))
    executed = [(r.case_id, r.rep, r.config) for r in records]
    expected = [(runner.cases[s.case].id, s.rep, configs[s.config].name) for s in runner.slots()]
    assert executed == expected
    # plain, then each speculative configuration, then back (A B C C B A ...)
    timed = [r.config for r in records if not r.warmup]
    assert timed == ["plain", "oracle@1.00", "oracle@0.50", "oracle@0.50", "oracle@1.00", "plain"] * 2
    assert all(r.verdict is not None and r.verdict.status == IDENTICAL for r in records)
    assert not runner.mismatches
    oracle_full = [r for r in records if r.config == "oracle@1.00" and not r.warmup]
    assert all(r.stats.accepted_tokens == r.stats.draft_tokens > 0 for r in oracle_full)
    for r in records:
        assert r.tokens == runner.references[r.case_id]


def test_summary_pairs_each_speculative_run_with_the_plain_run_of_its_round():
    target = ToyTarget(seed=1)
    configs = [BenchConfig.plain(), BenchConfig.oracle(1.0, adaptive=False)]
    runner = BenchRunner(target, _cases(target), configs, reps=3)
    records = runner.run()
    timed = [r for r in records if not r.warmup]
    assert len(pair_ratios(timed, "oracle@1.00/no-governor")) == 2 * 3
    assert len(pair_ratios(records, "oracle@1.00/no-governor")) == 2 * 3 + 1  # the warm-up pair too
    plain = {(r.case_id, r.rep): r.tokens_per_second for r in records if r.config == "plain"}
    expected = sorted(r.tokens_per_second / plain[(r.case_id, r.rep)] for r in records
                      if r.config == "oracle@1.00/no-governor" and not r.warmup)
    assert sorted(pair_ratios(timed, "oracle@1.00/no-governor")) == pytest.approx(expected)
    rows = summarise(records, [c.name for c in configs], ["a", "b"])
    assert [(r.cls, r.config) for r in rows] == [
        ("a", "plain"), ("a", "oracle@1.00/no-governor"), ("b", "plain"), ("b", "oracle@1.00/no-governor"),
        (ALL_CLASSES, "plain"), (ALL_CLASSES, "oracle@1.00/no-governor")]
    spec_all = rows[-1]
    assert spec_all.pairs == 6 and spec_all.runs == 6
    assert spec_all.ratio_min <= spec_all.ratio_median <= spec_all.ratio_max
    assert spec_all.acceptance_rate == 1.0
    assert spec_all.tokens_per_verify > 1.0
    assert spec_all.accepted_per_position[0] == 1.0
    assert spec_all.identical == 6 and spec_all.mismatches == 0
    assert spec_all.governor_wins == spec_all.governor_losses == 0  # governor off


def test_the_control_row_pairs_plain_with_plain_and_bounds_the_verdicts():
    from tsspec_bench.summary import NoiseBand, control_band

    target = ToyTarget(seed=4)
    configs = [BenchConfig.plain(), BenchConfig.oracle(1.0, adaptive=False), BenchConfig.control()]
    runner = BenchRunner(target, _cases(target), configs, reps=2)
    records = runner.run()
    control = [r for r in records if r.config == "control" and not r.warmup]
    assert len(control) == 4 and all(r.stats.verify_steps == 0 and r.stats.draft_tokens == 0 for r in control)
    assert all(r.verdict.status == IDENTICAL for r in control)
    rows = summarise(records, [c.name for c in configs], ["a", "b"])
    row = next(r for r in rows if r.config == "control" and r.cls == ALL_CLASSES)
    assert row.pairs == 4 and row.ratio_min <= row.ratio_median <= row.ratio_max
    band = control_band(rows)
    assert band == NoiseBand(row.ratio_min, row.ratio_max, 4)
    assert band.verdict(row.ratio_max * 1.01) == "wins" and band.verdict(row.ratio_min * 0.99) == "loses"
    assert band.verdict((row.ratio_min + row.ratio_max) / 2) == "within noise"
    assert control_band([r for r in rows if r.config != "control"]) is None
    assert not BenchConfig.control().speculative


def test_runner_uses_registered_algorithms_through_the_registry():
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec.testing import RandomSpeculator

    registry = SpeculatorRegistry()
    registry.register("random-test", lambda target, options: RandomSpeculator(target.config.vocab_size, seed=1),
                      requires_draft_head=False, description="test")
    target = ToyTarget(seed=2)
    runner = BenchRunner(target, _cases(target, n=1), [BenchConfig.plain(), BenchConfig.for_algorithm("random-test")],
                         reps=1, registry=registry)
    records = runner.run()
    spec = [r for r in records if r.config == "random-test"]
    assert spec and all(r.speculator == RandomSpeculator.name for r in spec)
    assert all(r.verdict.status == IDENTICAL for r in spec)
    assert sum(r.stats.draft_tokens for r in spec) > 0


def test_each_run_starts_fresh_no_park_carries_from_the_run_before():
    """A learned drafter's lost park carries to the next sequence on a target (a server's
    case); the bench measures each run as a fresh `tsspec generate` would see it, so the order
    of runs does not decide whether a run drafts at all."""
    from tsspec.runtime.registry import SpeculatorRegistry
    from tsspec.testing import RandomSpeculator

    registry = SpeculatorRegistry()
    registry.register("learned-test", lambda target, options: RandomSpeculator(target.config.vocab_size, seed=1,
                                                                               max_draft_tokens=3),
                      requires_draft_head=False, weight_free=False, description="test")
    target = ToyTarget(seed=2)
    # a clock that advances 1 ms a reading: the governor's choices do not hang on how busy the
    # machine is (under load the runs' timings, and so their drafts, differed)
    ticks = itertools.count()
    runner = BenchRunner(target, _cases(target, n=1, max_tokens=40), [BenchConfig.plain(),
                         BenchConfig.for_algorithm("learned-test")], reps=3, registry=registry,
                         clock=lambda: next(ticks) / 1000.0)
    records = [r for r in runner.run() if r.config == "learned-test"]
    assert len(records) >= 3 and all(r.verdict.status == IDENTICAL for r in records)
    assert len({r.stats.drafts for r in records}) == 1  # every run probed afresh: the same drafts
    assert records[0].stats.governor_losses >= 1  # random drafts lose: without the reset the next runs start parked


def test_the_registry_forgets_what_a_target_carries():
    from tsspec.runtime.registry import SpeculatorRegistry

    registry, target, other = SpeculatorRegistry(), ToyTarget(), ToyTarget()
    registry.memory(target, "loop:x")["park"] = (5, 48)
    registry.memory(other, "loop:x")["park"] = (7, 96)
    registry.forget(target)
    assert registry.memory(target, "loop:x") == {} and registry.memory(other, "loop:x") == {"park": (7, 96)}


def test_an_algorithm_that_declines_stops_the_runner_with_the_reason():
    from tsspec_bench.runner import ConfigDeclined
    from tsspec.runtime.registry import SpeculatorRegistry

    target = ToyTarget()
    runner = BenchRunner(target, _cases(target, n=1), [BenchConfig.plain(), BenchConfig.for_algorithm("missing")],
                         reps=1, registry=SpeculatorRegistry())
    with pytest.raises(ConfigDeclined, match="missing"):
        runner.run()


class _BrokenVerifyToy(ToyTarget):
    """A deliberately wrong target: a multi-row verify pushes row 1 towards another token, so
    speculative output diverges from plain decoding. The bench must catch it."""

    def spec_forward(self, tokens, *, all_logits_rows, want_hidden):
        logits, hidden = super().spec_forward(tokens, all_logits_rows=all_logits_rows, want_hidden=want_hidden)
        if all_logits_rows and logits.shape[0] > 1:
            logits = logits.clone()
            wrong = (int(logits[1].argmax()) + 1) % logits.shape[1]
            logits[1, wrong] += 100.0
        return logits, hidden


def test_lossless_check_catches_a_wrong_speculative_output():
    target = _BrokenVerifyToy(seed=4)
    mismatches = []
    runner = BenchRunner(target, _cases(target, n=1), [BenchConfig.plain(), BenchConfig.oracle(1.0, adaptive=False)],
                         reps=1, on_mismatch=mismatches.append)
    runner.run()
    assert runner.mismatches and mismatches == runner.mismatches
    verdict = runner.mismatches[0].verdict
    assert verdict.status == MISMATCH and not verdict.ok
    assert verdict.token_gap > 1e-3 and verdict.plain_token != verdict.spec_token
    assert "plain" in verdict.reason


class _FixedLogits:
    """A target whose every row has the same logits: tokens 2 and 5 a near float tie."""

    def __init__(self, gap):
        self.logits = torch.zeros(8, dtype=torch.float64)
        self.logits[2], self.logits[5] = 3.0, 3.0 - gap
        self.cache_seq_len = 0
        self.spec_verify_persists_accepted_kv = True
        self.max_context_length = 64

    def spec_ensure_capacity(self, n):
        pass

    def spec_forward(self, tokens, *, all_logits_rows, want_hidden):
        self.cache_seq_len += len(tokens)
        self.rows = len(tokens)
        rows = len(tokens) if all_logits_rows else 1
        return self.logits.expand(rows, -1).clone(), None

    def spec_keep(self, rows_kept):
        self.cache_seq_len -= self.rows - rows_kept

    def spec_rewind_cache(self, length):
        self.cache_seq_len = length


def test_lossless_check_is_tie_aware():
    assert check_lossless(_FixedLogits(1e-5), [1, 1], [2, 2, 2], [2, 2, 2]).status == IDENTICAL
    tie = check_lossless(_FixedLogits(1e-5), [1, 1], [2, 2, 2], [2, 5, 2])
    assert tie.status == TIE and tie.ok and tie.position == 1
    assert tie.top2_gap == pytest.approx(1e-5)
    real = check_lossless(_FixedLogits(0.5), [1, 1], [2, 2, 2], [2, 5, 2])
    assert real.status == MISMATCH and not real.ok
    assert check_lossless(_FixedLogits(0.5), [1], [2, 2], [2, 2, 2]).status == MISMATCH  # longer output


def test_first_divergence():
    assert first_divergence([1, 2], [1, 2]) is None
    assert first_divergence([1, 2], [1, 3]) == 1
    assert first_divergence([1], [1, 3]) == 1


def test_runner_needs_plain_first():
    target = ToyTarget()
    with pytest.raises(ValueError):
        BenchRunner(target, _cases(target), [BenchConfig.oracle(1.0)])


def test_oracle_config_validates_acceptance_and_options_follow_the_config():
    with pytest.raises(ValueError):
        BenchConfig.oracle(1.5)
    target = ToyTarget()
    runner = BenchRunner(target, _cases(target), [BenchConfig.plain()], options=SpeculationOptions(adaptive=True))
    assert runner._options(BenchConfig.oracle(0.5, adaptive=False)).adaptive is False
    assert runner._options(BenchConfig.oracle(0.5)).adaptive is True
    assert runner._options(BenchConfig.plain()).enabled is False
    assert runner._options(BenchConfig.for_algorithm("ngram")).spec_type == "ngram"
