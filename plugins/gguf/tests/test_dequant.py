"""The vectorised dequantisers agree bit for bit with gguf's numpy reference on random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tsspec_gguf import dequant
from tsspec_gguf.dequant import BLOCK_ROUTINES, UnsupportedType, dequantize

# byte offsets of the fp16 scale fields in each block: random bytes there would be NaN/inf
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
N_BLOCKS = 48


def random_blocks(ggml_type: T, n_blocks: int, seed: int) -> np.ndarray:
    """Random quantised bytes with finite, varied fp16 scales: [n_blocks, type_size] uint8."""
    rng = np.random.default_rng(seed)
    _, type_size = GGML_QUANT_SIZES[ggml_type]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS.get(ggml_type, []):
        scales = (rng.normal(size=n_blocks) * 10.0 ** rng.integers(-3, 2, n_blocks)).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    if ggml_type == T.Q8_K:
        raw[:, 0:4] = rng.normal(size=n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    return raw


@pytest.mark.parametrize("ggml_type", sorted(set(FP16_FIELDS), key=lambda t: t.name), ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_block_types_match_reference(ggml_type, seed):
    block, _ = GGML_QUANT_SIZES[ggml_type]
    raw = random_blocks(ggml_type, N_BLOCKS, seed)
    rows = 4
    expected = quants.dequantize(raw.reshape(rows, -1), ggml_type)  # [rows, N_BLOCKS/rows*block]
    got = dequantize(raw.reshape(-1), ggml_type, expected.shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected)


def test_q8_k_is_scale_times_int8():
    # gguf has no Q8_K dequantiser; its definition is one line: w = d * q
    raw = random_blocks(T.Q8_K, 3, 0)
    d = raw[:, 0:4].copy().view(np.float32)  # [3, 1]
    q = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
    got = dequantize(raw.reshape(-1), T.Q8_K, (3, 256))
    np.testing.assert_array_equal(got.numpy(), d * q)


def test_bf16_f16_f32():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(5, 64)).astype(np.float32)
    bf16_bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    expected_bf16 = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    got = dequantize(bf16_bits.view(np.uint8).reshape(-1), T.BF16, (5, 64))
    np.testing.assert_array_equal(got.numpy(), expected_bf16)
    np.testing.assert_array_equal(quants.dequantize(bf16_bits.view(np.uint8), T.BF16), expected_bf16)
    half = values.astype(np.float16)
    got = dequantize(half.view(np.uint8).reshape(-1), T.F16, (5, 64))
    np.testing.assert_array_equal(got.numpy(), half.astype(np.float32))
    got = dequantize(values.view(np.uint8).reshape(-1), T.F32, (5, 64), torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, torch.from_numpy(values).bfloat16())


def test_chunking_gives_the_same_result(monkeypatch):
    raw = random_blocks(T.Q4_K, 10, 7).reshape(-1)
    whole = dequantize(raw, T.Q4_K, (10, 256))
    monkeypatch.setattr(dequant, "CHUNK_BLOCKS", 3)
    assert torch.equal(dequantize(raw, T.Q4_K, (10, 256)), whole)


def test_types_without_a_routine_use_the_reference():
    assert T.IQ4_NL not in BLOCK_ROUTINES
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(4, 18), dtype=np.uint8)
    raw[:, 0:2] = np.full(4, 0.5, np.float16).view(np.uint8).reshape(4, 2)
    expected = quants.dequantize(raw.reshape(1, -1), T.IQ4_NL)
    got = dequantize(raw.reshape(-1), T.IQ4_NL, expected.shape)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_wrong_byte_count_is_refused():
    with pytest.raises(UnsupportedType, match="do not hold"):
        dequantize(np.zeros(33, np.uint8), T.Q8_0, (1, 32))
