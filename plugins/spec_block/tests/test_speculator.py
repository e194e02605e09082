"""BlockDraftSpeculator: window, cumulative gate, commit pass-through, factory declines."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec.protocols import DraftContext, DraftHeadKind, SpeculatorDeclined
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget

from tsspec_block.speculator import BlockDraftSpeculator, gate_cumulative, make_block_speculator


class RecordingHead:
    """A BLOCK head that returns fixed drafts and records every call."""

    kind = DraftHeadKind.BLOCK
    resumes_after_gap = True

    def __init__(self, block_size=6, tokens=(3, 4, 5, 6, 7), confs=(0.9, 0.8, 0.6, 0.95, 0.5)):
        self.block_size = block_size
        self.tokens, self.confs = list(tokens), list(confs)
        self.calls = []
        self.feature_size = 4

    def draft_block(self, last_token, h_prev, position, max_tokens):
        self.calls.append(("block", last_token, h_prev, position, max_tokens))
        return self.tokens[:max_tokens], self.confs[:max_tokens]

    def draft_catch_up(self, tokens, h_rows, start_pos):
        self.calls.append(("catch_up", list(tokens), h_rows, start_pos))

    def reset(self):
        self.calls.append(("reset",))


def _ctx(max_tokens=8, carry=None):
    return DraftContext(last_token=1, position=10, max_tokens=max_tokens, history=(0,) * 11, carry_hidden=carry)


def test_gate_keeps_the_longest_prefix_above_the_cumulative_threshold():
    assert gate_cumulative([3, 4, 5, 6, 7], [0.9, 0.8, 0.6, 0.95, 0.5], 0.35) == [3, 4, 5, 6]
    assert gate_cumulative([3, 4], [0.3, 1.0], 0.35) == []
    assert gate_cumulative([3, 4, 5], [0.1, 0.1, 0.1], 0.0) == [3, 4, 5]


@settings(max_examples=30, deadline=None)
@given(confs=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=10), pmin=st.floats(0.0, 1.0))
def test_gate_property(confs, pmin):
    kept = gate_cumulative(list(range(len(confs))), confs, pmin)
    n = len(kept)
    prod = 1.0
    for c in confs[:n]:
        prod *= c
        assert prod >= pmin
    if n < len(confs):
        assert prod * confs[n] < pmin


def test_window_is_capped_by_the_block():
    head = RecordingHead(block_size=6)
    assert BlockDraftSpeculator(head, window=16).max_draft_tokens == 5
    assert BlockDraftSpeculator(head, window=3).max_draft_tokens == 3
    spec = BlockDraftSpeculator(head, window=16, min_draft_prob=0.35, feature_size=4)
    carry = torch.ones(4)
    assert spec.propose(_ctx(8, carry)) == [3, 4, 5, 6]
    assert head.calls[-1][4] == 5 and head.calls[-1][2] is carry
    assert spec.propose(_ctx(2, carry)) == [3, 4]  # the loop's budget caps it further
    assert spec.propose(_ctx(0, carry)) == []


def test_commit_and_reset_reach_the_head_and_wrong_width_rows_are_dropped():
    head = RecordingHead()
    spec = BlockDraftSpeculator(head, feature_size=4)
    rows = torch.zeros(2, 4)
    spec.commit([5, 6], rows, 7)
    assert not head.calls  # injected when a proposal needs it, not per commit
    spec.commit([5, 6], torch.zeros(2, 9), 7)  # wrong width: the head forgets, never misreads
    assert head.calls[-1] == ("catch_up", [5, 6], rows, 7)  # not contiguous: the first run flushed
    spec.propose(_ctx(4, torch.zeros(9)))
    catch_ups = [c for c in head.calls if c[0] == "catch_up"]
    assert catch_ups[-1][1] == [5, 6] and catch_ups[-1][2] is None
    spec.reset()
    assert head.calls[-1] == ("reset",)


def test_parked_commits_reach_the_head_in_one_call_before_the_next_proposal():
    head = RecordingHead()
    spec = BlockDraftSpeculator(head, feature_size=4)
    for k in range(5):  # five one-token plain steps while the governor parks drafting
        spec.commit([10 + k], torch.full((1, 4), float(k)), 20 + k)
    assert not head.calls
    spec.propose(_ctx(4, torch.zeros(4)))
    first = head.calls[0]
    assert first[0] == "catch_up" and first[1] == [10, 11, 12, 13, 14] and first[3] == 20
    assert torch.equal(first[2], torch.arange(5.0)[:, None].expand(5, 4))
    spec.commit([1, 2], torch.zeros(2, 4), 40)
    spec.reset()  # a new sequence: what was pending is dropped, never injected
    assert all(c[1] != [1, 2] for c in head.calls if c[0] == "catch_up")


def _catch_ups(head):
    return [(c[1], c[2], c[3]) for c in head.calls if c[0] == "catch_up"]


def test_a_proposal_injects_only_the_newest_catch_up_rows():
    """A 100-token prefill (or a long park) reaches the head as its newest ``catch_up_rows``
    rows only, in one call; the older ones are counted as skipped."""
    head = RecordingHead()
    spec = BlockDraftSpeculator(head, feature_size=4, catch_up_rows=6)
    rows = torch.arange(100.0)[:, None].expand(100, 4)
    spec.commit(list(range(60)), rows[:60], 0)
    spec.commit(list(range(60, 100)), rows[60:], 60)
    spec.propose(_ctx(4, torch.zeros(4)))
    [(tokens, injected, start)] = _catch_ups(head)
    assert tokens == list(range(94, 100)) and start == 94 and torch.equal(injected, rows[94:])
    assert spec.skipped_rows == 94
    unbounded = BlockDraftSpeculator(RecordingHead(), feature_size=4, catch_up_rows=None)
    unbounded.commit(list(range(100)), rows, 0)
    unbounded.propose(_ctx(4, torch.zeros(4)))
    assert _catch_ups(unbounded.head)[0][1].shape[0] == 100 and unbounded.skipped_rows == 0
    with pytest.raises(ValueError, match="catch_up_rows"):
        BlockDraftSpeculator(RecordingHead(), catch_up_rows=0)


def test_rows_before_a_gap_are_dropped_as_the_bound_drops_them_with_every_commit():
    """A verify's accepted rows, then a park whose commits the loop withheld up to the last
    ``catch_up_rows`` steps: the head gets exactly the calls it gets when told every commit."""
    def row(p):
        return torch.full((1, 4), float(p))

    told_all, withheld = RecordingHead(), RecordingHead()
    for head, gap in ((told_all, False), (withheld, True)):
        spec = BlockDraftSpeculator(head, feature_size=4, catch_up_rows=3)
        spec.commit([5, 6, 7], torch.cat([row(19), row(20), row(21)]), 20)  # last + two accepted drafts
        for p in range(23, 40):  # parked plain steps; the probe comes at 40
            if not gap or p >= 40 - 3:
                spec.commit([p], row(p - 1), p)
        spec.propose(_ctx(4, torch.zeros(4)))
        assert spec.skipped_rows == (3 if gap else 17)  # what it was told and did not inject
    want, got = _catch_ups(told_all), _catch_ups(withheld)
    assert [(t, s) for t, _, s in got] == [(t, s) for t, _, s in want] == [([37, 38, 39], 37)]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(got, want))


def test_protocol_fields():
    spec = BlockDraftSpeculator(RecordingHead())
    assert spec.name == "block" and spec.needs_hidden_state and spec.can_arm_after_prefix_reuse
    assert spec.default_min_draft_prob == 0.35 and not spec.handles_own_prefill


def test_factory_uses_options_and_declines_clearly():
    target = ToyTarget()
    with pytest.raises(SpeculatorDeclined, match="no block drafter"):
        make_block_speculator(target, SpeculationOptions())
    target.spec_set_feature_taps([1, 2])
    head = RecordingHead()
    head.feature_size = target.spec_feature_size
    target.draft_head = head
    spec = make_block_speculator(target, SpeculationOptions(draft=3, pmin=0.5))
    assert spec.max_draft_tokens == head.block_size - 1 and spec.min_draft_prob == 0.5  # the loop narrows it
    assert make_block_speculator(target, SpeculationOptions()).min_draft_prob == 0.35
    target.spec_set_feature_taps(None)
    with pytest.raises(SpeculatorDeclined, match="feature taps"):
        make_block_speculator(target, SpeculationOptions())


def test_factory_declines_a_per_token_head_and_a_bad_drafter_file(tmp_path):
    target = ToyTarget()
    target.draft_head = type("H", (), {"kind": DraftHeadKind.PER_TOKEN})()
    with pytest.raises(SpeculatorDeclined, match="per_token"):
        make_block_speculator(target, SpeculationOptions())
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(SpeculatorDeclined, match="not.gguf"):
        make_block_speculator(target, SpeculationOptions(draft_model=str(bad)))
