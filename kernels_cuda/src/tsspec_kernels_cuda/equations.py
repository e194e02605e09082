"""The device check's oracle: every op written again from its equations, in float64.

``reference`` holds the contracts the kernels were written against (the model plugins' torch
paths, step for step); a kernel and its contract that share a mistake agree with each other.
These are written independently, from the maths, one row / head / element at a time where that
is the plainer statement: the device check compares the CUDA kernels with them, and its CPU dry
run compares the contracts with them. Same signatures as the ops; results in float64 (buffers
the op writes get the float64 values cast to their dtype).

GDN, per row t and value head h (S_h [dk, dv], conv taps j = 0..K-1 over window rows t+j)::

    c = SiLU(sum_j w[:, j] * window[t + j]);  q, k, v = split(c);  q, k L2-normalised (+1e-6)
    q *= scale;  head h reads key head key_index[h];  beta = sigmoid(b);  g = a_neg softplus(a + dt)
    S <- e^g S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

L2_EPS = 1e-6
D = torch.float64


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def _softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))  # torch's threshold 20


def _gdn(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state, num_k, dk, scale):
    """(outputs [rows, nv, dv], states after each row, window [K-1+rows, C]) in float64."""
    window = torch.cat([conv_in.to(D), mixed.to(D)])
    w, taps = conv_w.to(D), conv_w.shape[1]
    nv = a_neg.shape[0]
    key_dim = num_k * dk
    dv = (mixed.shape[1] - 2 * key_dim) // nv
    S = state.to(D).clone()
    outs, states = [], []
    for t in range(mixed.shape[0]):
        pre = sum(w[:, j] * window[t + j] for j in range(taps))  # [C]
        c = pre * _sigmoid(pre)
        q = c[:key_dim].reshape(num_k, dk)
        k = c[key_dim : 2 * key_dim].reshape(num_k, dk)
        v = c[2 * key_dim :].reshape(nv, dv)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * scale
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
        beta = _sigmoid(beta_logits[t].to(D))
        g = a_neg.to(D) * _softplus(alpha_logits[t].to(D) + dt_bias.to(D))
        new = torch.empty_like(S)
        o = torch.empty(nv, dv, dtype=D, device=S.device)
        for h in range(nv):
            kh, qh = k[int(key_index[h])], q[int(key_index[h])]
            s = math.exp(float(g[h])) * S[h]  # [dk, dv]
            s = s + torch.outer(kh, beta[h] * (v[h] - s.T @ kh))
            new[h], o[h] = s, s.T @ qh
        S = new
        outs.append(o)
        states.append(S)
    return torch.stack(outs), states, window


def gdn_verify(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state, slots, window,
               *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    o, states, win = _gdn(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state,
                          num_k, dk, scale)
    for t, s in enumerate(states):
        slots[t].copy_(s)
    window[: win.shape[0]].copy_(win)
    return o


def gdn_step(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state_in, state_out,
             conv_out, *, num_k: int, dk: int, scale: float) -> torch.Tensor:
    o, states, win = _gdn(mixed, conv_in, conv_w, beta_logits, alpha_logits, a_neg, dt_bias, key_index, state_in,
                          num_k, dk, scale)
    state_out.copy_(states[-1])
    conv_out.copy_(win[win.shape[0] - conv_out.shape[0] :])  # the newest K-1 pre-conv rows
    return o


def gdn_commit(slots: Sequence[torch.Tensor], windows: Sequence[torch.Tensor], states: Sequence[torch.Tensor],
               convs: Sequence[torch.Tensor], m: int) -> None:
    """After keeping rows 0..m: the state after row m, and the K-1 pre-conv rows ending at row m
    (window row K-1+m is row m)."""
    for slot, window, state, conv in zip(slots, windows, states, convs):
        state.copy_(slot[m])
        last = conv.shape[0] + m  # window index of row m
        conv.copy_(torch.stack([window[last - i] for i in reversed(range(conv.shape[0]))]))


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.to(D)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w.to(D)


def _rope_neox(x: torch.Tensor, position: int, base: float) -> torch.Tensor:
    """x [heads, hd]: pair (i, i + hd/2) rotated by position * base^(-2i/hd)."""
    half = x.shape[-1] // 2
    out = x.clone()
    for i in range(half):
        theta = position * base ** (-2.0 * i / x.shape[-1])
        c, s = math.cos(theta), math.sin(theta)
        out[:, i] = x[:, i] * c - x[:, i + half] * s
        out[:, i + half] = x[:, i + half] * c + x[:, i] * s
    return out


def dflash_inject(features, fc, enc_norm, layers, rings, positions, *, eps: float, rope_base: float) -> None:
    """Context rows = RMSNorm(fc f) * enc_norm; per layer K = RoPE(RMSNorm_head(wk x + bk) * k_norm),
    V = wv x + bv, stored at slot position mod ring rows (position itself for a linear store)."""
    context = _rms(features.to(D) @ fc.to(D).T, enc_norm, eps)  # [n, H]
    for (wk, bk, wv, bv, k_norm), (keys, values, pos_store, ring_rows) in zip(layers, rings):
        nkv, hd, vd = keys.shape[1], keys.shape[2], values.shape[2]
        for row, position in enumerate(int(p) for p in positions):
            x = context[row]
            k = wk.to(D) @ x + (bk.to(D) if bk is not None else 0.0)
            v = wv.to(D) @ x + (bv.to(D) if bv is not None else 0.0)
            k = _rope_neox(_rms(k.reshape(nkv, hd), k_norm, eps), position, rope_base)
            slot = position % ring_rows if ring_rows else position
            keys[slot] = k.to(keys.dtype)
            values[slot] = v.reshape(nkv, vd).to(values.dtype)
            pos_store[slot] = position


def dflash_block_attention(q, ctx_k, ctx_v, ctx_pos, blk_k, blk_v, *, start: int, window: int | None,
                           scale: float) -> torch.Tensor:
    """Block row i (position start + i), head h (KV head h // (heads / kv_heads)) attends to the
    stored rows at positions in [max(start - window, 0), start) and to every block row; with a
    window, only keys within ``window`` positions of its own. Softmax of scale * q.k. [B, nh*vd]."""
    rows, heads, _ = q.shape
    group = heads // ctx_k.shape[1]
    lo = max(start - window, 0) if window is not None else 0
    ctx = [r for r in range(ctx_pos.shape[0]) if lo <= int(ctx_pos[r]) < start]
    key_pos = [int(ctx_pos[r]) for r in ctx] + [start + j for j in range(rows)]
    keys = torch.cat([ctx_k[ctx].to(D), blk_k.to(D)])  # [N, nkv, hd]
    values = torch.cat([ctx_v[ctx].to(D), blk_v.to(D)])
    out = torch.empty(rows, heads, values.shape[2], dtype=D, device=q.device)
    for i in range(rows):
        seen = [n for n, p in enumerate(key_pos) if window is None or abs(start + i - p) <= window]
        for h in range(heads):
            scores = (keys[seen, h // group] @ q[i, h].to(D)) * scale  # [N]
            weights = torch.exp(scores - scores.max())
            out[i, h] = (weights / weights.sum()) @ values[seen, h // group]
    return out.reshape(rows, -1)


def dflash_grouped_conv(x, coef, base, group_size: int, residual=None) -> torch.Tensor:
    """out[t, c] = sum_{j <= min(K-1, t)} (base[j, c] + coef[t, j, c // group_size]) x[t - j, c]."""
    rows, width = x.shape
    channel_group = torch.arange(width, device=x.device) // group_size
    out = torch.zeros(rows, width, dtype=D, device=x.device)
    for t in range(rows):
        for j in range(min(base.shape[0], t + 1)):
            out[t] += (base[j].to(D) + coef[t, j].to(D)[channel_group]) * x[t - j].to(D)
    return out if residual is None else out + residual.to(D)


def selector_lattice(logits, hidden, P, A, B, anchor: int, top_k: int):
    """Candidates: each row's k largest logits, largest first. proj_e = P h_e. first[c] =
    logit[0, c] + sum_r A[anchor, r] proj_0[r] B[c_0, r]; trans[e, p, c] = logit[e+1, c] +
    sum_r A[c_e(p), r] proj_{e+1}[r] B[c_{e+1}(c), r]."""
    n, vocab = logits.shape
    k = min(top_k, vocab)
    cand = torch.stack([torch.argsort(logits[e].to(D), descending=True, stable=True)[:k] for e in range(n)])
    unary = torch.stack([logits[e].to(D)[cand[e]] for e in range(n)])  # [n, k]
    A, B = A.to(D), B.to(D)
    proj = hidden.to(D) @ P.to(D).T  # [n, r]
    first = unary[0] + B[cand[0]] @ (A[anchor] * proj[0])
    trans = torch.empty(max(n - 1, 0), k, k, dtype=D, device=logits.device)
    for e in range(n - 1):
        for p in range(k):
            trans[e, p] = unary[e + 1] + B[cand[e + 1]] @ (A[cand[e, p]] * proj[e + 1])
    return cand, first, trans
