"""The reference ops on tiny random inputs, against direct formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tsspec_block.ops import block_attention, grouped_dynamic_conv, logit_transform, rms_norm, rope_neox


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 6), kernel=st.integers(1, 4), groups=st.integers(1, 3),
       group_size=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_grouped_dynamic_conv_matches_slow_reference(slow_refs, rows, kernel, groups, group_size, seed):
    g = torch.Generator().manual_seed(seed)
    width = groups * group_size
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    coef = torch.randn(rows, kernel, groups, generator=g, dtype=torch.float64)
    base = torch.randn(kernel, width, generator=g, dtype=torch.float64)
    out = grouped_dynamic_conv(x, coef, base, group_size)
    assert torch.allclose(out, slow_refs.conv(x, coef, base, group_size), atol=1e-12)


def test_conv_never_reaches_across_the_block_start():
    """Row r depends on rows r-K+1..r only, and row 0 only on itself."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    coef = torch.randn(5, 3, 2, generator=g, dtype=torch.float64)
    base = torch.randn(3, 4, generator=g, dtype=torch.float64)
    out = grouped_dynamic_conv(x, coef, base, 2)
    changed = x.clone()
    changed[4] += 1.0  # the last row cannot influence anything before it
    assert torch.equal(grouped_dynamic_conv(changed, coef, base, 2)[:4], out[:4])
    assert torch.allclose(out[0], (base[0] + coef[0, 0].repeat_interleave(2)) * x[0])


def test_rope_neox_rotates_half_pairs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 5, 17])
    out = rope_neox(x, pos, 10000.0)
    assert torch.equal(out[0], x[0])  # position 0 is the identity
    i, p = 1, 17
    theta = p * 10000.0 ** (-2 * i / 8)
    a, b = x[2, 0, i], x[2, 0, i + 4]
    assert float(out[2, 0, i]) == pytest.approx(float(a * math.cos(theta) - b * math.sin(theta)), abs=1e-12)
    assert float(out[2, 0, i + 4]) == pytest.approx(float(b * math.cos(theta) + a * math.sin(theta)), abs=1e-12)
    # relative: q(p)·k(s) depends only on p - s
    q, k = x[0:1], x[1:2]
    d1 = (rope_neox(q, torch.tensor([9]), 1e4) * rope_neox(k, torch.tensor([4]), 1e4)).sum()
    d2 = (rope_neox(q, torch.tensor([25]), 1e4) * rope_neox(k, torch.tensor([20]), 1e4)).sum()
    assert float(d1) == pytest.approx(float(d2), abs=1e-10)


def test_block_attention_grouped_query_heads():
    """Query head h reads kv head h // (nh / nkv); masked keys get no weight."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    k = torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    v = torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    visible = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    out = block_attention(q, k, v, visible, 0.5).view(2, 4, 3)
    for row in range(2):
        for head in range(4):
            kv = head // 2
            scores = (k[:, kv] @ q[row, head]) * 0.5
            scores[~visible[row]] = -math.inf
            want = torch.softmax(scores, 0) @ v[:, kv]
            assert torch.allclose(out[row, head], want, atol=1e-12)


def test_rms_norm_and_logit_transform():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    scale = 1 / math.sqrt(12.5 + 1e-6)
    assert torch.allclose(rms_norm(x, w, 1e-6), torch.tensor([[3 * scale, 8 * scale]], dtype=torch.float64))
    z = torch.tensor([-50.0, 0.0, 10.0], dtype=torch.float64)
    assert torch.equal(logit_transform(z), z)
    assert torch.allclose(logit_transform(z, 0.5, 20.0), torch.tanh(z * 0.5 / 20.0) * 20.0)
    assert torch.allclose(logit_transform(z, 0.25, None), z * 0.25)
