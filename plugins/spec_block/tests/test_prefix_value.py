"""The block speculator's value rule: the prefix whose calibrated expected landing pays for its
verify rows, learned online, and how the speculator and its factory use it."""

from __future__ import annotations

import types

import pytest

from tsspec.protocols import DraftContext, DraftHeadKind

from tsspec_block.prefix_value import Calibration, PrefixValue, shape_ratios
from tsspec_block.speculator import VALUE_ENV, BlockDraftSpeculator, prefix_value_for

RATIOS = [1.0, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]  # 1..7 rows over one row's cost


def test_shape_ratios_interpolate_the_targets_cost_by_rows():
    assert shape_ratios(((1, 10.0), (2, 12.0), (4, 14.0)), 5) == pytest.approx([1.0, 1.2, 1.3, 1.4, 1.5])
    assert shape_ratios(None, 4) is None
    assert shape_ratios(((2, 10.0), (3, 12.0)), 4) is None  # a shape must start at one row


def test_the_worked_example_of_the_module_docstring():
    value = PrefixValue([1.0, 1.2, 1.3])
    assert value.length([0.5, 0.05]) == 1  # 1.5 / 1.2 = 1.25 beats 1.525 / 1.3 and a plain 1.0
    assert value.length([0.15]) == 0  # 1.15 / 1.2 < 1.0: a plain step is worth more
    assert value.length([0.9, 0.9]) == 2  # 2.71 / 1.3 = 2.08 beats 1.9 / 1.2


def test_calibration_learns_what_a_confidence_is_worth():
    value = PrefixValue(RATIOS)
    assert value.length([0.55]) == 1  # optimistic: the raw confidence until measured
    for _ in range(30):  # row 1 at 0.55 never lands here
        value.record([0.55], 0)
    assert value.calibration.rate(0, 0.55) < 0.05
    assert value.length([0.55]) == 0
    assert value.length([0.85]) == 1  # another bin, still unmeasured
    for _ in range(30):  # row 1 at 0.35 lands every time: it pays now
        value.record([0.35], 1)
    assert value.length([0.35]) == 1


def test_later_rows_are_calibrated_apart_and_stop_the_head_scoring():
    value = PrefixValue(RATIOS)
    assert value.worth_more(0.9, 7)  # later rows unmeasured: they might pay
    for _ in range(40):  # row 1 lands, row 2 never does, whatever its confidence
        for conf in (0.15, 0.35, 0.55, 0.75, 0.95):
            value.record([0.9, conf, 0.9], 1)
    assert value.length([0.9, 0.95, 0.95]) == 1
    assert value.calibration.rate(1, 0.95) < 0.1 and value.calibration.rate(0, 0.9) > 0.9
    assert not value.worth_more(0.9, 7)
    assert not value.worth_more(0.9, 1)  # nothing after row 1 to score


def test_a_declined_bin_and_unscored_later_rows_are_retried_with_a_doubling_wait():
    """Counts move only for verified rows: a refused bin or never-scored later rows would keep
    their estimate for the drafter's life. Retries come after 8, then 16, 32 .. refusals, and a
    landing starts the wait over."""
    value = PrefixValue(RATIOS)
    for _ in range(30):
        value.record([0.55], 0)
    proposed = [i for i in range(1, 60) if value.length([0.55]) == 1]
    assert proposed == [8, 24, 56]  # waits of 8, 16, 32 refusals
    value.record([0.55], 1)  # a retry landed: the wait starts over
    assert [i for i in range(1, 9) if value.length([0.55]) == 1] == [8]
    for _ in range(40):  # row 2 never lands: rows 2.. are not worth scoring
        value.record([0.9, 0.9], 1)
    asked = [value.worth_more(0.9, 7) for _ in range(8)]
    assert asked == [False] * 7 + [True]
    assert value.length([0.9, 0.9]) == 2  # the retry's row 2 is proposed, so it is measured
    assert value.length([0.9, 0.9]) == 1
    before = value.calibration.reached[1][9]
    value.record([0.9, 0.9], 2)
    assert value.calibration.reached[1][9] == before + 1


def test_counts_halve_so_recent_behaviour_weighs_more():
    cal = Calibration()
    for _ in range(600):
        cal.record([0.45], 0)
    assert cal.reached[0][4] <= 256
    for _ in range(200):
        cal.record([0.45], 1)
    assert cal.rate(0, 0.45) > 0.4


