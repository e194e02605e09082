"""tsspec.modeling.rowops: RMSNorm, RoPE and the SiLU product on the compiled kernels against torch."""

from __future__ import annotations

import pytest
import torch

from tsspec.modeling import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")


def test_row_ops_match_torch_and_are_row_independent():
    import torch.nn.functional as F

    from tsspec.modeling import rowops

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(7, 96, generator=g), torch.randn(96, generator=g)
    normed = rowops.rms_norm(x, w, 1e-5)
    assert torch.allclose(normed, F.rms_norm(x, (96,), w, 1e-5), atol=1e-5, rtol=1e-5)
    assert torch.equal(rowops.rms_norm(x[3:4].contiguous(), w, 1e-5)[0], normed[3])
    odd = torch.randn(3, 20, generator=g)  # not a multiple of 8: the scalar order
    assert torch.allclose(rowops.rms_norm(odd, torch.ones(20), 1e-6), F.rms_norm(odd, (20,), None, 1e-6), atol=1e-5)

    gu = torch.randn(5, 64, generator=g)
    assert torch.allclose(rowops.silu_mul(gu), F.silu(gu[:, :32]) * gu[:, 32:], atol=1e-6, rtol=1e-5)

    rows, heads, hd, rope_dim = 3, 4, 16, 12
    angles = torch.randn(10, rope_dim // 2, generator=g)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1).contiguous()  # [positions, half, 2]
    qkv = torch.randn(rows, heads * hd + 8, generator=g)
    expected = qkv.clone()
    pairs = expected[:, : heads * hd].view(rows, heads, hd)[..., :rope_dim].unflatten(-1, (rope_dim // 2, 2))
    turned = torch.view_as_complex(pairs.contiguous()) * torch.view_as_complex(table[5 : 5 + rows]).unsqueeze(1)
    expected[:, : heads * hd].view(rows, heads, hd)[..., :rope_dim] = torch.view_as_real(turned).flatten(-2)
    got = rowops.rope_(qkv, heads, hd, rope_dim, table, 5)
    assert got is qkv and torch.allclose(qkv, expected, atol=1e-6)
    with pytest.raises(ValueError):
        rowops.rope_(qkv, heads, hd, rope_dim, table, 9)  # positions past the table


def test_silu_product_scalar_and_simd_agree_over_the_whole_range(scalar_path):
    """The vector SiLU product equals the scalar one bit for bit (large |g| where exp underflows,
    zeros, a tail that is not a multiple of 8) and tracks torch's."""
    import torch.nn.functional as F

    from tsspec.modeling import rowops

    g = torch.Generator().manual_seed(5)
    gate = torch.cat([torch.randn(2, 93, generator=g) * 6, torch.tensor([[-120.0, -88.0, -0.0, 0.0, 90.0] * 18 + [1.0] * 3] * 1)])
    gu = torch.cat([gate, torch.randn(3, 93, generator=g)], dim=1).contiguous()  # [3, 186]
    fast = rowops.silu_mul(gu)
    with scalar_path():
        slow = rowops.silu_mul(gu)
    assert torch.equal(fast, slow)
    expected = F.silu(gu[:, :93].double()) * gu[:, 93:].double()
    assert torch.allclose(fast.double(), expected, rtol=1e-6, atol=1e-6)
