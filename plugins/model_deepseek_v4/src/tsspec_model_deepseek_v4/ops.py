"""Numeric building blocks of DeepSeek V4: norms, the interleaved tail RoPE, hyper-connections.

All follow transformers' ``models/deepseek_v4`` (5.24):

* ``rms_norm`` -- ``x / rms(x) * w`` computed in at least float32 (GGUF norms are plain, no +1).
* ``unit_rms_norm`` -- the weightless RMSNorm applied per head to Q and to the flattened
  hyper-connection streams.
* ``TailRope`` -- RoPE on the LAST ``dims`` channels of a head, consecutive channels paired
  (``(2i, 2i+1)`` rotated by ``pos * inv_freq[i]``); ``inverse=True`` rotates by ``-angle``
  (V4 un-rotates the attention output at the query position, K = V carries the rotation).
  Inverse frequencies are plain (sliding layers) or YaRN-scaled (compressed layers, with the
  attention factor forced to 1, as V4 does).
* ``hyper_mix`` -- manifold-constrained hyper-connections: from the ``hc`` residual streams of
  a row, ``pre`` (collapse weights), ``post`` (expand weights) and ``comb`` (stream mixing,
  projected onto doubly-stochastic matrices by Sinkhorn iterations).
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from .invariant import linear, norm_rows, per_row, row_invariant, silu_mul_rows


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms, softmaxes and the hyper-connection maths run in at least float32."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, in at least float32, returned in x's dtype.
    On the float32 path on the compiled per-row kernel (``invariant.norm_rows``), or, without
    it, one row at a time."""
    out = norm_rows(x, weight, eps)
    if out is not None:
        return out
    return per_row(lambda row: _rms_norm(row, weight, eps), x)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    work = x.to(work_dtype(x.dtype))
    normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(work.dtype) * normed).to(x.dtype)


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dim (no weight); float32 as ``rms_norm``."""
    out = norm_rows(x, None, eps)
    if out is not None:
        return out
    return per_row(lambda row: _unit_rms_norm(row, eps), x)


def _unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    scale = torch.rsqrt(x.to(work_dtype(x.dtype)).square().mean(-1, keepdim=True) + eps)
    return x * scale.to(x.dtype)


def yarn_inv_freq(base: float, dims: int, factor: float, original_context: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN inverse frequencies [dims/2] (NTK-by-parts ramp between interpolation and
    extrapolation; the correction range is truncated to whole dims)."""
    pos_freqs = base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dims - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of extrapolation per frequency
    return interpolation * (1 - keep) + extrapolation * keep


