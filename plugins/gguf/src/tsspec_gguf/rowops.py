"""Per-row ops of a transformer block on the compiled CPU kernels: RMSNorm, rotary embedding
(adjacent pairs, llama.cpp's layout), SiLU-gated product.

Each computes every row the same way whatever the number of rows (see cpu_kernels.c), like
``qlinear`` and ``attention``: a model built from these keeps 1-row and k-row forwards equal bit
for bit. They take float32 CPU tensors and check them; hot loops that build their own tensors
may call ``native.kernels()`` directly with the same arguments.

``rms_norm_torch`` is the other RMSNorm: torch's ``F.rms_norm`` on float32 rows, bit for bit (its
cascade sum in torch's vector width on this CPU, ``torch_norm_lanes``), for a model whose
final norm ran on torch and now runs in the same native call as its blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native

# torch's float32 vector widths the kernels can sum in (AVX2 / the default build: 8 lanes;
# AVX-512: 16; NEON: 4); which one this torch uses is found by comparing, never assumed
TORCH_LANES = (8, 16, 4)
# torch reduces a call serially below this many values (ATen's GRAIN_SIZE); above it a
# multi-threaded reduction may split rows differently, so callers keep torch's own op there
TORCH_SERIAL_VALUES = 32768
CHECK_ROWS = 48  # rows of the comparison that picks the lane count


def _kernels():
    kernels = native.kernels()
    if kernels is None:
        raise RuntimeError("the compiled CPU kernels were not built")
    return kernels


def _check(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] -> x / sqrt(mean(x^2) + eps) * weight, per row."""
    _check("x", x)
    _check("weight", weight)
    rows, n = x.shape
    if weight.shape != (n,):
        raise ValueError(f"weight must be [{n}]")
    out = torch.empty_like(x)
    _kernels().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, float(eps))
    return out


def rope_(x: torch.Tensor, heads: int, head_dim: int, rope_dim: int, table: torch.Tensor, start: int) -> torch.Tensor:
    """Rotate, in place, the first ``rope_dim`` values of each of the first ``heads`` heads of
    every row of x [rows, >= heads * head_dim] (rows may be strided); row t is at position
    start + t; ``table`` [positions, rope_dim / 2, 2] holds (cos, sin). Returns x."""
    _check("table", table)
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] < heads * head_dim:
        raise ValueError(f"x must be float32 [rows, >= {heads * head_dim}] with contiguous rows")
    if table.dim() != 3 or table.shape[1:] != (rope_dim // 2, 2) or table.shape[0] < start + x.shape[0]:
        raise ValueError("table must be [positions, rope_dim / 2, 2] covering every row's position")
    _kernels().rope(x.data_ptr(), x.stride(0), x.shape[0], heads, head_dim, rope_dim, table.data_ptr(), start)
    return x


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 F] -> silu(gate) * up [rows, F]."""
    _check("gate_up", gate_up)
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError("gate_up must have an even number of columns")
    out = torch.empty((rows, width // 2), dtype=torch.float32)
    _kernels().silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


_LANES: dict[tuple[int, float], int | None] = {}


def torch_norm_lanes(n: int, eps: float) -> int | None:
    """The vector width with which ``rms_norm_torch`` reproduces this process's ``F.rms_norm``
    on rows of ``n`` values, or None when no width does (another torch, another CPU: callers
    then keep torch's op). Found once per (n, eps) by comparing both on CHECK_ROWS seeded rows
    of magnitudes 1e-3..1e3 (a wrong width differs on most such rows)."""
    key = (int(n), float(eps))
    if key not in _LANES:
        _LANES[key] = _find_lanes(*key)
    return _LANES[key]


def _find_lanes(n: int, eps: float) -> int | None:
    kernels = native.kernels()
    if kernels is None or not hasattr(kernels, "rms_norm_torch"):
        return None
    gen = torch.Generator().manual_seed(n)
    scale = 10.0 ** torch.linspace(-3, 3, CHECK_ROWS)[:, None]  # [rows, 1]
    x = (torch.randn((CHECK_ROWS, n), generator=gen) * scale).contiguous()  # [rows, n]
    weight = torch.randn(n, generator=gen)
    with torch.inference_mode():
        want = torch.cat([F.rms_norm(row[None], (n,), weight, eps) for row in x])  # one row at a time, serial
    for lanes in TORCH_LANES:
        got = torch.empty_like(x)
        kernels.rms_norm_torch(x.data_ptr(), weight.data_ptr(), got.data_ptr(), CHECK_ROWS, n, float(eps), lanes)
        if torch.equal(got, want):
            return lanes
    return None


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm(x, (n,), weight, eps)`` of x [rows, n] on the kernels, bit for bit; raises
    RuntimeError where ``torch_norm_lanes`` found no matching width."""
    _check("x", x)
    _check("weight", weight)
    rows, n = x.shape
    if weight.shape != (n,):
        raise ValueError(f"weight must be [{n}]")
    lanes = torch_norm_lanes(n, eps)
    if lanes is None:
        raise RuntimeError("the kernels cannot reproduce this torch's rms_norm here")
    out = torch.empty_like(x)
    _kernels().rms_norm_torch(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, float(eps), lanes)
    return out
