"""Small numeric building blocks shared by the trunk and the MTP head.

All norms here are the GGUF (llama.cpp) convention ``x_hat * w``: the Hugging Face ``(1 + w)``
of Qwen3-Next / Qwen 3.5 RMSNorms is folded into the stored weight by the converter (trap 1 of
the model's reference equations). The Gated DeltaNet output norm is plain in both worlds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # the q/k L2 normalisation of the delta rule (HF / FLA use 1e-6 whatever the config)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, computed in at least float32."""
    work = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight).to(x.dtype)


def l2_normalize(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the FLA convention, not F.normalize)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


ROWWISE_MAX = 16  # calls of up to this many rows (verifies, re-forwards) go row by row in ``rowwise``


def rowwise(fn, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """``fn(x)`` with each row of x [rows, ...] in a call of its own (when ``exact`` and rows <=
    ROWWISE_MAX). torch's elementwise transcendental ops (exp, sigmoid, silu, softplus, cos) take
    a vector path or a scalar tail depending on how many values one call has, so a k-row call can
    round a row differently from that row's one-row call. Longer calls (prefills) run whole."""
    rows = x.shape[0]
    if not exact or rows == 1 or rows > ROWWISE_MAX:
        return fn(x)
    return torch.cat([fn(x[i : i + 1]) for i in range(rows)])


def exact_rows(w) -> bool:
    """Whether a matrix is a row-invariant ``RowLinear`` (its block then keeps rows exact)."""
    return not isinstance(w, torch.Tensor)


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ W^T``; x [rows, K], w a weight tensor [N, K] or a callable matrix (``RowLinear``,
    the row-invariant kernel) -> [rows, N]."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)


def swiglu(x: torch.Tensor, gate, up, down) -> torch.Tensor:
    """``down(silu(gate x) * up x)``; x [rows, H], gate/up [F, H], down [H, F] -> [rows, H]."""
    return linear(rowwise(F.silu, linear(x, gate), exact_rows(gate)) * linear(x, up), down)


class PartialRope:
    """NeoX (rotate-half) RoPE over the first ``dims`` of each head; the rest passes through.

    Inverse frequencies ``base^(-2i/dims)``. Qwen 3.5's interleaved M-RoPE reduces to exactly
    this for text-only input (all three position grids equal).
    """

    def __init__(self, dims: int, base: float, dtype: torch.dtype):
        self.dims = dims
        exponents = torch.arange(0, dims, 2, dtype=torch.float32) / dims
        self.work_dtype = torch.promote_types(dtype, torch.float32)  # angles as HF computes them
        self.inv_freq = (1.0 / (base ** exponents)).to(self.work_dtype)  # [dims/2]
        self.dtype = dtype

    def tables(self, positions: torch.Tensor, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, dims] for integer positions [rows] (``exact``: row by row, see
        ``rowwise``)."""
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(self.work_dtype)[:, None] * inv_freq[None, :]  # [rows, dims/2]
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = rowwise(torch.cos, angles, exact), rowwise(torch.sin, angles, exact)
        return cos.to(self.dtype), sin.to(self.dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [heads, rows, head_dim]; cos/sin [rows, dims]."""
        rot, rest = x[..., : self.dims], x[..., self.dims :]
        half = self.dims // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        return torch.cat([rot * cos + rotated * sin, rest], dim=-1)
