"""Gated full attention (every ``full_attention_interval``-th layer) and its KV cache.

Per token: ``attn_q`` gives ``[heads, 2 * head_dim]``, split per head into ``[q ; gate]``; q and k
get a per-head RMSNorm over head_dim BEFORE the partial NeoX RoPE; grouped-query attention with
scale ``1/sqrt(head_dim)``; the output is ``attn_output(attn * sigmoid(gate))``.

The cache is written at absolute positions, so a rejected tail is simply overwritten by the
next forward (the gpt-fast idea): rolling attention back is only a change of length.
"""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

from tsspec_gguf.attention import causal_attention

from .ops import PartialRope, exact_rows, linear, rms_norm, rowwise

MIN_CACHE_ROWS = 64  # first allocation of a KV cache; it then doubles


@attrs.define
class AttentionWeights:
    # matrices: tensors, or ``RowLinear``s (then the attention runs on the row-invariant kernel)
    q: torch.Tensor  # [heads * 2 * head_dim, H]: q and gate interleaved per head
    k: torch.Tensor  # [kv_heads * head_dim, H]
    v: torch.Tensor  # [kv_heads * head_dim, H]
    o: torch.Tensor  # [H, heads * head_dim]
    q_norm: torch.Tensor  # [head_dim]
    k_norm: torch.Tensor  # [head_dim]


class KVCache:
    """Keys and values of one attention layer at absolute positions ``0 .. capacity-1``."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.keys = torch.zeros(kv_heads, 0, head_dim, dtype=dtype, device=device)  # [kv_heads, capacity, hd]
        self.values = torch.zeros(kv_heads, 0, head_dim, dtype=dtype, device=device)  # [kv_heads, capacity, hd]

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def ensure(self, rows: int, limit: int) -> None:
        """Grow (doubling, at most ``limit`` rows) so that ``rows`` positions fit."""
        if rows <= self.capacity:
            return
        new = min(max(rows, 2 * self.capacity, MIN_CACHE_ROWS), max(limit, rows))
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_zeros(old.shape[0], new, old.shape[2])
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values [kv_heads, rows, hd] at positions start.."""
        rows = keys.shape[1]
        self.keys[:, start : start + rows] = keys
        self.values[:, start : start + rows] = values


def gated_attention(
    w: AttentionWeights,
    x: torch.Tensor,  # [rows, H], already normed
    cache: KVCache,
    start: int,
    rope: PartialRope,
    cos: torch.Tensor,  # [rows, rope_dims]
    sin: torch.Tensor,  # [rows, rope_dims]
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> torch.Tensor:
    """One gated attention block over rows at positions ``start ..``; writes their K/V into
    ``cache`` and attends over positions ``<= own``. Returns [rows, H]."""
    rows = x.shape[0]
    q_and_gate = linear(x, w.q).view(rows, num_heads, 2 * head_dim)
    q = rms_norm(q_and_gate[..., :head_dim], w.q_norm, eps)  # [rows, heads, hd]
    gate = q_and_gate[..., head_dim:].reshape(rows, num_heads * head_dim)
    k = rms_norm(linear(x, w.k).view(rows, num_kv_heads, head_dim), w.k_norm, eps)
    v = linear(x, w.v).view(rows, num_kv_heads, head_dim)
    q = rope.apply(q.transpose(0, 1), cos, sin)  # [heads, rows, hd]
    k = rope.apply(k.transpose(0, 1), cos, sin)  # [kv_heads, rows, hd]
    cache.write(start, k, v.transpose(0, 1))
    end = start + rows
    if exact_rows(w.o):  # row-invariant matrices: the row-invariant attention kernel too
        scaled = (q * (1.0 / math.sqrt(head_dim))).transpose(0, 1).reshape(rows, num_heads * head_dim)
        attn = causal_attention(scaled.contiguous(), cache.keys, cache.values, start, num_heads)  # [rows, heads * hd]
        return linear(attn * rowwise(torch.sigmoid, gate), w.o)
    keys, values = cache.keys[:, :end], cache.values[:, :end]  # [kv_heads, end, hd]
    mask = None
    if rows > 1:
        key_pos = torch.arange(end, device=x.device)
        own_pos = torch.arange(start, end, device=x.device)
        mask = key_pos[None, :] <= own_pos[:, None]  # [rows, end]
    attn = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=1.0 / math.sqrt(head_dim),
        enable_gqa=num_heads != num_kv_heads,
    )  # [heads, rows, hd]
    attn = attn.transpose(0, 1).reshape(rows, num_heads * head_dim)
    return linear(attn * torch.sigmoid(gate), w.o)
