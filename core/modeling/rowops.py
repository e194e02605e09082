"""Per-row ops of a transformer block on the compiled CPU kernels: RMSNorm, rotary embedding
(adjacent pairs, llama.cpp's layout), SiLU-gated product.

Each computes every row the same way whatever the number of rows (see cpu_kernels.c), like
``qlinear`` and ``attention``: a model built from these keeps 1-row and k-row forwards equal bit
for bit. They take float32 CPU tensors and check them; hot loops that build their own tensors
may call ``native.kernels()`` directly with the same arguments.
"""

from __future__ import annotations

import torch

from . import native


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
