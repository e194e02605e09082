"""Gemma 4's two RoPEs, NEOX pairs (i, i + hd/2) as HF's ``rotate_half``.

Sliding layers: ``base_swa ** (-2j / hd_swa)`` over the first ``rope.dimension_count_swa``
dims. Full layers ("proportional"): ``base ** (-2j / hd_full) / f_j`` with the file's
``rope_freqs`` factors ``f`` (llama.cpp's encoding: 1 for rotated pairs, 1e30 for the
unrotated ones). Angles are computed in float64 and cast once.
"""

from __future__ import annotations

import torch


class RotaryTable:
    """cos/sin tables [positions, hd] for one layer type, grown on demand."""

    def __init__(self, head_dim: int, base: float, rotated: int, factors: torch.Tensor | None, dtype: torch.dtype):
        j = torch.arange(head_dim // 2, dtype=torch.float64)
        inv = base ** (-2.0 * j / head_dim)  # [hd/2]
        inv[rotated // 2 :] = 0.0
        if factors is not None:
            inv = inv / factors.to(torch.float64).reshape(-1)
        self.inv_freq = inv
        self.dtype = dtype
        self.half = head_dim // 2
        self.cos = self.sin = torch.empty(0, head_dim, dtype=dtype)

    def ensure(self, positions: int) -> None:
        if positions <= self.cos.shape[0]:
            return
        n = max(positions, 2 * self.cos.shape[0], 64)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * self.inv_freq[None, :]  # [n, hd/2]
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [rows, heads, hd] at ``positions`` [rows]."""
        self.ensure(int(positions.max()) + 1)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # [rows, 1, hd]
        half = self.half
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
