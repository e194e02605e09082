"""The op contracts in plain torch (any device): what each registered kernel computes.

Each function has the signature of the CUDA op of the same name in ``ops`` and follows the
model plugins' torch paths step for step (``tsspec_model_qwen35.deltanet``,
``tsspec_block.head`` / ``ops`` / ``selector``); the tests check that on the CPU, and the device
check compares every kernel with these on CUDA tensors. Registered for ``device="cpu"`` they
also let the CPU tests drive the plugins' kernel call sites.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "gdn_verify", "gdn_step", "gdn_commit", "dflash_inject", "dflash_block_attention",
    "dflash_grouped_conv", "selector_lattice", "InjectLayer", "RingView", "EMPTY",
]

L2_EPS = 1e-6
EMPTY = -1  # ring slot holding no position


def _gdn_prepare(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, num_k, dk, scale):
    rows = mixed.shape[0]
    K = conv_w.shape[1]
    window = torch.cat([conv_in, mixed], dim=0)  # [K-1+rows, conv_dim]
    conv = F.silu((window.unfold(0, K, 1) * conv_w).sum(-1))  # [rows, conv_dim]
    key_dim = num_k * dk
    qc, kc, vc = conv.split([key_dim, key_dim, conv.shape[1] - 2 * key_dim], dim=-1)

    def l2(x):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)

    q = (l2(qc.reshape(rows, num_k, dk)) * scale).index_select(1, key_index)  # [rows, nv, dk]
    k = l2(kc.reshape(rows, num_k, dk)).index_select(1, key_index)
    nv = a_neg.shape[0]
    v = vc.reshape(rows, nv, -1)  # [rows, nv, dv]
    beta = torch.sigmoid(beta_logits)  # [rows, nv]
    decay = (a_neg * F.softplus(alpha_logits + dt_bias)).exp()
    return q, k, v, beta, decay, window


def _gdn_rows(q, k, v, beta, decay, state, outs: Sequence[torch.Tensor]):
    out = v.new_empty(v.shape)
    s = state
    for t in range(q.shape[0]):
        s = torch.mul(s, decay[t][:, None, None], out=outs[t])
        kt = k[t].unsqueeze(1)  # [nv, 1, dk]
        delta = (v[t] - torch.bmm(kt, s).squeeze(1)) * beta[t][:, None]  # [nv, dv]
        s.baddbmm_(kt.transpose(1, 2), delta.unsqueeze(1))
        out[t] = torch.bmm(q[t].unsqueeze(1), s).squeeze(1)
    return out


def gdn_verify(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state, slots, window,
               *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    """Rows [rows, conv_dim] after the live state: returns o [rows, nv, dv]; writes the state
    after each row into ``slots[:rows]`` ([R, nv, dk, dv]) and ``[conv_in; mixed]`` into
    ``window[:K-1+rows]``; ``state`` and ``conv_in`` are only read."""
    rows = mixed.shape[0]
    q, k, v, beta, decay, win = _gdn_prepare(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias,
                                             key_index, num_k, dk, scale)
    out = _gdn_rows(q, k, v, beta, decay, state.clone(), [slots[t] for t in range(rows)])
    window[: win.shape[0]].copy_(win)
    return out


def gdn_step(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state_in, state_out,
             conv_out, *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    """One committing row from (``state_in``, ``conv_in``), which may be slot m of the last
    verify (the deferred commit): new state into ``state_out`` (may be ``state_in``), new conv
    state into ``conv_out`` (must not overlap ``conv_in``). Returns o [1, nv, dv]."""
    q, k, v, beta, decay, win = _gdn_prepare(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias,
                                             key_index, num_k, dk, scale)
    out = _gdn_rows(q, k, v, beta, decay, state_in.clone(), [state_out])
    conv_out.copy_(win[1:])
    return out


def gdn_commit(slots: Sequence[torch.Tensor], windows: Sequence[torch.Tensor], states: Sequence[torch.Tensor],
               convs: Sequence[torch.Tensor], m: int) -> None:
    """For every layer: live state <- slot m, live conv state <- window rows m+1 .. m+K-1."""
    for slot, window, state, conv in zip(slots, windows, states, convs):
        state.copy_(slot[m])
        conv.copy_(window[m + 1 : m + 1 + conv.shape[0]])


class InjectLayer(tuple):
    """(wk [nkv*hd, H], bk [nkv*hd] | None, wv [nkv*vd, H], bv | None, k_norm [hd]) of one layer."""

    def __new__(cls, wk, bk, wv, bv, k_norm):
        return super().__new__(cls, (wk, bk, wv, bv, k_norm))


class RingView(tuple):
    """(keys [rows, nkv, hd], values [rows, nkv, vd], positions [rows] long, ring rows or 0 for a
    linear store addressed by position) of one layer's drafter K/V store."""

    def __new__(cls, keys, values, positions, ring_rows):
        return super().__new__(cls, (keys, values, positions, int(ring_rows)))


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_neox(x, positions, base):
    hd = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)[:, None, :]
    half = hd // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def dflash_inject(features, fc, enc_norm, layers: Sequence[InjectLayer], rings: Sequence[RingView], positions,
                  *, eps: float, rope_base: float) -> None:
    """PASS B for rows at ``positions`` [n]: encoder, then K/V of every layer into its store."""
    context = _rms(F.linear(features, fc), enc_norm, eps)  # [n, H]
    n = context.shape[0]
    for (wk, bk, wv, bv, k_norm), (keys, values, pos_store, ring_rows) in zip(layers, rings):
        nkv, hd = keys.shape[1], keys.shape[2]
        k = _rope_neox(_rms(F.linear(context, wk, bk).view(n, nkv, hd), k_norm, eps), positions, rope_base)
        v = F.linear(context, wv, bv).view(n, nkv, values.shape[2])
        slots = positions % ring_rows if ring_rows else positions
        keys[slots] = k
        values[slots] = v
        pos_store[slots] = positions


