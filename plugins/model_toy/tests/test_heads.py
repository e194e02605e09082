"""ToyPerTokenHead (tsspec_model_toy.heads): the exact toy head the draft-head tests run on."""

from __future__ import annotations

import pytest
import torch

from tsspec.protocols import DraftHead, DraftHeadKind
from tsspec_model_toy.heads import ToyPerTokenHead

VOCAB, HIDDEN = 37, 12


def _rows(n: int, seed: int = 1) -> torch.Tensor:
    rows = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rows[0] = 0.0  # position 0 has no predecessor
    return rows  # [n, H]


def test_is_a_per_token_draft_head():
    head = ToyPerTokenHead(VOCAB, HIDDEN)
    assert isinstance(head, DraftHead)
    assert head.kind is DraftHeadKind.PER_TOKEN and head.block_size == 1
    assert head.resumes_after_gap is False


def test_fused_call_equals_catch_up_then_step_bit_for_bit():
    tokens, rows = [3, 9, 1, 30, 7], _rows(5)
    split, fused = ToyPerTokenHead(VOCAB, HIDDEN, seed=4), ToyPerTokenHead(VOCAB, HIDDEN, seed=4)
    split.draft_catch_up(tokens[:-1], rows[:-1], 0)
    logits_a, h_a = split.draft_step(tokens[-1], rows[-1], 4)
    logits_b, h_b = fused.draft_catch_up_and_step(tokens, rows, 0)
    assert torch.equal(logits_a, logits_b) and torch.equal(h_a, h_b)
    assert logits_b.shape == (VOCAB,) and h_b.shape == (HIDDEN,)
    assert split.cache_positions == fused.cache_positions == [0, 1, 2, 3, 4]
    assert (split.calls, fused.calls) == (2, 1)
    assert (split.catch_up_calls, split.step_calls, fused.fused_calls) == (1, 1, 1)
    assert split.rows == fused.rows == 5


def test_catch_up_replaces_rejected_drafts_like_a_fresh_head():
    tokens, rows = [5, 6, 7, 8, 9, 10], _rows(6, seed=2)
    head = ToyPerTokenHead(VOCAB, HIDDEN, seed=1)
    head.draft_catch_up(tokens[:3], rows[:3], 0)
    logits, h = head.draft_step(tokens[3], rows[3], 3)
    head.draft_step(20, h, 4)  # a draft chain that the trunk will reject
    head.draft_step(21, h, 5)
    head.draft_catch_up(tokens[3:5], rows[3:5], 3)  # what landed instead
    assert head.cache_tokens == tokens[:5]
    fresh = ToyPerTokenHead(VOCAB, HIDDEN, seed=1)
    fresh.draft_catch_up(tokens[:5], rows[:5], 0)
    assert torch.equal(head.draft_step(tokens[5], rows[5], 5)[0], fresh.draft_step(tokens[5], rows[5], 5)[0])


def test_cache_contents_change_the_logits():
    rows = _rows(4, seed=3)
    a, b = ToyPerTokenHead(VOCAB, HIDDEN), ToyPerTokenHead(VOCAB, HIDDEN)
    a.draft_catch_up([1, 2, 3], rows[:3], 0)
    b.draft_catch_up([1, 2, 4], rows[:3], 0)
    assert not torch.equal(a.draft_step(5, rows[3], 3)[0], b.draft_step(5, rows[3], 3)[0])


def test_gap_is_tolerated_and_visible():
    head = ToyPerTokenHead(VOCAB, HIDDEN)
    head.draft_catch_up([1, 2], _rows(2), 0)
    logits, _ = head.draft_catch_up_and_step([4, 5], _rows(2, seed=5)[:, :] + 1.0, 10)
    assert head.cache_positions == [0, 1, 10, 11]
    assert torch.isfinite(logits).all()


def test_reset_clears_the_cache_but_not_the_counters():
    head = ToyPerTokenHead(VOCAB, HIDDEN)
    head.draft_catch_up([1, 2], _rows(2), 0)
    head.reset()
    assert head.cache_positions == [] and head.calls == 1
    head.reset_counters()
    assert (head.calls, head.rows) == (0, 0)


def test_seed_decides_the_weights():
    rows = _rows(1)
    same = [ToyPerTokenHead(VOCAB, HIDDEN, seed=s).draft_step(3, rows[0], 0)[0] for s in (0, 0, 1)]
    assert torch.equal(same[0], same[1]) and not torch.equal(same[0], same[2])


def test_oracle_mode_drafts_what_the_reference_says():
    def reference(tokens):  # a toy "target": the next token is (sum of the prefix) mod vocab
        out = torch.zeros(VOCAB, dtype=torch.float64)
        out[sum(tokens) % VOCAB] = 1.0
        return out

    seen = []
    head = ToyPerTokenHead(VOCAB, HIDDEN, oracle=lambda t: seen.append(list(t)) or reference(t), oracle_scale=50.0)
    rows = _rows(3)
    head.draft_catch_up([4, 5], rows[:2], 0)
    assert seen == []  # catch-up rows need no logits
    logits, h = head.draft_step(6, rows[2], 2)
    assert seen == [[4, 5, 6]] and int(torch.argmax(logits)) == 15
    logits, _ = head.draft_step(15, h, 3)
    assert int(torch.argmax(logits)) == 30


def test_draft_block_chains_steps():
    head = ToyPerTokenHead(VOCAB, HIDDEN, logit_scale=5.0)
    tokens, confidences = head.draft_block(3, _rows(1)[0], 0, 4)
    assert len(tokens) == len(confidences) == 4 and head.step_calls == 4
    assert all(0 <= t < VOCAB for t in tokens) and all(0.0 < c <= 1.0 for c in confidences)
    assert head.cache_positions == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "call",
    [
        lambda h: h.draft_step(VOCAB, torch.zeros(HIDDEN), 0),
        lambda h: h.draft_step(0, torch.zeros(HIDDEN + 1), 0),
        lambda h: h.draft_catch_up_and_step([], torch.zeros(0, HIDDEN), 0),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call(ToyPerTokenHead(VOCAB, HIDDEN))
