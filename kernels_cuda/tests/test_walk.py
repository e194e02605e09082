"""The host lattice walk on the compact readback (numpy) against the drafter's torch walk, and
the compact lattice contract against the drafter's selector."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec_kernels_cuda import reference
from tsspec_kernels_cuda.walk import readback, walk_compact

selector = pytest.importorskip("tsspec_block.selector")


def _random_lattice(rows, k, seed, ties):
    g = torch.Generator().manual_seed(seed)
    cand = torch.randint(0, 500, (rows, k), generator=g)
    first = torch.randn(k, generator=g)
    trans = torch.randn(max(rows - 1, 0), k, k, generator=g)
    if ties:  # exact ties: the earlier candidate must win on both sides
        first[:] = first.round()
        trans = trans.round()
    return cand, first, trans


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), k=st.integers(1, 6), seed=st.integers(0, 10_000), ties=st.booleans())
def test_numpy_walk_equals_torch_walk(rows, k, seed, ties):
    cand, first, trans = _random_lattice(rows, k, seed, ties)
    tokens, conf = walk_compact(*readback(cand, first, trans))
    ref_tokens, ref_conf = selector.walk_lattice(cand, first, trans)
    assert tokens == ref_tokens
    np.testing.assert_allclose(conf, ref_conf, rtol=1e-12, atol=0)


def test_walk_by_hand():
    # row 0 takes candidate 0 (5); row 1 reads transitions[0][0] -> candidate 1 (7)
    cand = np.array([[5, 9], [3, 7]])
    tokens, conf = walk_compact(cand, np.array([2.0, 1.0]), np.array([[[0.0, 1.0], [3.0, 0.0]]]))
    assert tokens == [5, 7]
    assert conf[0] == pytest.approx(np.exp(2) / (np.exp(2) + np.exp(1)))


@pytest.mark.parametrize("rows", [1, 4])
def test_compact_lattice_equals_the_selector(rows):
    g = torch.Generator().manual_seed(rows)
    vocab, hidden, rank, top_k = 50, 12, 6, 4
    w = selector.SelectorWeights(torch.randn(rank, hidden, generator=g), torch.randn(vocab, rank, generator=g),
                                 torch.randn(vocab, rank, generator=g), top_k)
    h = torch.randn(rows, hidden, generator=g)
    logits = torch.randn(rows, vocab, generator=g)
    got = reference.selector_lattice(logits, h, w.hidden, w.predecessor, w.successor, 7, top_k)
    want = selector.selector_lattice(w, h, logits, 7)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    tokens, _ = walk_compact(*readback(*got))
    assert tokens == selector.select_tokens(w, h, logits, 7)[0]
