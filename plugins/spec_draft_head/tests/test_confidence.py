"""The confidence gate on tiny arrays."""

from __future__ import annotations

import math

import pytest
import torch

from tsspec_draft_head.confidence import GATE_TOP_K, passes_gate, top1_over_topk


def test_worked_example():
    token, p = top1_over_topk(torch.tensor([2.0, 0.5, 0.0, -1.0]))
    expected = math.exp(2.0) / (math.exp(2.0) + math.exp(0.5) + 1.0 + math.exp(-1.0))
    assert token == 0 and p == pytest.approx(expected) and p == pytest.approx(0.7101, abs=1e-4)
    assert not passes_gate(p, 0.75) and passes_gate(p, 0.7)


def test_only_the_top_k_compete():
    # one strong logit against 30 weak rivals: over the full vocabulary top-1 is ~0.42,
    # over the top-10 it is ~0.71 (the tail beyond the 10th logit does not count)
    logits = torch.cat([torch.tensor([3.0]), torch.zeros(30)])
    _, p = top1_over_topk(logits)
    assert p == pytest.approx(math.exp(3.0) / (math.exp(3.0) + GATE_TOP_K - 1))
    assert torch.softmax(logits, 0)[0].item() < p


def test_ties_pick_the_lowest_id():
    assert top1_over_topk(torch.tensor([0.0, 5.0, 5.0, 1.0]))[0] == 1


def test_small_vocabulary_and_saturation():
    assert top1_over_topk(torch.tensor([1.0, 1.0])) == (0, 0.5)
    token, p = top1_over_topk(torch.tensor([0.0, 1000.0, 0.0]))
    assert token == 1 and p == 1.0 and passes_gate(p, 1.0)


def test_gate_bounds():
    assert passes_gate(0.0, 0.0) and passes_gate(1e-9, 0.0)
    assert not passes_gate(0.999, 1.0)
    assert not passes_gate(float("nan"), 0.0)


def test_rejects_non_vectors():
    with pytest.raises(ValueError):
        top1_over_topk(torch.zeros(2, 3))
    with pytest.raises(ValueError):
        top1_over_topk(torch.zeros(0))


@pytest.mark.parametrize("make", [
    lambda g: torch.randn(4096, generator=g) * 3,  # the compact logits: the native gate
    lambda g: torch.randn(8192, generator=g)[::2],  # not contiguous: torch
    lambda g: torch.randn(300, generator=g, dtype=torch.float64),  # float64: torch
    lambda g: torch.tensor([1.0, float("nan"), 2.0]),  # a NaN: torch decides
    lambda g: torch.full((5,), float("-inf")),  # no finite maximum: torch decides
])
def test_the_native_gate_gives_the_torch_gates_answer(make):
    from tsspec_draft_head.confidence import top1_over_topk_torch

    logits = make(torch.Generator().manual_seed(3))
    token, p = top1_over_topk(logits)
    want_token, want_p = top1_over_topk_torch(logits)
    assert token == want_token
    assert p == pytest.approx(want_p, rel=1e-12, abs=0, nan_ok=True)
