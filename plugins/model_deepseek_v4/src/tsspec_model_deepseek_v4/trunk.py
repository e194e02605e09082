"""The DeepSeek V4 trunk: embedding -> hc streams -> [attention, MoE] x L -> hyper head -> norm -> LM head.

A decoder layer over the streams S [rows, hc, H]::

    post, comb, x = hyper_mix(S, hc_attn)       # collapse the streams for the block
    S = post * attention(RMSNorm_attn(x)) + comb^T S
    post, comb, x = hyper_mix(S, hc_ffn)
    S = post * MoE(RMSNorm_ffn(x), token ids) + comb^T S

The embedding enters as ``hc`` copies; after the last layer the hyper head collapses the
streams (sigmoid weights) before the final norm. Stateless: a sequence lives in ``TrunkCache``.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch
import torch.nn.functional as F

from .attention import LayerCache, attention
from .hparams import DeepseekV4HParams
from .moe import moe
from .ops import TailRope, hyper_expand, hyper_head, hyper_mix, rms_norm
from .weights import DeepseekV4Weights, LayerWeights


@attrs.define
class TrunkCache:
    """One sequence's state, all of it by absolute position (rollback = a shorter length)."""

    layers: list[LayerCache]

    def ensure(self, positions: int) -> None:
        for c in self.layers:
            c.ensure(positions)

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.layers)


@attrs.define
class ForwardOut:
    streams: torch.Tensor  # [rows, hc, H] after the last layer
    taps: dict[int, torch.Tensor]  # layer -> streams ENTERING it [rows, hc, H] (asked-for layers)


class DeepseekV4Trunk:
    """The torch trunk over loaded weights."""

    def __init__(self, hp: DeepseekV4HParams, weights: DeepseekV4Weights, dtype: torch.dtype = torch.float32):
        self.hp = hp
        self.w = weights
        self.dtype = dtype
        self.main_rope = TailRope(hp.rope_dims, hp.rope_base, dtype)
        self.compress_rope = TailRope(hp.rope_dims, hp.compress_rope_base, dtype, yarn=hp.compress_yarn)

    def new_cache(self) -> TrunkCache:
        return TrunkCache([LayerCache(lw.attn, self.hp.head_dim, self.dtype) for lw in self.w.layers])

    # -- drafter-facing pieces -------------------------------------------------------------------
    def embed(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self.w.embed[torch.as_tensor(ids, dtype=torch.long)]  # [n, H]

    def collapse(self, streams: torch.Tensor) -> torch.Tensor:
        """[rows, hc, H] -> [rows, H] with the model's hyper head."""
        hp, h = self.hp, self.w.hc_head
        return hyper_head(streams, h.fn, h.base, h.scale, hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, self.w.final_norm, self.hp.rms_eps)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.w.lm_head)  # [n, V]

    # -- the forward -----------------------------------------------------------------------------
    def layer(self, lw: LayerWeights, streams: torch.Tensor, ids: torch.Tensor, cache: LayerCache, start: int,
              ratio: int, first: int = 0) -> torch.Tensor:
        """One decoder layer over streams [rows, hc, H] at positions start.. (also the MTP block's)."""
        hp = self.hp
        rope = self.compress_rope if ratio > 0 else self.main_rope
        post, comb, x = hyper_mix(streams, lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale,
                                  iters=hp.hc_iters, hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        a = attention(lw.attn, rms_norm(x, lw.attn_norm, hp.rms_eps), cache, start, heads=hp.num_heads,
                      hd=hp.head_dim, groups=hp.o_groups, window=hp.sliding_window, eps=hp.rms_eps, rope=rope,
                      first=first)
        streams = hyper_expand(streams, a, post, comb)
        post, comb, x = hyper_mix(streams, lw.hc_ffn.fn, lw.hc_ffn.base, lw.hc_ffn.scale,
                                  iters=hp.hc_iters, hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        f = moe(lw.moe, rms_norm(x, lw.ffn_norm, hp.rms_eps), ids, top_k=hp.experts_per_token,
                scoring=hp.scoring, routed_scale=hp.routed_scale, limit=hp.swiglu_limit)
        return hyper_expand(streams, f, post, comb)

    def forward(self, tokens: Sequence[int], start: int, cache: TrunkCache, *,
                taps: Sequence[int] = ()) -> ForwardOut:
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        x = self.embed(ids)  # [rows, H]
        streams = x.unsqueeze(1).expand(-1, self.hp.hc_mult, -1).contiguous()  # [rows, hc, H]
        tapped: dict[int, torch.Tensor] = {}
        tap_set = set(taps)
        for i, (lw, lc) in enumerate(zip(self.w.layers, cache.layers)):
            if i in tap_set:
                tapped[i] = streams
            streams = self.layer(lw, streams, ids, lc, start, self.hp.compress_ratios[i])
        if self.hp.num_layers in tap_set:
            tapped[self.hp.num_layers] = streams
        return ForwardOut(streams=streams, taps=tapped)

    def logits(self, streams: torch.Tensor) -> torch.Tensor:
        """[rows, hc, H] -> [rows, V]."""
        return self.lm_head(self.final_norm(self.collapse(streams)))
