"""GLM 5.x attention: MLA over the compressed KV cache; the DSA lightning indexer chooses keys.

Per row at position p (x normed; r = RMSNorm(W_qa x), also the indexer's input)::

    q = W_qb r -> [heads, nope | rope];   c, k_pe = RMSNorm(W_kva x)[:kv_lora], rope(..[kv_lora:])
    score_h(j) = ((W_kb_h^T q_nope_h) . c_j + rope(q_pe_h) . k_pe_j) / sqrt(nope + rope)
    out = W_o [W_vb_h sum_j softmax_j(score_h) c_j]_h     over the selected keys j

the absorbed form llama.cpp runs; the cache keeps (c, k_pe) by ABSOLUTE position, so rollback is
a change of length. A full layer's indexer keeps k_I = rope(LayerNorm(W_k x)) per position and
scores key j as ``sum_h w_h relu(q_I,h . k_I,j) / sqrt(d_I)`` (``w = W_proj x / sqrt(h_I)``);
the row attends the top ``index_topk`` keys at or before p (a stable sort: ties go to the lower
position, whatever other rows share the forward, so a k-row verify selects what k one-row steps
select). A shared layer reuses the previous full layer's choice for the same row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import Rope, layer_norm, rms_norm, work_dtype
from .weights import AttentionWeights

MIN_ROWS = 64  # first allocation of a cache; it then doubles


def _grow(t: torch.Tensor, rows: int) -> torch.Tensor:
    if rows <= t.shape[0]:
        return t
    out = t.new_zeros((max(rows, 2 * t.shape[0], MIN_ROWS),) + tuple(t.shape[1:]))
    out[: t.shape[0]] = t
    return out


class LayerCache:
    """One layer's state by absolute position: the compressed KV and the indexer keys."""

    def __init__(self, kv_lora: int, rope: int, index_dim: int | None, dtype: torch.dtype):
        self.c = torch.zeros(0, kv_lora, dtype=dtype)  # [positions, kv_lora]
        self.k_pe = torch.zeros(0, rope, dtype=dtype)  # [positions, rope]
        self.index_k = torch.zeros(0, index_dim, dtype=dtype) if index_dim else None  # [positions, id]

    def ensure(self, positions: int) -> None:
        self.c = _grow(self.c, positions)
        self.k_pe = _grow(self.k_pe, positions)
        if self.index_k is not None:
            self.index_k = _grow(self.index_k, positions)

    def nbytes(self) -> int:
        tensors = [self.c, self.k_pe] + ([self.index_k] if self.index_k is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def select(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Ascending indices of the top ``topk`` of ``scores`` [n] (all when n <= topk); equal scores
    go to the lower index (a stable sort)."""
    n = scores.shape[0]
    if n <= topk:
        return torch.arange(n)
    return torch.sort(scores, descending=True, stable=True).indices[:topk].sort().values


def attention(w: AttentionWeights, x: torch.Tensor, cache: LayerCache, start: int, *, heads: int, nope: int,
              topk: int, eps: float, rope: Rope, shared: list[torch.Tensor] | None = None,
              first: int = 0) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """One attention block over rows at positions ``start..`` (x [rows, H], normed). Writes the
    rows' state into ``cache``; returns (out [rows, H], the rows' selected key positions, each
    relative to ``first``; None for a dense layer). ``shared``: the selections of the previous
    full layer (a shared layer); neither indexer nor ``shared``: dense (the NextN layer).
    ``first``: the first position the cache holds (the NextN head's starts at 1)."""
    rows = x.shape[0]
    end = start + rows
    wd = work_dtype(x.dtype)
    kv_lora, rope_dims = w.kv_a_norm.shape[0], rope.dims
    cos, sin = rope.tables(torch.arange(start, end))
    r = rms_norm(F.linear(x, w.q_a), w.q_a_norm, eps)  # [rows, q_lora]
    q = F.linear(r, w.q_b).view(rows, heads, nope + rope_dims)
    q_nope, q_pe = q[..., :nope], rope.apply(q[..., nope:], cos, sin)  # [rows, heads, nope], [.., rope]
    ckv = F.linear(x, w.kv_a)  # [rows, kv_lora + rope]
    cache.c[start:end] = rms_norm(ckv[:, :kv_lora], w.kv_a_norm, eps)
    cache.k_pe[start:end] = rope.apply(ckv[:, None, kv_lora:], cos, sin)[:, 0]
    q_abs = torch.einsum("hrn,thn->thr", w.k_b.to(x.dtype), q_nope)  # [rows, heads, kv_lora]
    scale = (nope + rope_dims) ** -0.5

    selections = None
    if w.indexer is not None:
        ix = w.indexer
        ih = ix.proj.shape[0]
        idim = ix.k.shape[0]
        cache.index_k[start:end] = rope.apply(layer_norm(F.linear(x, ix.k), ix.k_norm, ix.k_norm_bias)[:, None],
                                              cos, sin)[:, 0]
        iq = rope.apply(F.linear(r, ix.q_b).view(rows, ih, idim), cos, sin).to(wd)  # [rows, ih, id]
        head_w = F.linear(x, ix.proj).to(wd) * ih ** -0.5  # [rows, ih]
        selections = []
        for i in range(rows):
            keys = cache.index_k[first : start + i + 1].to(wd)  # [n, id]
            s = torch.relu(iq[i] @ keys.T) * idim ** -0.5  # [ih, n]
            selections.append(select((head_w[i, :, None] * s).sum(0), topk))
    elif shared is not None:
        selections = shared

    outs = []
    for i in range(rows):  # each row over exactly the keys a one-row decode at its position has
        p = start + i
        c = cache.c[first : p + 1]
        k_pe = cache.k_pe[first : p + 1]
        if selections is not None:
            c, k_pe = c[selections[i]], k_pe[selections[i]]
        scores = (q_abs[i] @ c.T + q_pe[i] @ k_pe.T).to(wd) * scale  # [heads, n]
        probs = torch.softmax(scores, dim=-1).to(x.dtype)
        outs.append(probs @ c)  # [heads, kv_lora]
    ctx = torch.stack(outs)  # [rows, heads, kv_lora]
    o = torch.einsum("hvr,thr->thv", w.v_b.to(x.dtype), ctx).reshape(rows, -1)  # [rows, heads * v]
    return F.linear(o, w.out), selections
