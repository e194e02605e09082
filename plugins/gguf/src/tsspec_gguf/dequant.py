"""Vectorised dequantisation of ggml tensor types into torch tensors.

``gguf.quants.dequantize`` is the correct reference but slow (numpy, many temporaries); the
routines here express each block format as a handful of whole-tensor torch ops over a chunk of
blocks, so a 100 M-weight model dequantises in about a second. Types without a routine here
(the IQ family, TQ, MXFP4...) fall back to the reference, which is slow but right.

Block formats (``block`` weights in ``type_size`` bytes; d, m are fp16 unless noted):

=======  =====  ====  ===========================================================
type     block  size  layout
=======  =====  ====  ===========================================================
Q4_0     32     18    d, 16 x (two 4-bit q);          w = d * (q - 8)
Q4_1     32     20    d, m, 16 x (two 4-bit q);       w = d * q + m
Q5_0     32     22    d, u32 high bits, 16 nibbles;   w = d * (q - 16)
Q5_1     32     24    d, m, u32 high bits, nibbles;   w = d * q + m
Q8_0     32     34    d, 32 x int8;                   w = d * q
Q2_K     256    84    16 x (4-bit scale|4-bit min), 64 x (four 2-bit q), d, dmin
Q3_K     256    110   32 B high-bit mask, 64 x (four 2-bit q), 12 B of 6-bit scales, d
Q4_K     256    144   d, dmin, 12 B of 6-bit scales/mins, 128 x (two 4-bit q)
Q5_K     256    176   d, dmin, 12 B scales/mins, 32 B high bits, 128 x nibbles
Q6_K     256    210   128 B low nibbles, 64 B high 2-bit pairs, 16 x int8 scale, d
Q8_K     256    292   f32 d, 256 x int8, 16 x int16 sums;   w = d * q
=======  =====  ====  ===========================================================

In every K type the 256 weights of a super-block fall in 16-weight (Q2/Q3/Q6) or 32-weight
(Q4/Q5) sub-blocks in order, so a weight's sub-block index is ``e // 16`` or ``e // 32``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

__all__ = ["UnsupportedType", "dequantize", "dequantize_blocks", "FAST_TYPES"]

CHUNK_BLOCKS = 1 << 15  # blocks per vectorised pass: bounds the temporaries (~8M weights of K types)


class UnsupportedType(Exception):
    """A ggml type neither this module nor gguf's reference can dequantise."""


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """fp16 scalar at byte ``offset`` of each block -> float32 [n, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2k] int: the k low nibbles, then the k high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits(raw: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 8k] of 0/1, bit j of the little-endian bit string at index j."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((raw.unsqueeze(-1) >> shifts) & 1).reshape(raw.shape[0], -1)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:18]).to(torch.float32)  # [n, 32]
    return (q - 8.0) * _f16(b, 0)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:20]).to(torch.float32)
    return q * _f16(b, 0) + _f16(b, 2)


def _q5(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    high = _bits(b[:, qh_at : qh_at + 4]) << 4  # [n, 32]
    return (_nibbles(b[:, qh_at + 4 : qh_at + 20]) | high).to(torch.float32)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return (_q5(b, 2) - 16.0) * _f16(b, 0)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _q5(b, 4) * _f16(b, 0) + _f16(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    q = b[:, 2:34].contiguous().view(torch.int8).to(torch.float32)
    return q * _f16(b, 0)


def _q8_k(b: torch.Tensor) -> torch.Tensor:
    d = b[:, 0:4].contiguous().view(torch.float32)
    q = b[:, 4:260].contiguous().view(torch.int8).to(torch.float32)
    return q * d


def _per_sub(values: torch.Tensor, scale: torch.Tensor, sub: int) -> torch.Tensor:
    """values [n, 256] * scale [n, 256/sub] broadcast over sub-blocks of ``sub`` weights."""
    n = values.shape[0]
    return (values.view(n, -1, sub) * scale.unsqueeze(-1)).view(n, -1)


def _two_bit_planes(qs: torch.Tensor) -> torch.Tensor:
    """[n, 64] bytes -> [n, 256]: for each 32-byte half, the 2-bit fields at shifts 0, 2, 4, 6."""
    n = qs.shape[0]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    return ((qs.view(n, 2, 1, 32) >> shifts) & 3).reshape(n, 256)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    scales = b[:, 0:16]
    q = _two_bit_planes(b[:, 16:80]).to(torch.float32)
    d, dmin = _f16(b, 80), _f16(b, 82)
    scaled = _per_sub(q, (scales & 0x0F).to(torch.float32) * d, 16)
    return scaled - _per_sub(torch.ones_like(q), (scales >> 4).to(torch.float32) * dmin, 16)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, s = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    # 16 six-bit scales: low nibble from s[i] (i < 8) or s[i-8] >> 4; high pair from s[8 + i % 4]
    low = torch.cat([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], dim=1)  # [n, 16]
    pair_shift = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).repeat_interleave(4)
    high = (s[:, 8:12].repeat(1, 4) >> pair_shift) & 3
    scales = (low | (high << 4)).to(torch.float32) - 32.0
    # weight e = 128 h + 32 j + l: 2-bit field j of qs[32 h + l], high bit (4 h + j) of hmask[l]
    q = _two_bit_planes(qs).to(torch.int16)
    bit_index = torch.arange(8, dtype=torch.uint8).view(1, 2, 4, 1)
    hbit = ((hmask.view(n, 1, 1, 32) >> bit_index) & 1).reshape(n, 256).to(torch.int16)
    values = (q + 4 * hbit - 4).to(torch.float32)
    return _per_sub(values, scales * _f16(b, 108), 16)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    sc_lo, m_lo = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc_hi = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    m_hi = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return torch.cat([sc_lo, sc_hi], 1).to(torch.float32), torch.cat([m_lo, m_hi], 1).to(torch.float32)


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 128] -> [n, 256]: per 32-byte chunk, the low nibbles then the high nibbles."""
    n = qs.shape[0]
    chunks = qs.view(n, 4, 1, 32)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).reshape(n, 256)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).to(torch.float32)
    return _per_sub(q, sc * _f16(b, 0), 32) - _per_sub(torch.ones_like(q), mn * _f16(b, 2), 32)


