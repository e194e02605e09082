"""Rotary position embedding tables, in the rotate-halves form (see weights.py for why).

For the rotated part of a head (its first ``rope_dim`` dims) split into halves a, b of width
r = rope_dim / 2, position p rotates pair (a_i, b_i) by angle ``p * inv_freq_i`` with
``inv_freq_i = base^(-2i / rope_dim) / factor_i / linear``: ``factor_i`` from the file's
``rope_freqs.weight`` (llama-3.1 style scaling), ``linear`` from ``rope.scaling.factor``.
"""

from __future__ import annotations

import torch

INITIAL_POSITIONS = 256


class RotaryTable:
    """cos/sin per position, grown on demand; ``apply`` rotates q/k rows in one pass."""

    def __init__(
        self,
        rope_dim: int,
        base: float,
        *,
        linear_factor: float = 1.0,
        freq_factors: torch.Tensor | None = None,  # [rope_dim / 2]
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.rope_dim = rope_dim
        self.half = rope_dim // 2
        exponents = torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim
        inv_freq = 1.0 / (float(base) ** exponents)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.to(torch.float64)
        self.inv_freq = inv_freq / float(linear_factor)  # [half] float64
        self.device = torch.device(device)
        self.dtype = dtype
        self.cos = torch.empty(0, 1, self.half, dtype=dtype, device=self.device)  # [positions, 1, half]
        self.sin = torch.empty_like(self.cos)

    def ensure(self, positions: int) -> None:
        """Tables cover positions [0, positions)."""
        have = self.cos.shape[0]
        if positions <= have:
            return
        size = max(positions, 2 * have, INITIAL_POSITIONS)
        angles = torch.arange(size, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        self.cos = angles.cos().to(self.dtype).unsqueeze(1).to(self.device)
        self.sin = angles.sin().to(self.dtype).unsqueeze(1).to(self.device)

    def tables(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for positions start..start+count-1: each [count, 1, half]."""
        self.ensure(start + count)
        return self.cos[start : start + count], self.sin[start : start + count]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [rows, heads, head_dim] -> rotated copy (dims past rope_dim pass through)."""
        a = x[..., : self.half]
        b = x[..., self.half : self.rope_dim]
        parts = [a * cos - b * sin, b * cos + a * sin]
        if self.rope_dim < x.shape[-1]:
            parts.append(x[..., self.rope_dim :])
        return torch.cat(parts, dim=-1)
