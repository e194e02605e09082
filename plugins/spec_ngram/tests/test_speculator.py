"""NGramSpeculator against the Speculator contract: commit/propose bookkeeping, caps, pmin."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec.runtime.generation import draft_window
from tsspec.protocols import DraftContext, Speculator
from tsspec.runtime.options import SpeculationOptions
from tsspec.testing import ToyTarget
from tsspec_ngram import NGramSpeculator, make_ngram


def ctx_for(history, max_tokens=8):
    return DraftContext(
        last_token=history[-1], position=len(history) - 1, max_tokens=max_tokens, history=tuple(history)
    )


def test_is_a_speculator_with_the_contract_flags():
    spec = NGramSpeculator(6)
    assert isinstance(spec, Speculator)
    assert spec.name == "ngram"
    assert spec.max_draft_tokens == 6
    assert spec.default_min_draft_prob == 0.0 and spec.min_draft_prob == 0.0
    assert spec.needs_hidden_state is False
    assert spec.handles_own_prefill is False
    assert spec.can_arm_after_prefix_reuse is True


def test_propose_includes_the_uncommitted_last_token():
    spec = NGramSpeculator(4)
    seq = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    spec.commit(seq[:-1], None, 0)  # the cache holds all but the newest token
    assert spec.propose(ctx_for(seq)) == [3, 4, 5, 9]
    assert spec.indexed_tokens == len(seq)
    # the loop verifies [last, 3, 4]: last and 3 are kept, 4 is rejected, 6 is drawn instead
    spec.commit([2, 3], None, len(seq) - 1)
    seq = seq + [3, 6]
    assert spec.indexed_tokens == len(seq) - 1
    assert spec.propose(ctx_for(seq)) == []  # (3, 6) never occurred


def test_commit_at_an_earlier_position_rewinds():
    spec = NGramSpeculator(4)
    spec.commit([1, 2, 3, 1, 2, 3, 1, 2], None, 0)
    spec.commit([5, 5], None, 3)  # a new sequence sharing the first three tokens
    assert spec.indexed_tokens == 5
    assert spec.propose(ctx_for([1, 2, 3, 5, 5, 1, 2])) == [3, 5, 5, 1]


def test_commit_after_a_gap_is_filled_from_the_history():
    spec = NGramSpeculator(3)
    spec.commit([4, 5], None, 10)  # a reused KV prefix this speculator never saw
    assert spec.indexed_tokens == 0
    history = [1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 4, 5, 1, 2]
    assert spec.propose(ctx_for(history)) == [3, 0, 0]
    assert spec.indexed_tokens == len(history)


def test_history_not_ending_in_last_token_proposes_nothing():
    spec = NGramSpeculator(4)
    ctx = DraftContext(last_token=9, position=5, max_tokens=4, history=(1, 2, 3, 1, 2, 3))
    assert spec.propose(ctx) == []
    assert spec.history_mismatches == 1


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(st.integers(0, 2), min_size=1, max_size=60),
    max_tokens=st.integers(0, 12),
    window=st.integers(1, 10),
)
def test_propose_never_exceeds_max_tokens_or_window(history, max_tokens, window):
    spec = NGramSpeculator(window)
    draft = spec.propose(ctx_for(history, max_tokens))
    assert len(draft) <= min(max_tokens, window)
    assert all(isinstance(t, int) for t in draft)


def test_propose_takes_the_cap_the_loop_computed():
    spec = NGramSpeculator(8)
    history = [1, 2] * 5  # the loop leaves room for positions 10 and 11 only in max_tokens
    assert spec.propose(ctx_for(history, max_tokens=2)) == [1, 2]


def test_pmin_scales_the_required_match_length():
    history = [1, 2, 3, 0, 5, 6, 2, 3]  # only (2, 3) repeats
    assert NGramSpeculator(4, 0.0).propose(ctx_for(history)) == [0, 5, 6, 2]
    assert NGramSpeculator(4, 0.25).required_match == 2
    strict = NGramSpeculator(4, 0.5)
    assert strict.required_match == 4
    assert strict.propose(ctx_for(history)) == []
    assert strict.propose(ctx_for([1, 2, 3, 4, 9, 9, 1, 2, 3, 4])) == [9, 9, 1, 2]


def test_reset_forgets_the_sequence():
    spec = NGramSpeculator(4)
    spec.commit([1, 2, 3, 1, 2], None, 0)
    spec.reset()
    assert spec.indexed_tokens == 0


def test_factory_reads_window_pmin_and_settings():
    target = ToyTarget(vocab_size=16, max_context=64)
    spec = make_ngram(target, SpeculationOptions())
    assert draft_window(SpeculationOptions(), target, spec) == 8 and spec.required_match == 2
    target.spec_preferred_draft_window = 3
    assert draft_window(SpeculationOptions(), target, make_ngram(target, SpeculationOptions())) == 3
    spec = make_ngram(target, SpeculationOptions(draft=5, pmin=0.75))
    assert draft_window(SpeculationOptions(draft=5), target, spec) == 5
    assert spec.min_draft_prob == 0.75 and spec.required_match == 6
    spec = make_ngram(target, SpeculationOptions(extra={"ngram": {"max_order": 4, "follow": False}}))
    assert spec.required_match == 2
    with pytest.raises(ValueError, match="unknown ngram settings"):
        make_ngram(target, SpeculationOptions(extra={"ngram": {"orders": 3}}))


def test_removed_sizing_modes_are_unknown_settings():
    for name in ("adaptive", "value", "candidates", "periodic", "row_ms"):
        with pytest.raises(ValueError, match="unknown ngram settings"):
            make_ngram(ToyTarget(), SpeculationOptions(extra={"ngram": {name: 1}}))


def _matched(spec) -> int:
    """How many suffix tokens the last proposal's match shares (1: the single-token fallback)."""
    from tsspec_ngram.matching import match_length

    tokens = spec._drafter.index.tokens
    return match_length(tokens, spec._drafter._match.pos, len(tokens), 8)


def test_a_proposal_is_the_whole_continuation_as_a_plain_list():
    spec = NGramSpeculator(8)
    for length in (3, 5, 8, 12):
        spec = NGramSpeculator(8)
        gram = list(range(20, 20 + length))
        history = [1, *gram, 5, 6, 2, *gram]  # the suffix matches `length` tokens, not the 1 before
        spec.commit(history[:-1], None, 0)
        draft = spec.propose(ctx_for(history))
        assert type(draft) is list and draft[:2] == [5, 6] and _matched(spec) == min(length, 8)
    assert spec.propose(ctx_for([1, 2, 3])) == []  # nothing found: an empty list


def test_a_single_token_fallback_proposal_matches_one_token():
    """When no bigram occurred earlier, the fallback drafts from the last token alone."""
    spec = NGramSpeculator(8)
    prompt = [10, 11, 12, 13, 14, 15, 7, 16, 17, 0]
    spec.commit(prompt + [10], None, 0)
    history = prompt + [10, 11]
    draft = spec.propose(ctx_for(history))
    assert draft[:2] == [12, 13] and _matched(spec) == 2
    spec.commit([11, 12], None, len(history) - 1)  # 12 landed, then 7 came instead of 13
    history = history + [12, 7]
    draft = spec.propose(ctx_for(history))
    assert draft == [16, 17, 0, 10, 11, 12, 7] and _matched(spec) == 1
    off = NGramSpeculator(8, fallback=False)
    off.commit(prompt + [10], None, 0)
    off.propose(ctx_for(prompt + [10, 11]))
    off.commit([11, 12], None, len(prompt) + 1)
    assert off.propose(ctx_for(history)) == []
