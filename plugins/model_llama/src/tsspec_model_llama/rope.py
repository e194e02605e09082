"""Rotary position embedding in llama.cpp's layout: ADJACENT pairs (x0, x1), (x2, x3)...

llama.cpp's converter permutes the rows of Q and K within each head so that its RoPE rotates
adjacent pairs; HF's checkpoint rotates the two halves instead. We keep the file's layout (Q and
K share the permutation, so attention scores are unchanged) because adjacent pairs are complex
numbers: one complex multiply per call rotates every head of Q and K at once.

Pair i of a head's first ``rope_dim`` dims at position p turns by ``p * inv_freq_i`` with
``inv_freq_i = base^(-2i / rope_dim) / factor_i / linear``: ``factor_i`` from the file's
``rope_freqs.weight`` (llama-3.1 style scaling), ``linear`` from ``rope.scaling.factor``.
"""

from __future__ import annotations

import torch

INITIAL_POSITIONS = 256
COMPLEX_DTYPES = {torch.float32: torch.complex64, torch.float64: torch.complex128}


class RotaryTable:
    """Unit complex rotations per position, grown on demand."""

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
        self.complex_dtype = COMPLEX_DTYPES.get(dtype)  # None: real arithmetic (bf16, f16)
        self.size = 0
        self._rot = self._cos = self._sin = None
        self._address: tuple[int, int] | None = None  # (size, address of _rot) for the kernels

    def ensure(self, positions: int) -> None:
        """Tables cover positions [0, positions)."""
        if positions <= self.size:
            return
        size = max(positions, 2 * self.size, INITIAL_POSITIONS)
        angles = torch.arange(size, dtype=torch.float64)[:, None] * self.inv_freq[None, :]  # [size, half]
        cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # [size, 1, half]
        if self.complex_dtype is not None:
            self._rot = torch.complex(cos, sin).to(self.device, self.complex_dtype)
        else:
            self._cos, self._sin = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)
        self.size = size

    def address(self, positions: int) -> int:
        """The address of the (cos, sin) table [size, half, 2] covering [0, positions) (the
        compiled kernels' layout; float32 tables only), grown first when needed."""
        self.ensure(positions)
        if self._address is None or self._address[0] != self.size:
            self._address = (self.size, torch.view_as_real(self._rot).data_ptr())
        return self._address[1]

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x [rows, heads, head_dim] (last dim contiguous) at positions start.. -> rotated copy."""
        rows = x.shape[0]
        self.ensure(start + rows)
        rotated = x[..., : self.rope_dim].unflatten(-1, (self.half, 2))  # [rows, heads, half, 2]
        if self.complex_dtype is not None and x.dtype == self.dtype:
            turned = torch.view_as_real(torch.view_as_complex(rotated) * self._rot[start : start + rows])
        else:
            cos, sin = self._cos[start : start + rows], self._sin[start : start + rows]
            a, b = rotated[..., 0], rotated[..., 1]
            turned = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
        turned = turned.flatten(-2)
        if self.rope_dim == x.shape[-1]:
            return turned
        return torch.cat([turned, x[..., self.rope_dim :]], dim=-1)