def q5_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q5_K blocks [n, 176] -> the 5-bit q of each weight, uint8 [n, 256]."""
    n = b.shape[0]
    qh = b[:, 16:48]  # bit j of qh[l] is the high bit of weight 32 j + l
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
    high = ((qh.view(n, 1, 32) >> shifts) & 1).reshape(n, 256)
    return _k_nibbles(b[:, 48:176]) | (high << 4)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    q = q5_k_values(b).to(torch.float32)
    return _per_sub(q, sc * _f16(b, 0), 32) - _per_sub(torch.ones_like(q), mn * _f16(b, 2), 32)


def q6_k_parts(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K blocks [n, 210] -> (q - 32 as int8 [n, 256], scales int8 [n, 16] (one per 16
    weights), d float32 [n, 1]); weight e = q[e] * scales[e // 16] * d."""
    n = b.shape[0]
    ql, qh = b[:, 0:128].view(n, 2, 2, 32), b[:, 128:192].view(n, 2, 1, 32)
    # weight e = 128 h + 32 k + l: nibble (k // 2) of ql[64 h + 32 (k % 2) + l], pair k of qh[32 h + l]
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # [n, 2, 4, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = ((low | (high << 4)).reshape(n, 256).to(torch.int16) - 32).to(torch.int8)
    return q, b[:, 192:208].contiguous().view(torch.int8), _f16(b, 208)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    q, scales, d = q6_k_parts(b)
    return _per_sub(q.to(torch.float32), scales.to(torch.float32) * d, 16)


BLOCK_ROUTINES: dict[T, Callable[[torch.Tensor], torch.Tensor]] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q2_K: _q2_k,
    T.Q3_K: _q3_k,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    T.Q8_K: _q8_k,
}
PLAIN_TYPES = {  # stored as little-endian numpy scalars
    T.F32: np.dtype("<f4"),
    T.F16: np.dtype("<f2"),
    T.F64: np.dtype("<f8"),
    T.I8: np.dtype("<i1"),
    T.I16: np.dtype("<i2"),
    T.I32: np.dtype("<i4"),
    T.I64: np.dtype("<i8"),
}
FAST_TYPES = frozenset(BLOCK_ROUTINES) | frozenset(PLAIN_TYPES) | {T.BF16}


def dequantize_blocks(blocks: torch.Tensor, ggml_type: T) -> torch.Tensor:
    """[n_blocks, type_size] uint8 -> float32 [n_blocks, block] with this module's routines."""
    return BLOCK_ROUTINES[ggml_type](blocks)


def _reference(raw: np.ndarray, ggml_type: T, n_elements: int) -> torch.Tensor:
    from gguf import quants

    try:
        values = quants.dequantize(np.ascontiguousarray(raw), ggml_type)
    except NotImplementedError:
        raise UnsupportedType(f"ggml type {ggml_type.name} cannot be dequantised") from None
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(n_elements))


def dequantize(
    raw: np.ndarray, ggml_type: T, shape: Sequence[int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Raw tensor bytes (uint8, possibly a read-only memory map) -> a new torch tensor of
    ``shape`` (numpy order) and ``dtype``."""
    n_elements = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    if raw.size != n_elements // block * type_size:
        raise UnsupportedType(f"{raw.size} bytes do not hold {n_elements} {ggml_type.name} weights")
    if ggml_type in PLAIN_TYPES:
        values = torch.from_numpy(np.array(raw).view(PLAIN_TYPES[ggml_type]))
        return values.reshape(tuple(shape)).to(dtype)
    if ggml_type == T.BF16:
        halves = torch.from_numpy(np.array(raw).view(np.int16)).to(torch.int32)
        return (halves << 16).view(torch.float32).reshape(tuple(shape)).to(dtype)
    routine = BLOCK_ROUTINES.get(ggml_type)
    if routine is None:
        return _reference(raw, ggml_type, n_elements).reshape(tuple(shape)).to(dtype)
    n_blocks = n_elements // block
    out = torch.empty((n_blocks, block), dtype=dtype)
    blocks = raw.reshape(n_blocks, type_size)
    for start in range(0, n_blocks, CHUNK_BLOCKS):
        stop = min(start + CHUNK_BLOCKS, n_blocks)
        chunk = torch.from_numpy(np.array(blocks[start:stop]))
        out[start:stop] = routine(chunk)
    return out.reshape(tuple(shape))
