"""The GLM 5.x NextN layer as the target's per-token ``DraftHead``.

For token x at position p, h the trunk's post-norm row of p-1 (or the previous step's output)::

    u = eh_proj([RMSNorm_e(Emb(x)) ; RMSNorm_h(h)]);  u' = decoder layer(u) at p (own compressed
    KV cache, dense attention: no indexer);  out = RMSNorm_head(u') (chained);  logits = head(out)

llama.cpp's ``glm-dsa`` ``graph_mtp``: ``shared_head_norm`` falls back to ``output_norm``,
``shared_head_head`` / ``nextn.embed_tokens`` to the trunk's. transformers does not build this
layer; tests/test_nextn.py holds it to a float64 reference of these equations. The cache holds
positions ``base .. end-1`` by absolute position; position 0 has no predecessor row and is never
seen; a catch-up from ``start`` drops what lies at or after it, a start past ``end`` restarts
there (``tsspec_gguf.chained_head``, shared with the other MTP-shaped heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tsspec_gguf.chained_head import ChainedHead

from .ops import rms_norm
from .weights import NextNWeights


class NextNHead(ChainedHead):
    """A per-token draft head over the NextN layer of a ``GlmDsaTrunk`` (positions, views and the
    ``DraftHead`` members: ``tsspec_gguf.chained_head``)."""

    name = "the NextN head"

    def __init__(self, trunk, nextn: NextNWeights, max_context: int):
        self.hidden_size = trunk.hp.hidden_size
        self.embed = nextn.embed if nextn.embed is not None else trunk.w.embed
        self.head = nextn.head if nextn.head is not None else trunk.w.lm_head
        super().__init__(trunk, nextn, max_context, trunk.hp.hidden_size)

    def _new_cache(self):
        return self.trunk.new_layer_cache(self.w.layer)

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, self.head)  # [rows, vocab]

    def _run(self, tokens: list[int], h_rows: torch.Tensor, start: int) -> torch.Tensor:
        n = len(tokens)
        self.cache.ensure(start + n)
        hp, w = self.trunk.hp, self.w
        with torch.no_grad():
            e = rms_norm(self.embed[torch.tensor(tokens, dtype=torch.long)], w.enorm, hp.rms_eps)  # [n, H]
            h = rms_norm(h_rows, w.hnorm, hp.rms_eps)
            u = F.linear(torch.cat([e, h], dim=-1), w.eh_proj)  # [n, H]
            step = 1 if self.trunk.dtype == torch.float32 else n
            outs = []
            for at in range(0, n, step):
                part, _ = self.trunk.layer(w.layer, u[at : at + step], self.cache, start + at, first=self.base)
                outs.append(part)
            return rms_norm(torch.cat(outs), w.head_norm, hp.rms_eps)  # [n, H]
