"""Rotary tables for the sliding layers, in llama.cpp's layout: ADJACENT pairs (x0, x1)...

HF rotates the two halves of a head (NeoX style); the converter permutes Q and K rows within each
head (``convert.permute_for_gguf``) so that ggml's NORM rope, which turns adjacent pairs, gives
the same attention scores. Pair i at position p turns by ``p * base^(-2i / hd)``; angles are
computed in float64 and stored as (cos, sin) pairs ``[positions, hd / 2, 2]``, the layout the
compiled ``rope`` kernel reads.
"""

from __future__ import annotations

import torch

INITIAL_POSITIONS = 256


class RotaryTable:
    def __init__(self, head_dim: int, base: float, dtype: torch.dtype = torch.float32):
        self.half = head_dim // 2
        self.inv_freq = float(base) ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [half]
        self.dtype = dtype
        self.size = 0
        self.table = torch.empty((0, self.half, 2), dtype=dtype)  # [positions, half, (cos, sin)]

    def ensure(self, positions: int) -> torch.Tensor:
        """The table, covering positions [0, positions) at least."""
        if positions > self.size:
            size = max(positions, 2 * self.size, INITIAL_POSITIONS)
            angles = torch.arange(size, dtype=torch.float64)[:, None] * self.inv_freq[None, :]  # [size, half]
            self.table = torch.stack([angles.cos(), angles.sin()], dim=-1).to(self.dtype).contiguous()
            self.size = size
        return self.table

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x [rows, heads, hd] at positions start.. -> a rotated copy (torch path)."""
        rows = x.shape[0]
        cs = self.ensure(start + rows)[start : start + rows].to(x.device, x.dtype)  # [rows, half, 2]
        cos, sin = cs[:, None, :, 0], cs[:, None, :, 1]
        pairs = x.unflatten(-1, (self.half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
