"""The GLM 5.x trunk: embedding -> [MLA + DSA attention, dense MLP or MoE] x L -> norm -> LM head.

A decoder layer over the rows' hidden h [rows, H]::

    h = h + attention(RMSNorm_attn(h))
    h = h + ffn(RMSNorm_ffn(h))

Stateless: a sequence lives in a ``TrunkCache`` (one ``LayerCache`` per layer).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch
import torch.nn.functional as F

from .attention import LayerCache, attention
from .ffn import ffn
from .hparams import GlmDsaHParams
from .ops import Rope, rms_norm
from .weights import GlmDsaWeights, LayerWeights


@attrs.define
class TrunkCache:
    layers: list[LayerCache]

    def ensure(self, positions: int) -> None:
        for c in self.layers:
            c.ensure(positions)

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.layers)


class GlmDsaTrunk:
    """The torch trunk over loaded weights."""

    def __init__(self, hp: GlmDsaHParams, weights: GlmDsaWeights, dtype: torch.dtype = torch.float32):
        self.hp = hp
        self.w = weights
        self.dtype = dtype
        self.rope = Rope(hp.rope_dims, hp.rope_base, dtype)

    def new_layer_cache(self, lw: LayerWeights) -> LayerCache:
        hp = self.hp
        return LayerCache(hp.kv_lora_rank, hp.rope_dims, hp.index_head_dim if lw.attn.indexer is not None else None,
                          self.dtype)

    def new_cache(self) -> TrunkCache:
        return TrunkCache([self.new_layer_cache(lw) for lw in self.w.layers])

    def embed(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self.w.embed[torch.as_tensor(ids, dtype=torch.long)]  # [n, H]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, self.w.final_norm, self.hp.rms_eps)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.w.lm_head)  # [n, V]

    def layer(self, lw: LayerWeights, h: torch.Tensor, cache: LayerCache, start: int, *,
              shared: list[torch.Tensor] | None = None, first: int = 0) -> tuple[torch.Tensor, list | None]:
        """One decoder layer over h [rows, H] at positions start.. (also the NextN layer's)."""
        hp = self.hp
        a, chosen = attention(lw.attn, rms_norm(h, lw.attn_norm, hp.rms_eps), cache, start, heads=hp.num_heads,
                              nope=hp.qk_nope_dim, topk=hp.index_topk, eps=hp.rms_eps, rope=self.rope,
                              shared=shared, first=first)
        h = h + a
        f = ffn(lw.ffn, rms_norm(h, lw.ffn_norm, hp.rms_eps), top_k=hp.experts_per_token, gating=hp.gating,
                groups=hp.expert_groups, groups_used=hp.groups_used, norm=hp.norm_topk, routed_scale=hp.routed_scale)
        return h + f, chosen

    def forward(self, tokens: Sequence[int], start: int, cache: TrunkCache) -> torch.Tensor:
        """Rows at positions start.. -> the post-final-norm hidden rows [rows, H]."""
        h = self.embed(list(tokens)).to(self.dtype)
        chosen = None
        for lw, lc in zip(self.w.layers, cache.layers):
            h, mine = self.layer(lw, h, lc, start, shared=chosen)
            chosen = mine if lw.attn.indexer is not None else chosen
        return self.final_norm(h)
