"""The kernels' draft-head gate (``top1_topk``) against a torch reference on small vectors:
the first index of the maximum, and the softmax probability of the largest value among the
k largest (float64), or None where the caller must decide (a NaN, a maximum that is not finite)."""

from __future__ import annotations

import math

import pytest
import torch

from tsspec_gguf import native

kernels = native.kernels()
pytestmark = pytest.mark.skipif(kernels is None or not hasattr(kernels, "top1_topk"),
                                reason="the compiled kernels were not built")


def reference(x: torch.Tensor, k: int) -> tuple[int, float]:
    values = torch.topk(x, min(k, x.shape[0])).values.to(torch.float64)  # [k], descending
    return int(torch.argmax(x)), float(torch.softmax(values, dim=0)[0])


def gate(x: torch.Tensor, k: int):
    x = x.contiguous()
    return kernels.top1_topk(x.data_ptr(), x.shape[0], k)


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 100, 4096])
@pytest.mark.parametrize("k", [1, 3, 10, 64])
def test_equals_torch_on_random_vectors(n, k):
    gen = torch.Generator().manual_seed(n * 100 + k)
    for _ in range(5):
        x = torch.randn(n, generator=gen) * 4.0  # [n]
        index, p = gate(x, k)
        want_index, want_p = reference(x, k)
        assert index == want_index
        assert p == pytest.approx(want_p, rel=1e-12, abs=0)


def test_ties_and_repeats():
    x = torch.tensor([0.0, 5.0, 5.0, 1.0, 5.0])
    index, p = gate(x, 2)
    assert index == 1 and p == 0.5  # the first maximum; two equal values among the top 2
    assert gate(torch.tensor([3.0, 3.0, 3.0]), 10) == (0, pytest.approx(1 / 3, rel=1e-15))


def test_minus_infinity_takes_no_share_and_the_worked_example():
    x = torch.tensor([2.0, 0.5, 0.0, -1.0, float("-inf")])
    index, p = gate(x, 10)
    assert index == 0
    assert p == pytest.approx(math.exp(2.0) / (math.exp(2.0) + math.exp(0.5) + 1.0 + math.exp(-1.0)), rel=1e-14)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_leaves_nan_and_an_infinite_maximum_to_the_caller(bad):
    assert gate(torch.tensor([1.0, bad, 0.0]), 10) is None
    assert gate(torch.full((3,), float("-inf")), 10) is None


@pytest.mark.parametrize("n, k", [(0, 10), (5, 0), (5, 65)])
def test_bad_operands_raise(n, k):
    x = torch.zeros(max(n, 1))
    with pytest.raises(ValueError, match="top1_topk"):
        kernels.top1_topk(x.data_ptr(), n, k)
