"""The NextN / MTP drafter as a torch module: one decoder layer over ``[enorm(emb); hnorm(h)]``.

One step, for token x at position p, with h the row that predicted x (the trunk's post-norm row
of position p-1, or the head's own output when chaining)::

    u   = eh_proj([RMSNorm_e(Emb(x)) ; RMSNorm_h(h)])        # [H]
    u'  = u + attn(RMSNorm_a(u)) ; u'' = u' + SwiGLU(RMSNorm_f(u'))   (own KV cache, RoPE)
    out = RMSNorm_o(u'')                                       # chained as the next step's h
    logits = head(out)                                         # predicts position p+1

The head row set is the DRAFT vocabulary (``draft_ids`` [K], FR-Spec): logits cover K tokens,
the rest of the target's vocabulary is never proposed. RoPE turns adjacent pairs (llama.cpp's
layout), so a layer copied from a llama GGUF keeps its meaning. ``qk_norm``: per-head RMSNorms
on q and k before RoPE (a Qwen3 layer). ``shared_head``: no head rows of its own; ``logits``
is the target's LM head over its whole vocabulary (``borrow_head``).

EAGLE-3-style heads (``feature_layers`` set) read the target's residuals entering three layers
(low, middle, high; the target's feature taps) instead of its post-norm row: a trunk row
[n_taps * H] is first fused to [H] by ``fc`` (no bias, EAGLE-3's ``fc``); the head's own chained
output, [H] wide, goes in as it is. ``inputs`` tells them apart by width.

The same module serves training (``unrolled``: every position at once, steps 1..k chained on the
module's own outputs) and drafting (``NextNRunner`` in ``nextn_file``, a KV cache row by row).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["NextNConfig", "NextNModule", "rope_tables", "apply_rope", "unroll_mask"]


@attrs.frozen
class NextNConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    draft_vocab: int = 0  # K rows in the head (0: the target's full vocabulary)
    # EAGLE-3-style: the target layers whose entering residuals the head reads, fused by ``fc``
    # (empty: the trunk's post-norm row, NextN / MTP)
    feature_layers: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE
    shared_head: bool = False  # the target's LM head (full vocabulary) instead of own rows

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, 1, head_dim/2] for integer positions [n]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # [hd/2]
    angles = positions.to(torch.float64)[:, None] * inv[None, :]  # [n, hd/2]
    return angles.cos().float().unsqueeze(1), angles.sin().float().unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, hd] turned by adjacent pairs; cos/sin [n, 1, hd/2]."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., n, heads, hd/2, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def unroll_mask(length: int, step: int, device=None) -> torch.Tensor:
    """Which keys a step-``step`` query at position q may see, over the keys of steps 1..step
    laid side by side ([length, step * length], True = attend).

    At drafting time the chain's step j runs at position q = p + j - 1: the cache holds the
    true rows up to p (step 1 and catch-ups) and one entry per later step (step i at
    p + i - 1). So: step-1 keys at positions 1 .. q - step + 1, and step i's key at q - step + i.
    """
    q = torch.arange(length, device=device)[:, None]  # [L, 1]
    k = torch.arange(length, device=device)[None, :]  # [1, L]
    first = k <= q - step + 1
    # the head never holds position 0 (it has no predecessor row); only a query at 0 reads it
    first = first & ((k > 0) | (q == 0))
    blocks = [first]
    for i in range(2, step + 1):
        blocks.append(k == q - step + i)
    return torch.cat(blocks, dim=1)  # [L, step * L]


class NextNModule(nn.Module):
    """Parameters and math of one NextN head (see the module docstring)."""

    def __init__(self, cfg: NextNConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        H, Fd = cfg.hidden_size, cfg.intermediate_size
        self.enorm = nn.Parameter(torch.ones(H))
        self.hnorm = nn.Parameter(torch.ones(H))
        self.eh_proj = nn.Parameter(torch.zeros(H, 2 * H))
        self.attn_norm = nn.Parameter(torch.ones(H))
        self.wq = nn.Parameter(torch.zeros(cfg.q_size, H))
        self.wk = nn.Parameter(torch.zeros(cfg.kv_size, H))
        self.wv = nn.Parameter(torch.zeros(cfg.kv_size, H))
        self.wo = nn.Parameter(torch.zeros(H, cfg.q_size))
        self.ffn_norm = nn.Parameter(torch.ones(H))
        self.w_gate = nn.Parameter(torch.zeros(Fd, H))
        self.w_up = nn.Parameter(torch.zeros(Fd, H))
        self.w_down = nn.Parameter(torch.zeros(H, Fd))
        self.head_norm = nn.Parameter(torch.ones(H))
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
            self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))
        rows = vocab_size if cfg.shared_head else cfg.draft_vocab or vocab_size
        self.head = nn.Parameter(torch.zeros(0 if cfg.shared_head else rows, H))  # [K, H]
        self.register_buffer("draft_ids", torch.arange(rows, dtype=torch.long))  # [K] target ids
        taps = len(cfg.feature_layers)
        self.fc = nn.Parameter(torch.zeros(H, taps * H)) if taps else None  # [H, taps * H]
        self.vocab_size = int(vocab_size)
        self._borrowed_head = None  # shared_head: the target's LM head, [..., H] -> [..., V]

    def borrow_head(self, lm_head) -> None:
        """Draft with ``lm_head`` (the target's: normed rows [n, H] -> logits [n, V])."""
        if not self.cfg.shared_head:
            raise ValueError("this head has its own rows; only a shared_head module borrows the target's")
        self._borrowed_head = lm_head

    # -- drafting on the CPU block kernel --------------------------------------------------------
    PACKED = ("eh_proj", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "head")

    @property
    def packed_names(self) -> tuple[str, ...]:
        """The matrices the int8 blocks cover (not a borrowed head)."""
        return self.PACKED[:-1] if self.cfg.shared_head else self.PACKED

    def pack_int8(self) -> bool:
        """Drafting only: keep int8 block copies of the matrices (``BlockMatrix.quantize_int8``)
        and multiply on them with the compiled kernel (a quarter of the float32 bytes a step;
        drafts change slightly, never the output). False, and nothing changes, without the
        compiled kernels, off the CPU, or when a matrix's rows are not whole 32-weight blocks."""
        from tsspec_gguf import native
        from tsspec_gguf.qlinear import BlockMatrix

        if native.kernels() is None or self.head.device.type != "cpu":
            return False
        if any(getattr(self, name).shape[1] % 32 for name in self.packed_names):
            return False  # the blocks hold 32 weights of a row
        self._packed = {name: BlockMatrix.quantize_int8(getattr(self, name)) for name in self.packed_names}
        return True

    @torch.no_grad()
    def sort_draft_vocab(self) -> None:
        """Reorder the head's rows so ``draft_ids`` ascend (same drafts: a row's logit goes with
        its id). Then an argmax over the [K] logits breaks ties toward the lowest target id, as
        one over the full vocabulary does, and the ids under any vocabulary size are a prefix."""
        order = torch.argsort(self.draft_ids)  # [K]
        if bool((order == torch.arange(order.numel(), device=order.device)).all()):
            return
        self.head.copy_(self.head[order])
        self.draft_ids.copy_(self.draft_ids[order])
        if self.__dict__.get("_packed") is not None:
            self.pack_int8()  # the int8 copies follow the new row order

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x [..., in] @ W^T for the parameter ``name`` (its int8 blocks when packed)."""
        packed = self.__dict__.get("_packed")
        if packed is None or x.requires_grad or x.dtype != torch.float32:
            return F.linear(x, getattr(self, name))
        matrix = packed[name]
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # [R, in]
        return matrix.linear(rows).reshape(*x.shape[:-1], matrix.shape[0])

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.cfg.rms_eps)

    # -- pieces shared by training and drafting ------------------------------------------------
    def fuse(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] rows: tapped trunk rows [..., taps * H] through ``fc``; [..., H] rows (the
        trunk's post-norm row, or the head's own output) as they are."""
        if self.fc is None or h.shape[-1] == self.cfg.hidden_size:
            return h
        return F.linear(h, self.fc.to(h.dtype))

    def inputs(self, emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """u [..., H] from raw embeddings [..., H] and predecessor rows [..., H] (or tapped trunk
        rows [..., taps * H], fused first)."""
        h = self.fuse(h)
        both = torch.cat([self._norm(emb, self.enorm), self._norm(h, self.hnorm)], dim=-1)  # [..., 2H]
        return self._linear(both, "eh_proj")

    def qkv(self, u: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None):
        """q [..., n, nh, hd], k/v [..., n, nkv, hd] (RoPE applied) of u [..., n, H];
        ``rope`` = precomputed (cos, sin) for ``positions``."""
        cfg = self.cfg
        x = self._norm(u, self.attn_norm)
        q = self._linear(x, "wq").unflatten(-1, (cfg.num_heads, cfg.head_dim))
        k = self._linear(x, "wk").unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
        if cfg.qk_norm:
            q, k = self._norm(q, self.q_norm), self._norm(k, self.k_norm)
        v = self._linear(x, "wv").unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
        cos, sin = rope if rope is not None else rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, n, nh, hd], k/v [B, m, nkv, hd], mask [n, m] bool -> [B, n, nh*hd]."""
        groups = self.cfg.num_heads // self.cfg.num_kv_heads
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=groups > 1
        )  # [B, nh, n, hd]
        return out.transpose(1, 2).flatten(-2)

    def finish(self, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of the layer and the output norm: out [..., H]."""
        u = u + self._linear(attn, "wo")
        x = self._norm(u, self.ffn_norm)
        u = u + self._linear(F.silu(self._linear(x, "w_gate")) * self._linear(x, "w_up"), "w_down")
        return self._norm(u, self.head_norm)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., K] (a shared head: the target's [..., V])."""
        if self.cfg.shared_head:
            if self._borrowed_head is None:
                raise ValueError("a shared_head module drafts only once bound to its target (borrow_head)")
            rows = out.reshape(-1, out.shape[-1])  # [n, H]
            return self._borrowed_head(rows).to(out.dtype).reshape(*out.shape[:-1], -1)
        return self._linear(out, "head")

    # -- training ----------------------------------------------------------------------------
    def unrolled(self, emb: torch.Tensor, h_true: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Outputs of steps 1..``steps`` at every position: each [B, L, H].

        emb [B, L, H]: embeddings of the tokens at 0..L-1; h_true [B, L, H]: the trunk rows
        (row q predicts token q+1). Step 1 at q reads h_true[q-1]; step j reads step j-1's output
        at q-1. Positions q < j have no valid input (zeros stand in; their losses are masked).
        """
        B, L, _ = emb.shape
        positions = torch.arange(L, device=emb.device)
        keys, values, outs = [], [], []
        prev = h_true
        for step in range(1, steps + 1):
            h_in = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)  # [B, L, H]
            u = self.inputs(emb, h_in)
            q, k, v = self.qkv(u, positions)
            keys.append(k)
            values.append(v)
            mask = unroll_mask(L, step, emb.device)
            attn = self.attend(q, torch.cat(keys, dim=1), torch.cat(values, dim=1), mask)
            out = self.finish(u, attn)
            outs.append(out)
            prev = out
        return outs