class _Head:
    """A BLOCK head with fixed drafts; records whether it was asked to score lazily."""

    kind = DraftHeadKind.BLOCK
    block_size = 8

    def __init__(self, confidences, lazy):
        self.confidences = confidences
        self.scores_rows_lazily = lazy
        self.mores = []

    def draft_block(self, last, carry, position, count, **kw):
        if "more" in kw:
            self.mores.append(kw["more"](self.confidences[0]))
            if not self.mores[-1]:
                return [100], self.confidences[:1]
        return list(range(100, 100 + count)), self.confidences[:count]

    def draft_catch_up(self, tokens, rows, start):
        pass

    def reset(self):
        pass


def _ctx(position, max_tokens=7):
    return DraftContext(last_token=5, position=position, max_tokens=max_tokens, history=[5], carry_hidden=None)


@pytest.mark.parametrize("lazy", [False, True])
def test_the_speculator_proposes_what_pays_and_learns_from_the_verify(lazy):
    head = _Head([0.9, 0.8, 0.2, 0.9, 0.9, 0.9, 0.9], lazy)
    spec = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS))
    first = spec.propose(_ctx(10))
    assert first == [100, 101] if not lazy else first in ([100, 101], [100])
    spec.commit([5, 100], None, 10)  # the verify kept `last` and one draft
    cal = spec.value.calibration
    assert cal.reached[0][9] == 1 and cal.landed[0][9] == 1
    if len(first) > 1:
        assert cal.reached[1][8] == 1 and cal.landed[1][8] == 0
    assert (head.mores != []) == lazy
    spec.commit([7], None, 12)  # a plain step's commit: nothing was proposed, nothing recorded
    assert cal.reached[0][9] == 1
    low = BlockDraftSpeculator(_Head([0.12] * 7, lazy), window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS))
    assert low.propose(_ctx(10)) == [] and low.declined_drafts == 1


def test_without_a_value_rule_the_gate_alone_decides():
    spec = BlockDraftSpeculator(_Head([0.9, 0.8, 0.2, 0.9, 0.9, 0.9, 0.9], True), window=7, min_draft_prob=0.35)
    assert spec.propose(_ctx(10)) == [100, 101]  # 0.9 * 0.8 = 0.72, then 0.144 < 0.35


def test_the_factory_prices_by_the_targets_measured_rows_and_shares_a_calibration(monkeypatch):
    head = _Head([0.5] * 7, True)
    bare = types.SimpleNamespace()
    assert prefix_value_for(bare, head) is None  # a target that publishes no cost by rows
    measured = types.SimpleNamespace(spec_verify_row_ms=((1, 8.0), (2, 9.0), (4, 11.0), (8, 16.0)))
    one, two = prefix_value_for(measured, head), prefix_value_for(measured, head)
    assert one.ratios[:3] == pytest.approx([1.0, 1.125, 1.25])
    assert one.calibration is two.calibration  # one drafter, one calibration across sequences
    assert prefix_value_for(measured, _Head([0.5] * 7, True)).calibration is not one.calibration
    monkeypatch.setenv(VALUE_ENV, "0")
    assert prefix_value_for(measured, head) is None


def test_passes_are_skipped_while_they_do_not_pay_and_resume_once_they_do():
    head = _Head([0.12] * 7, True)  # declined by the value rule: a pass that earns nothing
    spec = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS))
    assert spec.propose(_ctx(10)) == [] and spec.skipped_passes == 0  # no plain step timed: no judging
    assert spec.value.calibration.pass_gain is None
    spec.observe_step(False, 10.0, 1, 0)  # a plain step of 10 ms prices the passes now
    ran = []
    for step in range(11):
        before = spec.skipped_passes
        spec.propose(_ctx(11 + step))
        ran.append(spec.skipped_passes == before)
    # a pass, skip 1, a pass, skip 2, a pass, skip 4, a pass
    assert ran == [True, False, True, False, False, True, False, False, False, False, True]
    assert spec.value.calibration.pass_gain < 0 and not spec.value.passes_pay()
    head.confidences = [0.95] * 7  # now sure: a pass earns E(k) - shape ratio > 0 plain steps
    for step in range(8):  # the skip of 8 runs out, then passes pay again
        spec.propose(_ctx(30 + step))
    assert spec.propose(_ctx(40)) == list(range(100, 107))  # later rows unmeasured: optimistic
    assert spec.value.passes_pay() and spec._skip_left == 0 and spec.value.calibration.skip_next == 1
    before = spec.skipped_passes
    spec.propose(_ctx(41))
    assert spec.skipped_passes == before  # paying: a pass every step


