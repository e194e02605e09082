"""The torch reference ops of the DFlash / DFlash2 drafter: small pure functions on tensors.

They are the fallback every accelerated kernel is checked against, so they favour clarity over
fusion. Shapes use ``B`` for block rows, ``N`` for key rows, ``H`` for the drafter width,
``nh`` / ``nkv`` for query / key-value heads and ``hd`` for the head size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "rms_norm",
    "rope_neox",
    "block_attention",
    "grouped_dynamic_conv",
    "swiglu",
    "logit_transform",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain RMSNorm ``x_hat * w`` over the last dim (DFlash norms carry no +1 offset)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_neox(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half (NeoX) RoPE over the whole head.

    x: [rows, heads, hd]; positions: [rows] absolute positions. Pair ``i`` is (x[i], x[i+hd/2])
    rotated by ``pos * base^(-2i/hd)``. The angles are computed in float64 so that a float32
    drafter at position 100k loses no more than a float64 one would.
    """
    hd = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)  # [hd/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [rows, hd/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)[:, None, :]  # [rows, 1, hd]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)[:, None, :]
    half = hd // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def block_attention(
    q: torch.Tensor,  # [B, nh, hd]
    k: torch.Tensor,  # [N, nkv, hd]
    v: torch.Tensor,  # [N, nkv, vd]
    visible: torch.Tensor,  # [B, N] bool: may row i see key j
    scale: float,
) -> torch.Tensor:
    """Grouped-query attention of the block rows over arbitrary key rows; returns [B, nh*vd].

    Query head ``h`` reads key-value head ``h // (nh // nkv)`` (HF ``repeat_kv`` order).
    """
    rows, heads, _ = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # [1, nh, B, hd]
        k.transpose(0, 1)[None],  # [1, nkv, N, hd]
        v.transpose(0, 1)[None],  # [1, nkv, N, vd]
        attn_mask=visible[None, None],
        scale=scale,
        enable_gqa=heads != k.shape[1],
    )  # [1, nh, B, vd]
    return out[0].transpose(0, 1).reshape(rows, -1)


def grouped_dynamic_conv(
    x: torch.Tensor,  # [B, H] the sequence to filter (block rows only)
    coef: torch.Tensor,  # [B, K, G] dynamic taps: one value per tap per channel group
    base: torch.Tensor,  # [K, H] static taps: one value per tap per channel
    group_size: int,
) -> torch.Tensor:
    """DFlash2's grouped dynamic depthwise convolution along the block, causal, no wrap.

    ``out[r][c] = sum_{t < K, t <= r} (base[t][c] + coef[r][t][c // group_size]) * x[r-t][c]``.
    Row 0 of the block is the anchor, so the filter never reaches across the block start: a tap
    that would read before row 0 is simply absent (not zero-padded context).
    """
    rows = x.shape[0]
    kernel = base.shape[0]
    out = base[0] * x + coef[:, 0].repeat_interleave(group_size, dim=-1) * x
    for t in range(1, min(kernel, rows)):
        weight = base[t] + coef[t:, t].repeat_interleave(group_size, dim=-1)  # [B-t, H]
        out[t:] = out[t:] + weight * x[: rows - t]
    return out


def swiglu(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """``down(silu(gate x) * up x)``; weights are [out, in] like every linear here."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def logit_transform(logits: torch.Tensor, scale: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """The target's own logit transform ``softcap(scale * z)`` (identity when both are unset).

    ``softcap(z) = tanh(z / cap) * cap``. It is monotonic, so an argmax never needs it; the
    selector's unary term and the confidences do.
    """
    if scale != 1.0:
        logits = logits * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits
