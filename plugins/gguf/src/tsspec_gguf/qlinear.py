"""Linear layers that keep a GGUF's quantised blocks and multiply on them (CPU; float32 or int8 math).

A decode step of a small model on the CPU is bound by the bytes of weights it reads: float32
weights are 4 bytes a weight, Q4_1 blocks 0.625. ``BlockMatrix`` keeps a weight [N, K] as
32-weight affine blocks ``w = d * q + m`` (d, m float32) and multiplies with the compiled kernel
``tsspec_gguf._cpu_kernels`` (cpu_kernels.c, loaded by ``native.py``), which unpacks each block to the exact float32 values the
dequantiser gives and sums in a fixed order per output row:

* results differ from a float32 GEMM on the dequantised matrix only in summation order;
* a row's result does not depend on how many rows share the call (1-row decode and k-row
  verify agree bit for bit), nor on the thread count.

Formats: ``4`` (4-bit q, ggml nibble order; Q4_0 as m = -8 d, Q4_1, Q4_K) and ``8`` (int8 q;
Q8_0, Q5_0 as q - 16 with m = 0, Q5_1 and Q5_K as q in 0..31 with their offset m, and 4-bit
blocks widened when a fused matrix mixes types). A K-quant super-block is
eight affine 32-weight sub-blocks (d * sc, dmin * m), so Q4_K and Q5_K repack exactly; Q6_K has
sixteen 16-weight sub-blocks and becomes format ``16`` (format 8 with a scale per 16 weights).
Q2_K, Q3_K and the rest are not packed (``pack_tensors`` returns None); a caller that wants
every matrix on the kernel wraps such a matrix's float32 weights as format ``32``
(``BlockMatrix.dense``: d = 1, m = 0, the weights as they are). Formats ``F16`` and ``BF16``
keep 16-bit float weights as they are (F16 / BF16 tensors with ``pack_tensor(..., halves=True)``,
or any matrix rounded by ``BlockMatrix.half`` for ``--dtype float16`` / ``bfloat16``); the kernel
widens each weight to float32 exactly and sums in the same fixed order (csrc/matmul_half.c).

Every call, long prefills included, runs on the kernel where it is built, so verify rows,
chunked prefills and one-row decodes agree bit for bit; no per-process timing run picks a path
that is not bit-identical. Dequantise + torch's GEMM serves only a build without the kernel.

Precision: ``linear(..., precision="int8")`` quantises each row of x per 32 values to int8 and
multiplies exactly in integers (llama.cpp's CPU arithmetic), still batch-invariant; the default
``"float32"`` unpacks weights to their exact float32 values.

The compiled part is optional: ``tsspec_gguf.native.available()`` is False when the build
had no C compiler, and loaders then keep float32 weights (``linear`` and ``dequantize`` still
work, on torch).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from gguf import GGMLQuantizationType as T

from . import native
from .dequant import _f16, _k_nibbles, _k_scales, _nibbles, _q5, q5_k_values, q6_k_parts

QK = 32
# Every call runs on the block kernel where it is built, whatever its row count: each row is
# computed exactly like a one-row decode (batch-invariant), so a long solo prefill, a served
# chunked prefill and a verify agree bit for bit. No timing run picks another path (dequantise +
# torch GEMM is not bit-identical, and under int8 not even the same arithmetic); torch's GEMM
# serves only a build without the kernel. GEMM_ROWS bounds the fused one-call stack (a
# 64-token draft + 1 fits).
GEMM_ROWS = 72
# the arithmetic of the block kernel: "float32" (weights unpacked to their exact float32 values,
# float32 sums) or "int8" (rows quantised per 32 values to int8, exact integer dot products with
# the weights' q: llama.cpp's CPU arithmetic; ~1% relative error in a matmul, measured in
# scripts/precision_study.py). Format-32 matrices (plain float weights) always use float32.
PRECISIONS = ("float32", "int8")
DEQUANT_SLICE = 1 << 22  # weights dequantised at a time on the GEMM path (16 MiB of float32)
PACKABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K}
K_BLOCK_BYTES = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}  # 256-weight super-blocks

F16, BF16 = 101, 102  # 16-bit float weights (csrc/kernels_api.h's FMT_F16, FMT_BF16)
HALF_DTYPES = {F16: torch.float16, BF16: torch.bfloat16}
FORMATS = (4, 8, 16, 32, F16, BF16)
# format 16: format 8 with d, m per 16 weights (Q6_K); the 16-bit formats carry d = 1, m = 0, unread
SCALES_PER_BLOCK = {4: 1, 8: 1, 16: 2, 32: 1, F16: 1, BF16: 1}
BLOCK_BYTES = {4: 16, 8: 32, 16: 32, 32: 128, F16: 64, BF16: 64}  # format 32: plain float32 weights (d = 1, m = 0)


class BlockMatrix:
    """A weight [N, K] in 32-weight affine blocks. ``q`` [N, K/32 * bytes] uint8, ``d`` and ``m``
    [N, K/32] float32 ([N, K/16] for format 16), ``fmt`` 4, 8 or 16 (bytes per block: 16, 32,
    32)."""

    __slots__ = ("fmt", "q", "d", "m", "shape")

    def __init__(self, fmt: int, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
        if fmt not in FORMATS:
            raise ValueError(f"block format must be one of {FORMATS}, got {fmt}")
        n, scales = d.shape
        nb = scales // SCALES_PER_BLOCK[fmt]
        per_block = BLOCK_BYTES[fmt]
        if q.dtype != torch.uint8 or tuple(q.shape) != (n, nb * per_block) or scales % SCALES_PER_BLOCK[fmt]:
            raise ValueError(f"q must be uint8 [{n}, {nb * per_block}], got {q.dtype} {list(q.shape)}")
        if d.dtype != torch.float32 or m.dtype != torch.float32 or m.shape != d.shape:
            raise ValueError("d and m must be float32 of one shape [N, K/32] ([N, K/16] for format 16)")
        self.fmt = fmt
        self.q, self.d, self.m = q.contiguous(), d.contiguous(), m.contiguous()
        self.shape = (int(n), int(nb) * QK)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def concat(cls, parts: Sequence["BlockMatrix"]) -> "BlockMatrix":
        """Rows of several matrices stacked (fused QKV, gate+up) in the widest format among them:
        4-bit parts widen to int8, and beside a format-16 part every scale covers 16 weights;
        a 16-bit float part beside a part of another format makes every part format 32."""
        fmts = {p.fmt for p in parts}
        fmt = fmts.pop() if len(fmts) == 1 else 32 if fmts & {32, F16, BF16} else max(fmts)
        return cls(fmt, *(torch.cat(t) for t in zip(*(p._as(fmt) for p in parts))))

    @classmethod
    def dense(cls, weight: torch.Tensor) -> "BlockMatrix":
        """Format 32: float32 weights [N, K] as they are, so a matrix with no block form takes
        the same row-invariant kernel as the others."""
        w = weight.to(torch.float32).contiguous()
        n, k = w.shape
        if k % QK:
            raise ValueError(f"dense block matrices need K divisible by {QK}, got {k}")
        ones = torch.ones((n, k // QK), dtype=torch.float32)
        return cls(32, w.view(torch.uint8).reshape(n, -1), ones, torch.zeros_like(ones))

    @classmethod
    def half(cls, weight: torch.Tensor, fmt: int) -> "BlockMatrix":
        """Format F16 or BF16: weights [N, K] rounded to 16-bit floats (round to nearest even;
        exact for weights that already are 16-bit), kept at 16 bits."""
        if fmt not in HALF_DTYPES:
            raise ValueError(f"16-bit block formats are {F16} (F16) and {BF16} (BF16), got {fmt}")
        w = weight.detach().to(HALF_DTYPES[fmt]).contiguous()
        n, k = w.shape
        if k % QK:
            raise ValueError(f"16-bit block matrices need K divisible by {QK}, got {k}")
        ones = torch.ones((n, k // QK), dtype=torch.float32)
        return cls(fmt, w.view(torch.uint8).reshape(n, -1), ones, torch.zeros_like(ones))

    @classmethod
    def quantize_int8(cls, weight: torch.Tensor) -> "BlockMatrix":
        """Format 8 (Q8_0's layout): float weights [N, K] rounded to int8 per 32-weight block
        with one float32 scale (max |w| / 127; m = 0). Lossy, for drafters: a drafter's matmuls
        then stream a quarter of the float32 bytes through the same kernel."""
        w = weight.detach().to(torch.float32).contiguous()
        n, k = w.shape
        if k % QK:
            raise ValueError(f"int8 block matrices need K divisible by {QK}, got {k}")
        blocks = w.view(n, k // QK, QK)  # [N, nb, 32]
        d = blocks.abs().amax(dim=-1) / 127.0  # [N, nb]
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round(blocks * inv[..., None]).clamp_(-127, 127).to(torch.int8)  # [N, nb, 32]
        return cls(8, q.view(torch.uint8).reshape(n, -1), d.contiguous(), torch.zeros_like(d))

    def _as(self, fmt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, d, m) of the same weights in a format at least as wide."""
        if fmt == 32 and self.fmt != 32:
            dense = BlockMatrix.dense(self.dequantize())
            return dense.q, dense.d, dense.m
        q, d, m = self.q, self.d, self.m
        if self.fmt == 4 and fmt > 4:
            q = _widen(q)
        if fmt == 16 and self.fmt != 16:
            d, m = d.repeat_interleave(2, dim=1), m.repeat_interleave(2, dim=1)
        return q, d, m

    def scaled(self, factor: float) -> "BlockMatrix":
        """The matrix times ``factor`` (exact for powers of two): d and m scaled (a 16-bit
        float matrix: its weights, kept at 16 bits where every product is exact, else format 32)."""
        if self.fmt in HALF_DTYPES:
            product = self.dequantize() * factor
            half = BlockMatrix.half(product, self.fmt)
            return half if torch.equal(half.dequantize(), product) else BlockMatrix.dense(product)
        return BlockMatrix(self.fmt, self.q, self.d * factor, self.m * factor)

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Plain tensors for the weight cache (``from_tensors`` reverses it)."""
        return {f"{prefix}.q{self.fmt}": self.q, f"{prefix}.d": self.d, f"{prefix}.m": self.m}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], prefix: str) -> "BlockMatrix | None":
        for fmt in FORMATS:
            q = tensors.get(f"{prefix}.q{fmt}")
            if q is not None:
                return cls(fmt, q, tensors[f"{prefix}.d"], tensors[f"{prefix}.m"])
        return None

    # -- using ---------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m))

    def dequantize(self, rows: slice | None = None) -> torch.Tensor:
        """float32 [N, K] (or the given row slice)."""
        start, stop, _ = (rows or slice(None)).indices(self.shape[0])
        n, k = max(0, stop - start), self.shape[1]
        out = torch.empty((n, k), dtype=torch.float32)
        kernels = native.kernels()
        if kernels is not None and n:
            kernels.dequant(
                self.fmt, self.q[start].data_ptr(), self.d[start].data_ptr(), self.m[start].data_ptr(),
                n, k, out.data_ptr(), torch.get_num_threads(),
            )
            return out
        return _dequantize_torch(self.fmt, self.q[start:stop], self.d[start:stop], self.m[start:stop])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Selected rows as float32 [len(ids), K] (the embedding lookup). Up to GEMM_ROWS ids (a
        decode or verify) are unpacked by the kernel row by row (the same values: q * d is
        exact, so both round q * d + m once), which skips the ~50 us of torch gathers; more
        (a prefill) in one batch of torch ops."""
        ids = ids.reshape(-1).to(torch.long)
        n, k = self.shape
        kernels = native.kernels()
        if kernels is None or len(ids) > GEMM_ROWS:
            if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < n:  # torch would wrap a negative id
                raise IndexError(f"row ids must lie in [0, {n})")
            return _dequantize_torch(self.fmt, self.q[ids], self.d[ids], self.m[ids])
        picked = ids.tolist()
        if picked and not 0 <= min(picked) <= max(picked) < n:
            raise IndexError(f"row ids must lie in [0, {n})")
        out = torch.empty((len(picked), k), dtype=torch.float32)
        q, d, m = self.q.data_ptr(), self.d.data_ptr(), self.m.data_ptr()
        q_row, s_row, o_row = self.q.stride(0), self.d.stride(0) * 4, k * 4  # bytes a row
        for i, row in enumerate(picked):
            kernels.dequant(self.fmt, q + row * q_row, d + row * s_row, m + row * s_row, 1, k, out.data_ptr() + i * o_row, 1)
        return out

    def linear(self, x: torch.Tensor, base: torch.Tensor | None = None, *, precision: str = "float32") -> torch.Tensor:
        """``base + x @ W^T`` (base optional), x [R, K] float32 -> [R, N] float32; ``precision``
        is the kernel's arithmetic (PRECISIONS)."""
        rows, k = x.shape
        n = self.shape[0]
        if k != self.shape[1]:
            raise ValueError(f"x has {k} columns, the matrix {self.shape[1]}")
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError("block matrices multiply float32 CPU rows")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        kernels = native.kernels()
        if kernels is None:
            return self._linear_torch(x, base)
        return self._linear_kernel(kernels, x, base, precision)

    def _linear_kernel(self, kernels, x: torch.Tensor, base: torch.Tensor | None, precision: str) -> torch.Tensor:
        rows, k = x.shape
        n = self.shape[0]
        x = x.contiguous()
        out = torch.empty((rows, n), dtype=torch.float32)
        base_ptr = 0
        if base is not None:
            base = base.contiguous()
            if base.shape != out.shape or base.dtype != torch.float32:
                raise ValueError(f"base must be float32 {list(out.shape)}")
            base_ptr = base.data_ptr()
        kernels.gemm(
            self.fmt, self.q.data_ptr(), self.d.data_ptr(), self.m.data_ptr(), n, k,
            x.data_ptr(), rows, out.data_ptr(), base_ptr, torch.get_num_threads(), precision == "int8",
        )
        return out

    def _linear_torch(self, x: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
        n, k = self.shape
        step = max(1, DEQUANT_SLICE // k)
        if step >= n:
            w = self.dequantize()
            return torch.addmm(base, x, w.t()) if base is not None else x @ w.t()
        out = torch.empty((x.shape[0], n), dtype=torch.float32)
        for start in range(0, n, step):
            w = self.dequantize(slice(start, start + step))
            part = x @ w.t()
            if base is not None:
                part += base[:, start : start + step]
            out[:, start : start + step] = part
        return out

    def __repr__(self) -> str:
        return f"BlockMatrix(q{self.fmt}, {list(self.shape)}, {self.nbytes / 2**20:.1f} MiB)"


def _widen(q4: torch.Tensor) -> torch.Tensor:
    """4-bit blocks [N, nb * 16] -> the same weights as int8 blocks [N, nb * 32] (as uint8 bytes)."""
    return _nibbles(q4.reshape(-1, 16)).reshape(q4.shape[0], -1)


def _dequantize_torch(fmt: int, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The same values as the kernel's unpack (q * d is exact, so q * d + m rounds once)."""
    n = q.shape[0]
    if fmt == 32:
        return q.contiguous().view(torch.float32).reshape(n, -1).clone()
    if fmt in HALF_DTYPES:
        return q.contiguous().view(HALF_DTYPES[fmt]).reshape(n, -1).to(torch.float32)
    if fmt == 4:
        values = _nibbles(q.reshape(-1, 16)).view(n, -1, 32).to(torch.float32)
    else:  # int8; format 16's scales cover 16 weights each
        values = q.view(torch.int8).view(n, d.shape[1], -1).to(torch.float32)
    return (values * d.unsqueeze(-1) + m.unsqueeze(-1)).reshape(n, -1)


def _pack_k_quant(raw: np.ndarray, kind, n: int, k: int) -> BlockMatrix:
    """K-quant super-blocks as affine blocks. Q4_K / Q5_K: sub-block j (32 weights) has
    d_j = d * sc_j and m_j = -(dmin * min_j), the products ggml's dequantiser forms (exact in
    float32), and q in 0..15 (format 4) or 0..31 (format 8). Q6_K: format 16, d_j = d * scale_j
    per 16 weights, q - 32 as int8."""
    size = K_BLOCK_BYTES[kind]
    supers = n * (k // 256)
    b = _blocks(raw, supers, size)
    if kind == T.Q6_K:  # 16 sub-blocks of 16: d_j = d * scale_j, q - 32 in -32..31, m = 0
        q, scales, d = q6_k_parts(b)
        d16 = (scales.to(torch.float32) * d).reshape(n, -1)
        return BlockMatrix(16, q.view(torch.uint8).reshape(n, -1).contiguous(), d16, torch.zeros_like(d16))
    sc, mins = _k_scales(b[:, 4:16])  # [supers, 8] each
    d = (sc * _f16(b, 0)).reshape(n, -1)
    m = (-(mins * _f16(b, 2))).reshape(n, -1)
    if kind == T.Q4_K:
        q = _k_nibbles(b[:, 16:144]).view(supers * 8, 2, 16)  # sub-block: weights 0-15, 16-31
        packed = (q[:, 0] | (q[:, 1] << 4)).reshape(n, -1)  # ggml's order: j low, j + 16 high
        return BlockMatrix(4, packed, d, m)
    return BlockMatrix(8, q5_k_values(b).reshape(n, -1), d, m)


def pack_tensor(raw: np.ndarray, ggml_type, shape: Sequence[int], *, halves: bool = False) -> BlockMatrix | None:
    """A GGUF tensor's raw bytes (shape [N, K] in numpy order) as a BlockMatrix; None for a type
    the kernel does not take or a shape that is not whole blocks. ``halves``: F16 and BF16
    tensors too, kept at 16 bits (formats F16, BF16)."""
    try:
        kind = T(int(ggml_type))
    except ValueError:
        return None
    if halves and kind in (T.F16, T.BF16) and len(shape) == 2 and int(shape[1]) % QK == 0:
        n, k = int(shape[0]), int(shape[1])
        fmt = F16 if kind == T.F16 else BF16
        q = _blocks(raw, n, 2 * k).reshape(n, 2 * k)
        ones = torch.ones((n, k // QK), dtype=torch.float32)
        return BlockMatrix(fmt, q, ones, torch.zeros_like(ones))
    if kind not in PACKABLE or len(shape) != 2 or int(shape[1]) % QK:
        return None
    n, k = int(shape[0]), int(shape[1])
    if kind in K_BLOCK_BYTES:
        return _pack_k_quant(raw, kind, n, k) if k % 256 == 0 else None
    nb = k // QK
    b = _blocks(raw, n * nb, {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24, T.Q8_0: 34}[kind])
    d = _f16(b, 0)  # [n * nb, 1]
    if kind == T.Q5_0:  # d * (q - 16): int8 blocks of q - 16, Q8_0's form (exact)
        fmt, qs, m = 8, (_q5(b, 2).to(torch.int16) - 16).to(torch.int8).view(torch.uint8), torch.zeros_like(d)
    elif kind == T.Q5_1:  # d * q + m with q in 0..31: int8 blocks with an offset (exact)
        fmt, qs, m = 8, _q5(b, 4).to(torch.uint8), _f16(b, 2)
    elif kind == T.Q4_0:
        fmt, qs, m = 4, b[:, 2:18], d * -8.0
    elif kind == T.Q4_1:
        fmt, qs, m = 4, b[:, 4:20], _f16(b, 2)
    else:
        fmt, qs, m = 8, b[:, 2:34], torch.zeros_like(d)
    return BlockMatrix(fmt, qs.reshape(n, -1), d.reshape(n, nb), m.reshape(n, nb))


BLOCK_FORMS = {T.Q4_0: "4-bit blocks", T.Q4_1: "4-bit blocks", T.Q4_K: "4-bit blocks", T.Q5_0: "int8 blocks",
               T.Q5_1: "int8 blocks", T.Q5_K: "int8 blocks", T.Q8_0: "int8 blocks", T.Q6_K: "int8 blocks of 16"}


def weight_format(type_name: str) -> str:
    """How a matrix of a ggml type (by name) runs on the CPU block path: its block form, or
    ``float32`` for a type ``pack_tensor`` does not take."""
    try:
        kind = T[type_name]
    except KeyError:
        return "float32"
    return BLOCK_FORMS.get(kind, "float32")


def _blocks(raw: np.ndarray, count: int, size: int) -> torch.Tensor:
    """The first ``count`` blocks of ``size`` bytes of a tensor's raw bytes, as a uint8 tensor
    [count, size] (a copy: the file's mapping is read-only)."""
    return torch.from_numpy(np.array(np.asarray(raw, dtype=np.uint8)[: count * size])).view(count, size)


def pack_tensors(gguf_file, names: Sequence[str], scales: Sequence[float] | None = None) -> BlockMatrix | None:
    """Several GGUF tensors stacked by rows into one BlockMatrix (each optionally scaled);
    None when any of them cannot be packed."""
    parts = []
    for i, name in enumerate(names):
        info = gguf_file.tensor_info(name)
        part = pack_tensor(gguf_file.tensor_bytes(name), info.ggml_type, info.shape)
        if part is None:
            return None
        if scales is not None and scales[i] != 1.0:
            part = part.scaled(scales[i])
        parts.append(part)
    return parts[0] if len(parts) == 1 else BlockMatrix.concat(parts)
