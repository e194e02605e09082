"""The DFlash2 selector lattice and walk against the equations, written one candidate at a time."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec_block.selector import SelectorWeights, select_tokens, selector_lattice, walk_lattice


def _weights(g, vocab, width, rank, k):
    return SelectorWeights(
        hidden=torch.randn(rank, width, generator=g, dtype=torch.float64),
        predecessor=torch.randn(vocab, rank, generator=g, dtype=torch.float64),
        successor=torch.randn(vocab, rank, generator=g, dtype=torch.float64),
        top_k=k,
    )


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(4, 20), rank=st.integers(1, 4), k=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_walk_matches_slow_reference(slow_refs, rows, vocab, rank, k, seed):
    g = torch.Generator().manual_seed(seed)
    k = min(k, vocab)
    w = _weights(g, vocab, 6, rank, k)
    hidden = torch.randn(rows, 6, generator=g, dtype=torch.float64)
    logits = 3 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    anchor = int(torch.randint(0, vocab, (1,), generator=g))
    tokens, confs = select_tokens(w, hidden, logits, anchor)
    want_tokens, want_confs = slow_refs.select(logits, hidden, anchor, w.hidden, w.predecessor, w.successor, k)
    assert tokens == want_tokens
    assert confs == pytest.approx(want_confs, abs=1e-10)


def test_lattice_shape_is_what_a_device_sends_back():
    """k scores for the first row and a k x k transition per later row: k + k*k*(rows-1)."""
    g = torch.Generator().manual_seed(0)
    w = _weights(g, 50, 8, 3, 4)
    cand, first, trans = selector_lattice(w, torch.randn(5, 8, generator=g, dtype=torch.float64),
                                          torch.randn(5, 50, generator=g, dtype=torch.float64), 7)
    assert cand.shape == (5, 4) and first.shape == (4,) and trans.shape == (4, 4, 4)
    assert first.numel() + trans.numel() == 4 + 4 * 4 * 4


def test_transition_steers_the_walk():
    """A strong predecessor/successor affinity overrides a slightly better unary logit."""
    vocab, rank = 6, 1
    pred = torch.zeros(vocab, rank, dtype=torch.float64)
    succ = torch.zeros(vocab, rank, dtype=torch.float64)
    pred[2, 0] = 10.0  # after token 2 ...
    succ[4, 0] = 1.0  # ... token 4 is strongly preferred
    w = SelectorWeights(hidden=torch.ones(rank, 2, dtype=torch.float64), predecessor=pred, successor=succ, top_k=2)
    logits = torch.tensor([[0, 0, 0, 1.0, 0.9, 0]], dtype=torch.float64)
    assert select_tokens(w, torch.ones(1, 2, dtype=torch.float64), logits, anchor=2)[0] == [4]
    assert select_tokens(w, torch.ones(1, 2, dtype=torch.float64), logits, anchor=1)[0] == [3]


def test_walk_confidence_is_softmax_over_the_candidates():
    cand = torch.tensor([[5, 9]])
    tokens, confs = walk_lattice(cand, torch.tensor([2.0, 1.0], dtype=torch.float64), torch.zeros(0, 2, 2))
    assert tokens == [5]
    assert confs[0] == pytest.approx(1 / (1 + math.exp(-1.0)), rel=1e-12)
