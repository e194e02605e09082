"""The DeepSeek V4 MTP block (``num_nextn_predict_layers``) as the target's per-token ``DraftHead``.

One step, for token x at position p with S_prev the trunk's hyper-connection streams of the
row that predicted x (position p-1, [hc, H])::

    S      = e_proj(RMSNorm_e(Emb(x)))  +  h_proj(RMSNorm_h(S_prev))      # broadcast over hc streams
    S'     = V4 decoder layer(S) at position p    (sliding-window attention with its own cache,
                                                   learned-routing MoE, its own hyper-connections)
    logits = lm_head(RMSNorm(hyper_head_mtp(S')))                        # predicts position p+1
    S'     is chained as the next step's S_prev

This is DeepSeek's ``MTPBlock`` (``inference/model.py``: ``e_proj(enorm(embed)) + h_proj(hnorm(x))``
over the streams, the full block, then the head with the block's own ``hc_head_*`` and ``norm``;
embedding and LM head shared with the trunk). transformers 5.24 ignores ``mtp.*`` on load
(``_keys_to_ignore_on_load_unexpected``), so the oracle is a float64 reference of these
equations built from transformers' own V4 layer classes (tests/test_mtp.py).

Positions (the cache holds ``base .. end-1``; position 0 is never seen), catch-up and sequence
views are ``tsspec_gguf.chained_head``'s, shared with the other MTP-shaped heads. What views share
is read-only during a call, or guarded (the trunk's RoPE table grows under a lock).
"""

from __future__ import annotations

import torch

from tsspec_gguf.chained_head import ChainedHead

from .attention import LayerCache
from .invariant import linear
from .ops import hyper_head, rms_norm
from .weights import MtpWeights


class MtpHead(ChainedHead):
    """A per-token draft head over the MTP block of a ``DeepseekV4Trunk`` (positions, views and the
    ``DraftHead`` members: ``tsspec_gguf.chained_head``)."""

    name = "the MTP head"
    row_text = "one row of the trunk's streams"
    row_hint = "; are feature taps set?"

    def __init__(self, trunk, mtp: MtpWeights, max_context: int):
        hp = trunk.hp
        self.hc, self.hidden = hp.hc_mult, hp.hidden_size
        super().__init__(trunk, mtp, max_context, hp.hc_mult * hp.hidden_size)

    def _new_cache(self):
        return LayerCache(self.w.layer.attn, self.trunk.hp.head_dim, self.trunk.dtype)

    def logits(self, streams: torch.Tensor) -> torch.Tensor:
        """[rows, hc, H] -> [rows, V] through the block's own hyper head and norm."""
        hp, w = self.trunk.hp, self.w
        collapsed = hyper_head(streams, w.hc_head.fn, w.hc_head.base, w.hc_head.scale,
                               hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        return self.trunk.lm_head(rms_norm(collapsed, w.norm, hp.rms_eps))

    def _run(self, tokens: list[int], h_rows: torch.Tensor, start: int) -> torch.Tensor:
        n = len(tokens)
        self.cache.ensure(start + n)
        trunk, hp, w = self.trunk, self.trunk.hp, self.w
        ids = torch.tensor(tokens, dtype=torch.long)
        with torch.no_grad():
            e = rms_norm(trunk.embed(ids), w.enorm, hp.rms_eps)  # [n, H]
            h = rms_norm(h_rows.view(n, self.hc, self.hidden), w.hnorm, hp.rms_eps)  # [n, hc, H]
            streams = linear(e, w.e_proj).unsqueeze(1) + linear(h.reshape(n * self.hc, self.hidden), w.h_proj).view(n, self.hc, self.hidden)  # [n, hc, H]
            return trunk.layer(w.layer, streams, ids, self.cache, start, 0, first=self.base)  # [n, hc, H]