def dflash_block_attention(q, ctx_k, ctx_v, ctx_pos, blk_k, blk_v, *, start: int, window: int | None,
                           scale: float) -> torch.Tensor:
    """Block rows (positions start ..) over the store's context rows and the block: [B, nh*vd]."""
    rows, heads = q.shape[0], q.shape[1]
    lo = max(start - window, 0) if window is not None else 0
    keep = torch.nonzero((ctx_pos >= lo) & (ctx_pos < start)).flatten()
    keys = torch.cat([ctx_k[keep], blk_k])
    values = torch.cat([ctx_v[keep], blk_v])
    positions = torch.arange(start, start + rows, device=q.device)
    key_pos = torch.cat([ctx_pos[keep], positions])
    if window is None:
        visible = torch.ones((rows, keys.shape[0]), dtype=torch.bool, device=q.device)
    else:
        visible = (positions[:, None] - key_pos[None, :]).abs() <= window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=visible[None, None], scale=scale, enable_gqa=heads != keys.shape[1],
    )
    return out[0].transpose(0, 1).reshape(rows, -1)


def dflash_grouped_conv(x, coef, base, group_size: int, residual=None) -> torch.Tensor:
    """DFlash2's grouped dynamic conv along the block (+ ``residual`` when given): [B, H]."""
    rows, kernel = x.shape[0], base.shape[0]
    out = base[0] * x + coef[:, 0].repeat_interleave(group_size, dim=-1) * x
    for t in range(1, min(kernel, rows)):
        out[t:] = out[t:] + (base[t] + coef[t:, t].repeat_interleave(group_size, dim=-1)) * x[: rows - t]
    return out if residual is None else residual + out


def selector_lattice(logits, hidden, P, A, B, anchor: int, top_k: int):
    """(candidates [n, k] long, first [k], transitions [n-1, k, k]): the compact lattice."""
    k = min(top_k, logits.shape[-1])
    unary, cand = torch.topk(logits, k, dim=-1)
    proj = hidden.to(P.dtype) @ P.T  # [n, r]
    succ = B[cand]  # [n, k, r]
    unary = unary.to(proj.dtype)
    first = unary[0] + succ[0] @ (A[anchor] * proj[0])
    if cand.shape[0] == 1:
        return cand, first, proj.new_zeros((0, k, k))
    pred = A[cand[:-1]] * proj[1:, None, :]
    return cand, first, unary[1:, None, :] + torch.einsum("epr,ecr->epc", pred, succ[1:])
