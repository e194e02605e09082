"""The NextN / MTP head of Qwen 3.5 / 3.6 / 3.8 and Qwen3-Next, as the target's ``DraftHead``.

One step, for token x at position p with h the trunk's post-final-norm row that predicted x
(the row of position p-1)::

    u   = eh_proj([RMSNorm_e(Emb(x)) ; RMSNorm_h(h)])        # [H]
    u'  = full-attention decoder layer(u) at position p        (own KV cache, same FFN kind)
    out = shared_head_norm(u')                                 # chained as the next step's h
    logits = lm_head(out)                                      # predicts position p+1

This is Hugging Face's ``MtpLayer`` (``modeling_layers.py``: eh_proj over [enorm(emb); hnorm(h)],
the block, then the post norm whose output both feeds the shared head and is chained) and
llama.cpp's ``graph_mtp`` (``h_nextn`` = shared_head_norm output). The embedding and LM head are
the trunk's unless the file carries ``nextn.embed_tokens`` / ``nextn.shared_head_head``.

The head's KV cache holds positions ``base .. end-1``; position 0 has no predecessor row (the
commit contract passes zeros there), and like HF and vLLM the head never sees it. Positions,
catch-up and sequence views (``for_sequence()``: one per speculator, so sequences served at once
never draft from each other's history) are ``tsspec_gguf.chained_head``'s. What views share is
read-only during a call (the weights, the trunk's RoPE, which computes its tables per call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tsspec_gguf.chained_head import ChainedHead

from .attention import KVCache
from .ops import rms_norm
from .weights import NextNWeights


class MtpHead(ChainedHead):
    """A per-token draft head over the NextN block of a ``Qwen35Trunk`` (positions, views and the
    ``DraftHead`` members: ``tsspec_gguf.chained_head``)."""

    name = "the MTP head"
    row_hint = "; are feature taps set?"

    def __init__(self, trunk, nextn: NextNWeights, max_context: int):
        self.hidden_size = trunk.hp.hidden_size
        super().__init__(trunk, nextn, max_context, trunk.hp.hidden_size)

    def _new_cache(self):
        hp = self.trunk.hp
        return KVCache(hp.num_kv_heads, hp.head_dim, self.trunk.dtype, self.trunk.device)

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, self.w.lm_head)  # [rows, vocab]

    def _run(self, tokens: list[int], h_rows: torch.Tensor, start: int) -> torch.Tensor:
        n = len(tokens)
        self.cache.ensure(start + n - self.base, self.max_context)
        trunk, hp, w = self.trunk, self.trunk.hp, self.w
        e = rms_norm(w.embed[torch.tensor(tokens, dtype=torch.long, device=w.embed.device)], w.enorm, hp.rms_eps)  # [n, H]
        h = rms_norm(h_rows.to(w.embed.device), w.hnorm, hp.rms_eps)
        u = F.linear(torch.cat([e, h], dim=-1), w.eh_proj)  # [n, H]
        cos, sin = trunk.rope.tables(torch.arange(start, start + n, device=w.embed.device))
        u = trunk.attention_block(w.layer, u, self.cache, start - self.base, cos, sin)
        return rms_norm(u, w.head_norm, hp.rms_eps)  # [n, H]
