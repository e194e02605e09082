"""16-bit float block matrices (formats F16, BF16; csrc/matmul_half.c): weights kept at 16 bits,
each output summed in one fixed order whatever the rows of the call, scalar and SIMD alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from tsspec_gguf import native
from tsspec_gguf.qlinear import BF16, F16, HALF_DTYPES, BlockMatrix, pack_tensor

needs_native = pytest.mark.skipif(not native.available(), reason="the block kernel was not built")
FORMATS = [F16, BF16]


def weights(n: int, k: int, seed: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[0, :7] = torch.tensor([0.0, -0.0, 1e-7, -3e-6, 6e4, -6e4, 1.0])  # zeros, f16 subnormals, near f16's max
    return w


@pytest.mark.parametrize("fmt", FORMATS)
def test_weights_are_the_16_bit_values_exactly(fmt):
    w = weights(9, 64, 1)
    bm = BlockMatrix.half(w, fmt)
    expected = w.to(HALF_DTYPES[fmt]).to(torch.float32)
    assert bm.fmt == fmt and bm.q.shape == (9, 128) and bm.shape == (9, 64)
    assert torch.equal(bm.dequantize(), expected)
    assert torch.equal(bm.rows(torch.tensor([3, 0, 8])), expected[[3, 0, 8]])
    assert torch.equal(bm.rows(torch.arange(9).repeat(10)), expected.repeat(10, 1))  # the torch gather path
    assert torch.equal(BlockMatrix.from_tensors(bm.tensors("w"), "w").dequantize(), expected)
    scaled = bm.scaled(0.125)  # exact in bf16; in f16 a subnormal loses bits, so format 32
    assert torch.equal(scaled.dequantize(), expected * 0.125) and scaled.fmt == (BF16 if fmt == BF16 else 32)
    assert BlockMatrix.half(torch.ones(2, 32), fmt).scaled(0.5).fmt == fmt
    with pytest.raises(ValueError, match="divisible"):
        BlockMatrix.half(torch.zeros(2, 20), fmt)


@pytest.mark.parametrize("kind,fmt", [(T.F16, F16), (T.BF16, BF16)])
def test_f16_and_bf16_tensors_pack_as_they_are(kind, fmt):
    w = weights(5, 96, 2).to(HALF_DTYPES[fmt])
    raw = np.frombuffer(w.view(torch.int16).numpy().tobytes(), np.uint8)
    assert pack_tensor(raw, kind, (5, 96)) is None  # only when asked for
    bm = pack_tensor(raw, kind, (5, 96), halves=True)
    assert bm.fmt == fmt and torch.equal(bm.dequantize(), w.float())
    assert pack_tensor(raw, kind, (5, 40), halves=True) is None  # not whole blocks


def test_fused_parts_keep_16_bits_only_when_they_share_the_format():
    a, b = BlockMatrix.half(weights(4, 64, 3), BF16), BlockMatrix.half(weights(6, 64, 4), BF16)
    fused = BlockMatrix.concat([a, b])
    assert fused.fmt == BF16 and torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    f16 = BlockMatrix.half(weights(2, 64, 5), F16)
    mixed = BlockMatrix.concat([a, f16])
    assert mixed.fmt == 32 and torch.equal(mixed.dequantize(), torch.cat([a.dequantize(), f16.dequantize()]))


@needs_native
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [23, 64])  # 23: a decode row meets weight rows in fours, a pair, then one alone
def test_rows_are_batch_invariant_and_scalar_agrees(fmt, n, scalar_path):
    """Every output equals the one-row call's, whatever rows share the call, the tiles, the
    thread count or the path (AVX2 + F16C or scalar); with and without a base."""
    bm = BlockMatrix.half(weights(n, 160, 6), fmt)
    x = torch.randn(11, 160, generator=torch.Generator().manual_seed(7))
    base = torch.randn(11, n, generator=torch.Generator().manual_seed(8))
    full, with_base = bm.linear(x), bm.linear(x, base)
    for r in range(11):
        assert torch.equal(bm.linear(x[r : r + 1]), full[r : r + 1])
        assert torch.equal(bm.linear(x[r : r + 1], base[r : r + 1]), with_base[r : r + 1])
    for start, stop in ((0, 2), (2, 5), (3, 10), (1, 8)):
        assert torch.equal(bm.linear(x[start:stop]), full[start:stop])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert torch.equal(bm.linear(x), full)
    finally:
        torch.set_num_threads(threads)
    with scalar_path():
        assert native.info()["simd"] == "scalar"
        assert torch.equal(bm.linear(x), full) and torch.equal(bm.linear(x, base), with_base)
        assert torch.equal(bm.dequantize(), BlockMatrix.half(weights(n, 160, 6), fmt).dequantize())
    # the int8 precision leaves 16-bit weights in float32 math, as format 32
    assert torch.equal(bm.linear(x, precision="int8"), full)
    exact = x.double() @ bm.dequantize().double().t()
    assert torch.allclose(full.double(), exact, rtol=1e-5, atol=1e-4)