class TailRope:
    """Interleaved RoPE on the last ``dims`` channels of each head."""

    def __init__(self, dims: int, base: float, dtype: torch.dtype, *, yarn: dict | None = None):
        self.dims = dims
        if yarn:
            inv = yarn_inv_freq(base, dims, float(yarn["factor"]), int(yarn["original_context"]),
                                float(yarn.get("beta_fast", 32.0)), float(yarn.get("beta_slow", 1.0)))
        else:
            inv = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims))
        self.inv_freq = inv  # [dims/2] float32, as transformers computes the angles
        self.dtype = dtype
        empty = torch.zeros(0, dims // 2, dtype=dtype)
        self._table = (empty, empty)  # (cos, sin) [known, dims/2] (float32 path), replaced whole
        self._growing = threading.Lock()

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, dims/2] for integer positions [rows]: the angles in float32 (like HF),
        their cos / sin in the model's dtype (float32, or float64 for exact tests). On the float32
        path each position is computed once, on its own (a vectorised cos of several rows can differ
        in the last bit), and kept in a table that grows as positions are asked for. The table is
        shared by the trunk and its draft heads' sequence views (other threads): it grows under a
        lock and is replaced as one (cos, sin) pair, so a reader never sees half of a growth."""
        if self.dtype == torch.float32 and positions.numel() > 0:
            need = int(positions.max()) + 1
            table = self._table
            if need > table[0].shape[0]:
                with self._growing:
                    table = self._table
                    known = table[0].shape[0]
                    if need > known:  # extend the table, one new position at a time
                        new = [self._compute(torch.tensor([p])) for p in range(known, max(need, 2 * known))]
                        table = (torch.cat([table[0]] + [c for c, _ in new]), torch.cat([table[1]] + [s for _, s in new]))
                        self._table = table
            return table[0][positions], table[1][positions]
        return self._compute(positions)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = (positions.to(torch.float32)[:, None] * self.inv_freq[None, :]).to(work_dtype(self.dtype))
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        """x [rows, ..., head_dim]; cos/sin [rows, dims/2] broadcast over the middle dims."""
        shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        if inverse:
            sin = -sin
        head, tail = x[..., : x.shape[-1] - self.dims], x[..., x.shape[-1] - self.dims :]
        work = tail.to(work_dtype(x.dtype))
        even, odd = work[..., 0::2], work[..., 1::2]
        rot_even = even * cos - odd * sin
        rot_odd = odd * cos + even * sin
        rotated = torch.stack([rot_even, rot_odd], dim=-1).flatten(-2).to(x.dtype)
        return torch.cat([head, rotated], dim=-1)


def ordered_sum(t: torch.Tensor, dim: int, *, keepdim: bool = False) -> torch.Tensor:
    """``t.sum(dim)``; on the float32 path as explicit elementwise adds in index order, so every
    row is summed the same way whatever the row count (torch's reduction kernels pick their
    strategy by shape). The hyper-connection dims summed here are tiny (``hc``)."""
    if not row_invariant(t):
        return t.sum(dim=dim, keepdim=keepdim)
    parts = t.unbind(dim)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total.unsqueeze(dim) if keepdim else total


def hyper_mix(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
              iters: int, hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [rows, hc, H] -> (post [rows, hc], comb [rows, hc, hc], collapsed [rows, H]).

    ``fn`` [(2 + hc) * hc, hc * H], ``base`` [(2 + hc) * hc], ``scale`` [3] (pre, post, comb).
    On the float32 path the sigmoids and the softmax run one row at a time, the matrix on the
    row-invariant kernel, and the Sinkhorn sums as ordered adds (batched: they are exact
    elementwise ops)."""
    rows, hc, width = streams.shape
    wd = work_dtype(streams.dtype)
    flat = unit_rms_norm(streams.reshape(rows, hc * width).to(wd), norm_eps)
    mixes = linear(flat, fn.to(wd))  # [rows, (2 + hc) * hc]
    base = base.to(wd)
    pre_b, post_b, comb_b = base.split([hc, hc, hc * hc])
    scale = scale.to(wd)

    def gates(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pre_w, post_w, comb_w = m.split([hc, hc, hc * hc], dim=-1)
        pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
        post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
        comb = torch.softmax(comb_w.reshape(-1, hc, hc) * scale[2] + comb_b.view(hc, hc), dim=-1) + hc_eps
        return pre, post, comb

    pre, post, comb = per_row(gates, mixes)  # [rows, hc], [rows, hc], [rows, hc, hc]
    comb = comb / (ordered_sum(comb, -2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (ordered_sum(comb, -1, keepdim=True) + hc_eps)
        comb = comb / (ordered_sum(comb, -2, keepdim=True) + hc_eps)
    collapsed = ordered_sum(pre.unsqueeze(-1) * streams.to(wd), 1).to(streams.dtype)
    return post, comb, collapsed


def hyper_expand(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The residual update after a block: ``new_k = post_k * out + sum_j comb[j, k] * streams_j``.
    streams [rows, hc, H], out [rows, H] -> [rows, hc, H]."""
    dtype = streams.dtype
    mixed = ordered_sum(comb.to(dtype).unsqueeze(-1) * streams.unsqueeze(2), 1) if row_invariant(streams) \
        else torch.matmul(comb.to(dtype).transpose(-1, -2), streams)  # [rows, hc, H]
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + mixed


def hyper_head(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
               hc_eps: float, norm_eps: float) -> torch.Tensor:
    """The final collapse of the streams: [rows, hc, H] -> [rows, H] (sigmoid weights, no
    Sinkhorn). ``fn`` [hc, hc * H], ``base`` [hc], ``scale`` [1]."""
    rows, hc, width = streams.shape
    wd = work_dtype(streams.dtype)
    flat = unit_rms_norm(streams.reshape(rows, hc * width).to(wd), norm_eps)
    logits = linear(flat, fn.to(wd)) * scale.to(wd)[0] + base.to(wd)  # [rows, hc]
    pre = per_row(torch.sigmoid, logits) + hc_eps
    return ordered_sum(pre.unsqueeze(-1) * streams.to(wd), 1).to(streams.dtype)


def clamped_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, limit: float) -> torch.Tensor:
    """``down(silu(min(gate x, limit)) * clamp(up x, -limit, limit))``; x [rows, H] -> [rows, H].
    A limit <= 0 turns the clamps off. The matrices may be given as functions of x (the
    experts' row-invariant slices)."""
    g = gate(x) if callable(gate) else linear(x, gate)
    u = up(x) if callable(up) else linear(x, up)
    if limit > 0:
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
    act = silu_mul_rows(g, u)  # the compiled per-row kernel on the float32 path
    if act is None:
        act = per_row(lambda gr, ur: F.silu(gr) * ur, g, u)
    return down(act) if callable(down) else linear(act, down)
