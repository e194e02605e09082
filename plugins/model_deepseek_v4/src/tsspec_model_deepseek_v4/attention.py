"""DeepSeek V4 attention: shared-KV MQA over a sliding window plus compressed entries.

Per row at position p (x = the attention input, already normed)::

    r    = RMSNorm_qa(W_qa x)                                  # [q_lora_rank], also the indexer's input
    q    = rope(unit_RMSNorm_per_head(W_qb r))                 # [heads, hd], rope on the last rope_dims
    kv   = rope(RMSNorm_kv(W_kv x))                            # [hd], one head: K = V
    keys = kv of positions max(0, p - W + 1) .. p              # the sliding window
         + compressed entries w < (p + 1) // m                 # complete windows only
           (CSA layers: only the indexer's top-k of those)
    o    = softmax([q.k / sqrt(hd) ; sink_h]) without the sink column, times the keys (V = K)
    o    = rope^-1 at p on the last rope_dims                  # undo the rotation V carried
    out  = W_ob (per-group W_oa (o of that group's heads))

Compressed entry w (``Compressor``) of a layer with ratio m: per channel, a softmax over the
window's gates (``W_gate x + ape[j]``) weighting the window's ``W_kv x``, RMS-normed, then
rotated at position ``w * m`` with the compressed RoPE. An overlapping compressor (CSA) projects
two series: entry w mixes series A of window w-1 with series B of window w (2m slots; window
0 has no predecessor). The lightning indexer runs its own compressor at ``index_head_dim`` and
scores entry s for the row as ``sum_h (W_proj x)_h / sqrt(heads) * relu(q_h . k_s) / sqrt(d)``
with ``q = rope(W_qb^I r)``; the top ``index_topk`` of the visible entries are attended.

The cache (``LayerCache``) keeps everything by ABSOLUTE position: the sliding K = V rows, the
compressors' raw projections and the emitted entries. A multi-row forward writes all its rows'
projections first, then emits the entries of the windows its rows complete, then attends each
row to exactly what a one-row decode at that position would see. Every row is attended on its
own, over exactly the keys a one-row decode at its position has (the sliding rows and the
visible entries, nothing masked in from later rows), and entries are emitted one window at a
time: with the row-invariant matrices of ``invariant.py`` a float32 k-row verify reproduces
the one-row decode bit for bit. Rolling back is therefore
only a change of length: entries of windows the kept rows did not complete are recomputed when
their window closes again (a rewind into the middle of a window needs no saved state).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from .invariant import linear, linear_slice
from .ops import TailRope, rms_norm, unit_rms_norm, work_dtype

MIN_ROWS = 64  # first allocation of a cache; it then doubles


@attrs.define
class CompressorWeights:
    kv: torch.Tensor  # [coff * d, H]
    gate: torch.Tensor  # [coff * d, H]
    ape: torch.Tensor  # [m, coff * d]: the per-slot gate bias
    norm: torch.Tensor  # [d]
    ratio: int  # m

    @property
    def dim(self) -> int:
        return self.norm.shape[0]

    @property
    def overlap(self) -> bool:
        return self.kv.shape[0] == 2 * self.dim


@attrs.define
class IndexerWeights:
    compressor: CompressorWeights
    q_b: torch.Tensor  # [index_heads * index_head_dim, q_lora_rank]
    proj: torch.Tensor  # [index_heads, H]
    heads: int
    topk: int


@attrs.define
class AttentionWeights:
    q_a: torch.Tensor  # [q_lora_rank, H]
    q_a_norm: torch.Tensor  # [q_lora_rank]
    q_b: torch.Tensor  # [heads * hd, q_lora_rank]
    kv: torch.Tensor  # [hd, H]
    kv_norm: torch.Tensor  # [hd]
    o_a: torch.Tensor  # [groups * o_lora_rank, heads * hd / groups]
    o_b: torch.Tensor  # [H, groups * o_lora_rank]
    sinks: torch.Tensor  # [heads]
    compressor: CompressorWeights | None = None
    indexer: IndexerWeights | None = None


def _grow(t: torch.Tensor, rows: int) -> torch.Tensor:
    if rows <= t.shape[0]:
        return t
    out = t.new_zeros((max(rows, 2 * t.shape[0], MIN_ROWS),) + tuple(t.shape[1:]))
    out[: t.shape[0]] = t
    return out


class CompressorCache:
    """One compressor's raw projections [positions, coff * d] and emitted entries [windows, d]."""

    def __init__(self, w: CompressorWeights, dtype: torch.dtype):
        width = w.kv.shape[0]
        self.proj_kv = torch.zeros(0, width, dtype=dtype)
        self.proj_gate = torch.zeros(0, width, dtype=dtype)
        self.entries = torch.zeros(0, w.dim, dtype=dtype)

    def ensure(self, positions: int, ratio: int) -> None:
        self.proj_kv = _grow(self.proj_kv, positions)
        self.proj_gate = _grow(self.proj_gate, positions)
        self.entries = _grow(self.entries, positions // ratio + 1)


class LayerCache:
    """A layer's state by absolute position: K = V rows, and the compressors' state."""

    def __init__(self, w: AttentionWeights, hd: int, dtype: torch.dtype):
        self.kv = torch.zeros(0, hd, dtype=dtype)
        self.compressor = CompressorCache(w.compressor, dtype) if w.compressor is not None else None
        self.indexer = CompressorCache(w.indexer.compressor, dtype) if w.indexer is not None else None
        self.ratio = w.compressor.ratio if w.compressor is not None else 0

    def ensure(self, positions: int) -> None:
        self.kv = _grow(self.kv, positions)
        if self.compressor is not None:
            self.compressor.ensure(positions, self.ratio)
        if self.indexer is not None:
            self.indexer.ensure(positions, self.ratio)

    def nbytes(self) -> int:
        tensors = [self.kv]
        for c in (self.compressor, self.indexer):
            if c is not None:
                tensors += [c.proj_kv, c.proj_gate, c.entries]
        return sum(t.numel() * t.element_size() for t in tensors)


def compress(w: CompressorWeights, cache: CompressorCache, x: torch.Tensor, start: int, rope: TailRope,
             eps: float) -> None:
    """Store the rows' projections (x [rows, H] at positions start..) and emit the entries of
    every window those rows complete, one window at a time (as one-row decoding emits them)."""
    end = start + x.shape[0]
    cache.proj_kv[start:end] = linear(x, w.kv)
    cache.proj_gate[start:end] = linear(x, w.gate)
    for window in range(start // w.ratio, end // w.ratio):
        cache.entries[window : window + 1] = _entry(w, cache, window, rope, eps)


def _entry(w: CompressorWeights, cache: CompressorCache, window: int, rope: TailRope, eps: float) -> torch.Tensor:
    """The compressed entry [1, d] of one complete window from the stored projections."""
    m, d = w.ratio, w.dim
    ape = w.ape.to(cache.proj_kv.dtype)
    kv = cache.proj_kv[window * m : (window + 1) * m]  # [m, coff * d]
    gate = cache.proj_gate[window * m : (window + 1) * m] + ape
    if w.overlap:
        # slot layout [series A of window w-1 (m slots) | series B of window w (m slots)]
        if window > 0:
            prev_kv = cache.proj_kv[(window - 1) * m : window * m, :d]
            prev_gate = cache.proj_gate[(window - 1) * m : window * m, :d] + ape[:, :d]
        else:
            prev_kv = kv.new_zeros((m, d))
            prev_gate = gate.new_full((m, d), float("-inf"))
        kv = torch.cat([prev_kv, kv[:, d:]])  # [2m, d]
        gate = torch.cat([prev_gate, gate[:, d:]])
    weights = torch.softmax(gate.to(work_dtype(gate.dtype)), dim=0).to(kv.dtype)
    entry = rms_norm((kv * weights).sum(dim=0, keepdim=True), w.norm, eps)  # [1, d]
    cos, sin = rope.tables(torch.tensor([window * m]))
    return rope.apply(entry, cos, sin)


def visible_entries(position: int, ratio: int) -> int:
    """How many compressed entries a row at ``position`` sees: complete windows only."""
    return (position + 1) // ratio


def indexer_select(w: IndexerWeights, cache: CompressorCache, q: torch.Tensor, head_w: torch.Tensor,
                   visible: int) -> torch.Tensor:
    """The entries one row attends among its ``visible`` ones: a bool mask [visible] (the
    top-k by score). q [1, heads, d] (rotated), head_w [1, heads]."""
    d = w.compressor.dim
    wd = work_dtype(q.dtype)
    keys = cache.entries[:visible].to(wd)  # [n, d]
    scores = torch.relu(torch.einsum("rhd,nd->rhn", q.to(wd), keys)) * (d ** -0.5)
    total = (scores * (head_w.to(wd) * (w.heads ** -0.5)).unsqueeze(-1)).sum(dim=1)  # [1, n]
    chosen = torch.zeros(visible, dtype=torch.bool)
    k = min(w.topk, visible)
    if k > 0:
        # a stable sort: equal scores (ReLU makes exact zeros common) go to the lower entry index
        idx = torch.sort(total[0], descending=True, stable=True).indices[:k]
        chosen[idx] = True
    return chosen


def _attend(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor,
            hd: int) -> torch.Tensor:
    """One row: q [1, heads, hd] over keys [nk, hd] (V = K; mask [nk] or None) with per-head
    sinks -> [1, heads, hd] in the work dtype."""
    wd = keys.dtype
    logits = torch.einsum("rhd,kd->rhk", q.to(wd), keys) * (hd ** -0.5)
    if mask is not None:
        logits = logits.masked_fill(~mask[None, None, :], float("-inf"))
    combined = torch.cat([logits, sinks.to(wd).view(1, -1, 1)], dim=-1)
    probs = torch.softmax(combined - combined.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    return torch.einsum("rhk,kd->rhd", probs, keys)


def attention(w: AttentionWeights, x: torch.Tensor, cache: LayerCache, start: int, *, heads: int, hd: int,
              groups: int, window: int, eps: float, rope: TailRope, first: int = 0) -> torch.Tensor:
    """One attention block over rows at positions start.. (x [rows, H], normed). Writes the
    rows' state into ``cache`` and returns [rows, H]. ``first``: the first position the cache
    holds (the MTP head's cache starts at 1)."""
    rows = x.shape[0]
    end = start + rows
    wd = work_dtype(x.dtype)
    cos, sin = rope.tables(torch.arange(start, end))
    r = rms_norm(linear(x, w.q_a), w.q_a_norm, eps)  # [rows, q_lora_rank]
    q = unit_rms_norm(linear(r, w.q_b).view(rows, heads, hd), eps)
    q = rope.apply(q, cos, sin)  # [rows, heads, hd]
    kv = rope.apply(rms_norm(linear(x, w.kv), w.kv_norm, eps).unsqueeze(1), cos, sin).squeeze(1)  # [rows, hd]
    cache.kv[start:end] = kv

    iq = head_w = None
    if w.compressor is not None:
        compress(w.compressor, cache.compressor, x, start, rope, eps)
        if w.indexer is not None:  # its projections are stored for every row, entries or not
            ix = w.indexer
            compress(ix.compressor, cache.indexer, x, start, rope, eps)
            iq = rope.apply(linear(r, ix.q_b).view(rows, ix.heads, ix.compressor.dim), cos, sin)  # [rows, ih, d]
            head_w = linear(x, ix.proj)  # [rows, ih]

    outs = []
    for i in range(rows):  # each row over exactly the keys a one-row decode at its position has
        p = start + i
        lo = max(first, p - window + 1)
        keys = [cache.kv[lo : p + 1]]  # [ns, hd]
        mask = None
        visible = visible_entries(p, cache.ratio) if w.compressor is not None else 0
        if visible > 0:
            keys.append(cache.compressor.entries[:visible])
            if iq is not None:
                chosen = indexer_select(w.indexer, cache.indexer, iq[i : i + 1].clone(), head_w[i : i + 1].clone(),
                                        visible)
                mask = torch.cat([torch.ones(p + 1 - lo, dtype=torch.bool), chosen])
        outs.append(_attend(q[i : i + 1].clone(), torch.cat(keys).to(wd), mask, w.sinks, hd))
    out = torch.cat(outs).to(x.dtype)  # [rows, heads, hd]
    out = rope.apply(out, cos, sin, inverse=True)
    grouped = out.reshape(rows, groups, heads * hd // groups)
    mid = torch.cat([linear_slice(grouped[:, g], w.o_a, g, parts=groups) for g in range(groups)], dim=-1)
    return linear(mid, w.o_b)
