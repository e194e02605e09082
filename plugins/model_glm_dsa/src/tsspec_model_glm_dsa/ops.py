"""Numeric building blocks of GLM 5.x: RMSNorm, the indexer's LayerNorm, interleaved RoPE.

* ``rms_norm`` -- ``x / rms(x) * w`` in at least float32, returned in x's dtype (GGUF norms are
  plain, nothing folded).
* ``layer_norm`` -- the indexer key norm (``nn.LayerNorm``, weight and bias, eps 1e-6).
* ``Rope`` -- RoPE on consecutive channel pairs ``(2i, 2i+1)`` of the first ``dims`` channels
  given to it, angles ``pos * base^(-2i/dims)`` in float32 and their cos / sin in float32 (as
  transformers computes them), cast to the model's dtype. transformers returns the rotated pairs
  de-interleaved (evens then odds); queries and keys get the same layout either way, so every
  dot product is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    work = x.to(work_dtype(x.dtype))
    normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(work.dtype) * normed).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight.to(x.dtype), None if bias is None else bias.to(x.dtype), eps)


class Rope:
    """Interleaved RoPE on the first ``dims`` channels of the last dim."""

    def __init__(self, dims: int, base: float, dtype: torch.dtype):
        self.dims = dims
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims))  # [dims/2]
        self.dtype = dtype

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, dims/2] for integer positions [rows]."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [rows, ..., d >= dims]; cos/sin [rows, dims/2] broadcast over the middle dims."""
        shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        rot, rest = x[..., : self.dims], x[..., self.dims :]
        even, odd = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
        return torch.cat([rotated, rest], dim=-1)