def test_observe_step_keeps_plain_steps_only():
    spec = BlockDraftSpeculator(_Head([0.5] * 7, True), window=7, value=PrefixValue(RATIOS))
    spec.observe_step(True, 30.0, 2, 1)
    spec.observe_step(False, 0.0, 1, 0)  # a clock that did not move
    assert list(spec.value.calibration.plain_ms) == []
    spec.observe_step(False, 8.0, 1, 0)
    assert list(spec.value.calibration.plain_ms) == [8.0]
    assert spec.value.calibration.plain_step_ms() == 8.0


def test_a_new_sequences_first_pass_is_priced_by_the_plain_steps_of_earlier_ones():
    cal = Calibration()
    first = BlockDraftSpeculator(_Head([0.12] * 7, True), window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS, cal))
    first.reset()
    first.observe_step(False, 10.0, 1, 0)
    first.close()
    second = BlockDraftSpeculator(_Head([0.12] * 7, True), window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS, cal))
    second.reset()
    assert second.propose(_ctx(10)) == []  # before any plain step of its own: judged all the same
    assert cal.pass_gain is not None and cal.pass_gain < 0 and second._skip_left == 1


def test_the_skips_a_sequence_leaves_untaken_are_taken_by_the_next():
    cal = Calibration()
    head = _Head([0.12] * 7, True)
    first = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS, cal))
    first.reset()
    first.observe_step(False, 10.0, 1, 0)
    for step in range(4):  # a pass (skip 1), a skipped step, a pass (skip 2), a skipped step
        first.propose(_ctx(10 + step))
    assert first._skip_left == 1 and first.skipped_passes == 2
    first.close()
    assert cal.skip_left == 1
    second = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS, cal))
    second.reset()
    assert cal.skip_left == 0  # taken: a sequence that ends without close leaves none behind
    assert second.propose(_ctx(5)) == [] and second.skipped_passes == 1  # the left-over skip first
    calls = len(head.mores)
    second.propose(_ctx(6))  # then a pass
    assert len(head.mores) == calls + 1 and second._skip_left == 4
    bare = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0)  # no value rule: no skips at all
    bare.reset()
    assert bare._skip_left == 0


def test_a_new_sequence_on_the_drafter_resumes_its_backoff():
    cal = Calibration()
    for sequence in range(2):
        spec = BlockDraftSpeculator(_Head([0.12] * 7, True), window=7, min_draft_prob=0.0,
                                    value=PrefixValue(RATIOS, cal))
        spec.observe_step(False, 10.0, 1, 0)
        spec.propose(_ctx(10))  # judged: does not pay
        assert spec._skip_left == (1 if sequence == 0 else 2)  # the second sequence goes on doubling
        assert cal.skip_next == 2 * spec._skip_left


def test_the_pass_backoff_grows_to_the_governors_longest_park():
    """Passes that keep not paying are tried after 1, 2, 4 .. 512 skipped steps, no longer."""
    from tsspec_block.speculator import MAX_SKIP

    head = _Head([0.12] * 7, True)
    spec = BlockDraftSpeculator(head, window=7, min_draft_prob=0.0, value=PrefixValue(RATIOS))
    spec.observe_step(False, 10.0, 1, 0)
    skips, position = [], 10
    while len(skips) < 12:
        passes = len(head.mores)
        spec.propose(_ctx(position))
        position += 1
        if len(head.mores) > passes:
            skips.append(spec._skip_left)
    assert MAX_SKIP == 512 and skips == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 512, 512]


def test_malformed_cost_shapes_give_no_value_rule():
    for bad in ("fast", ((1, 1.0),), ((1, 1.0), (1, 2.0)), ((1, 0.0), (2, 1.0)), ((1, float("nan")), (2, 1.0))):
        assert shape_ratios(bad, 3) is None
