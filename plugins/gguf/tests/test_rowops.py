"""tsspec_gguf.rowops: RMSNorm, RoPE and the SiLU product on the compiled kernels against torch."""

from __future__ import annotations

import pytest
import torch

from tsspec_gguf import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels were not built")


def test_row_ops_match_torch_and_are_row_independent():
    import torch.nn.functional as F

    from tsspec_gguf import rowops

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

    from tsspec_gguf import rowops

    g = torch.Generator().manual_seed(5)
    gate = torch.cat([torch.randn(2, 93, generator=g) * 6, torch.tensor([[-120.0, -88.0, -0.0, 0.0, 90.0] * 18 + [1.0] * 3] * 1)])
    gu = torch.cat([gate, torch.randn(3, 93, generator=g)], dim=1).contiguous()  # [3, 186]
    fast = rowops.silu_mul(gu)
    with scalar_path():
        slow = rowops.silu_mul(gu)
    assert torch.equal(fast, slow)
    expected = F.silu(gu[:, :93].double()) * gu[:, 93:].double()
    assert torch.allclose(fast.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [576, 64, 960, 37, 8, 2048])
def test_rms_norm_torch_is_torchs_rms_norm_bit_for_bit(n):
    """The final norm of a native step (``rms_norm_torch``) equals ``F.rms_norm`` exactly, row
    by row, on rows of every magnitude, for hidden sizes with and without a scalar tail."""
    import torch.nn.functional as F

    from tsspec_gguf import rowops

    lanes = rowops.torch_norm_lanes(n, 1e-5)
    if lanes is None:  # another torch or CPU: the targets keep torch's op (tested in model_llama)
        pytest.skip("this torch's rms_norm order is not one the kernels reproduce")
    assert lanes in rowops.TORCH_LANES
    g = torch.Generator().manual_seed(n + 1)
    x = torch.randn(12, n, generator=g) * 10.0 ** torch.arange(-5, 7, dtype=torch.float32)[:, None]
    w = torch.randn(n, generator=g)
    got = rowops.rms_norm_torch(x, w, 1e-5)
    for r in range(x.shape[0]):
        assert torch.equal(got[r], F.rms_norm(x[r : r + 1], (n,), w, 1e-5)[0]), f"row {r}"
    other = rowops.rms_norm_torch(x, w, 1e-6)  # another eps: found and checked again
    assert torch.equal(other, F.rms_norm(x, (n,), w, 1e-6))


def test_a_wrong_lane_count_gives_other_bits():
    """The lane count matters (so finding it by comparison can fail, and is checked): summing in
    another width than torch's changes some rows' last bits."""
    import torch.nn.functional as F

    from tsspec_gguf import rowops

    lanes = rowops.torch_norm_lanes(576, 1e-5)
    if lanes is None:
        pytest.skip("this torch's rms_norm order is not one the kernels reproduce")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(32, 576, generator=g), torch.randn(576, generator=g)
    want = F.rms_norm(x, (576,), w, 1e-5)
    for other in set(rowops.TORCH_LANES) - {lanes}:
        got = torch.empty_like(x)
        native.kernels().rms_norm_torch(x.data_ptr(), w.data_ptr(), got.data_ptr(), 32, 576, 1e-5, other)
        assert not torch.equal(got, want)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_rms_norm_torch_refuses_bad_operands():
    from tsspec_gguf import rowops

    with pytest.raises(ValueError, match="weight"):
        rowops.rms_norm_torch(torch.ones(2, 8), torch.ones(9), 1e-5)
    with pytest.raises(ValueError, match="operands"):
        native.kernels().rms_norm_torch(0, 0, 0, 1, 8, 1e-5, 8)
    x = torch.ones(1, 8)
    with pytest.raises(ValueError, match="operands"):  # no such vector width
        native.kernels().rms_norm_torch(x.data_ptr(), x.data_ptr(), x.data_ptr(), 1, 8, 1e-5, 17)
