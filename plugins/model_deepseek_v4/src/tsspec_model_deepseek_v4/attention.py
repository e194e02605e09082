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
row to exactly what a one-row decode at that position would see. Rolling back is therefore
only a change of length: entries of windows the kept rows did not complete are recomputed when
their window closes again (a rewind into the middle of a window needs no saved state).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

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
    every window those rows complete."""
    rows = x.shape[0]
    end = start + rows
    cache.proj_kv[start:end] = F.linear(x, w.kv)
    cache.proj_gate[start:end] = F.linear(x, w.gate)
    m, d = w.ratio, w.dim
    first, last = start // m, end // m  # windows [first, last) close in this forward
    if last <= first:
        return
    n = last - first
    kv = cache.proj_kv[first * m : last * m].view(n, m, -1)  # [n, m, coff * d]
    gate = cache.proj_gate[first * m : last * m].view(n, m, -1) + w.ape.to(kv.dtype)
    if w.overlap:
        # slot layout [series A of window w-1 (m slots) | series B of window w (m slots)]
        prev_kv = kv.new_zeros((n, m, d))
        prev_gate = gate.new_full((n, m, d), float("-inf"))
        lo = max(first, 1)
        if lo < last:
            src_kv = cache.proj_kv[(lo - 1) * m : (last - 1) * m].view(last - lo, m, -1)
            src_gate = cache.proj_gate[(lo - 1) * m : (last - 1) * m].view(last - lo, m, -1) + w.ape.to(kv.dtype)
            prev_kv[lo - first :] = src_kv[..., :d]
            prev_gate[lo - first :] = src_gate[..., :d]
        kv = torch.cat([prev_kv, kv[..., d:]], dim=1)  # [n, 2m, d]
        gate = torch.cat([prev_gate, gate[..., d:]], dim=1)
    weights = torch.softmax(gate.to(work_dtype(gate.dtype)), dim=1).to(kv.dtype)
    entries = rms_norm((kv * weights).sum(dim=1), w.norm, eps)  # [n, d]
    positions = torch.arange(first, last) * m
    cos, sin = rope.tables(positions)
    cache.entries[first:last] = rope.apply(entries, cos, sin)


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """How many compressed entries each row sees: complete windows only. [rows]"""
    return torch.div(positions + 1, ratio, rounding_mode="floor")


def indexer_select(w: IndexerWeights, cache: CompressorCache, x: torch.Tensor, r: torch.Tensor,
                   positions: torch.Tensor, n_entries: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                   rope: TailRope) -> torch.Tensor:
    """The entries each row attends: a bool mask [rows, n_entries] (the top-k visible by score)."""
    rows = x.shape[0]
    d = w.compressor.dim
    wd = work_dtype(x.dtype)
    q = F.linear(r, w.q_b).view(rows, w.heads, d)
    q = rope.apply(q, rope_cos, rope_sin).to(wd)  # [rows, heads, d]
    keys = cache.entries[:n_entries].to(wd)  # [n, d]
    scores = torch.relu(torch.einsum("rhd,nd->rhn", q, keys)) * (d ** -0.5)
    head_w = F.linear(x, w.proj).to(wd) * (w.heads ** -0.5)  # [rows, heads]
    total = (scores * head_w.unsqueeze(-1)).sum(dim=1)  # [rows, n]
    vis = visible_entries(positions, w.compressor.ratio)  # [rows]
    allowed = torch.arange(n_entries)[None, :] < vis[:, None]
    total = total.masked_fill(~allowed, float("-inf"))
    k = min(w.topk, n_entries)
    chosen = torch.zeros(rows, n_entries, dtype=torch.bool)
    if k > 0:
        # a stable sort: equal scores (ReLU makes exact zeros common) go to the lower entry
        # index, whatever the number of masked entries after them, so a row picks the same
        # entries in a multi-row verify as in a one-row decode
        idx = torch.sort(total, dim=-1, descending=True, stable=True).indices[:, :k]  # [rows, k]
        chosen.scatter_(1, idx, True)
    return chosen & allowed


def attention(w: AttentionWeights, x: torch.Tensor, cache: LayerCache, start: int, *, heads: int, hd: int,
              groups: int, window: int, eps: float, rope: TailRope, first: int = 0) -> torch.Tensor:
    """One attention block over rows at positions start.. (x [rows, H], normed). Writes the
    rows' state into ``cache`` and returns [rows, H]. ``first``: the first position the cache
    holds (the MTP head's cache starts at 1)."""
    rows = x.shape[0]
    end = start + rows
    wd = work_dtype(x.dtype)
    positions = torch.arange(start, end)
    cos, sin = rope.tables(positions)
    r = rms_norm(F.linear(x, w.q_a), w.q_a_norm, eps)  # [rows, q_lora_rank]
    q = unit_rms_norm(F.linear(r, w.q_b).view(rows, heads, hd), eps)
    q = rope.apply(q, cos, sin)  # [rows, heads, hd]
    kv = rope.apply(rms_norm(F.linear(x, w.kv), w.kv_norm, eps).unsqueeze(1), cos, sin).squeeze(1)  # [rows, hd]
    cache.kv[start:end] = kv

    lo = max(first, start - window + 1)
    keys = [cache.kv[lo:end]]  # [ns, hd]
    key_pos = torch.arange(lo, end)
    masks = [(key_pos[None, :] <= positions[:, None]) & (key_pos[None, :] > positions[:, None] - window)]
    if w.compressor is not None:
        compress(w.compressor, cache.compressor, x, start, rope, eps)
        if w.indexer is not None:  # its projections are stored for every row, entries or not
            compress(w.indexer.compressor, cache.indexer, x, start, rope, eps)
        n_entries = end // cache.ratio
        if n_entries > 0:
            if w.indexer is not None:
                chosen = indexer_select(w.indexer, cache.indexer, x, r, positions, n_entries, cos, sin, rope)
            else:
                vis = visible_entries(positions, cache.ratio)
                chosen = torch.arange(n_entries)[None, :] < vis[:, None]
            keys.append(cache.compressor.entries[:n_entries])
            masks.append(chosen)
    keys_t = torch.cat(keys).to(wd)  # [nk, hd]
    mask = torch.cat(masks, dim=1)  # [rows, nk]
    logits = torch.einsum("rhd,kd->rhk", q.to(wd), keys_t) * (hd ** -0.5)
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    sinks = w.sinks.to(wd).view(1, heads, 1).expand(rows, heads, 1)
    combined = torch.cat([logits, sinks], dim=-1)
    probs = torch.softmax(combined - combined.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    out = torch.einsum("rhk,kd->rhd", probs, keys_t).to(x.dtype)  # [rows, heads, hd]
    out = rope.apply(out, cos, sin, inverse=True)
    grouped = out.reshape(rows, groups, heads * hd // groups)
    o_a = w.o_a.view(groups, -1, grouped.shape[-1])  # [groups, o_lora_rank, in]
    mid = torch.einsum("rgi,goi->rgo", grouped, o_a).reshape(rows, -1)
    return F.linear(mid, w.o_b)
