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

The head's KV cache holds positions ``base .. end-1``. Position 0 has no predecessor row (the
commit contract passes zeros there), and like HF and vLLM the head never sees it: a catch-up
from position 0 starts at 1. A catch-up from ``start`` drops everything at or after ``start``
(rejected drafts); a start past ``end`` is a gap the head never saw, and it restarts from there.

Sequence views: ``for_sequence()`` returns a head over the same weights and trunk (nothing is
copied) with its own KV cache and positions; the ``draft-head`` algorithm drives one view per
speculator, so sequences served at once (each from its own thread) never draft from each other's
history. ``close()`` frees a view's cache (it regrows on the next call). What views share is
read-only during a call (the weights, the trunk's RoPE, which computes its tables per call); a
view's ``counts`` (calls, rows) are also added to its head's (totals over every sequence).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.protocols import DraftHeadKind, HeadCounts

from .attention import KVCache
from .ops import rms_norm
from .weights import NextNWeights


class MtpHead:
    """A per-token draft head over the NextN block of a ``Qwen35Trunk``."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False

    def __init__(self, trunk, nextn: NextNWeights, max_context: int):
        self.trunk = trunk
        self.w = nextn
        self.max_context = max_context
        hp = trunk.hp
        self.hidden_size = hp.hidden_size
        self.counts = HeadCounts()  # a view's calls and rows also add to the head's
        self._new_state()

    def _new_state(self) -> None:
        """Fresh sequence state: an empty KV cache, no positions."""
        self._drop_cache()

    def _drop_cache(self) -> None:
        hp = self.trunk.hp
        self.cache = KVCache(hp.num_kv_heads, hp.head_dim, self.trunk.dtype, self.trunk.device)
        self.base: int | None = None  # first position held in the cache
        self.end = 0  # next position to write

    # -- sequence views -------------------------------------------------------------------------
    def for_sequence(self) -> "MtpHead":
        """A view for one sequence: the same weights and trunk (nothing copied), its own KV cache
        and positions (see the module docstring)."""
        view = copy.copy(self)  # shallow: trunk and weights shared
        view._new_state()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) KV cache; a later call starts a new sequence."""
        self._drop_cache()

    # -- the DraftHead protocol -------------------------------------------------------------
    def reset(self) -> None:
        self.base, self.end = None, 0

    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``token`` at ``pos`` with ``h_prev`` [H]; (logits [vocab] for pos+1, h_out [H])."""
        return self.draft_catch_up_and_step([int(token)], h_prev.reshape(1, -1), pos)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        """Tokens landed at ``start_pos ..``; ``h_rows`` [n, H] are the rows that predicted them."""
        self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)

    def draft_catch_up_and_step(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One call over every row: the catch-up on ``tokens[:-1]`` and the step on
        ``tokens[-1]``; returns the last row's (logits [vocab], h_out [H])."""
        out = self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)
        logits = F.linear(out[-1:], self.w.lm_head)[0]  # [vocab]
        return logits, out[-1]

    def draft_block(self, last_token, h_prev, position, max_tokens):
        raise NotImplementedError("the MTP head is a per-token head: use draft_step")

    # -- internals -----------------------------------------------------------------------------
    def _place(self, start: int) -> None:
        """Make ``start`` the next position to write (dropping later entries, or restarting)."""
        if self.base is None or start < self.base or start > self.end:
            self.base, self.end = start, start
        else:
            self.end = start

    def _advance(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool) -> torch.Tensor:
        if h_rows.dim() != 2 or h_rows.shape[0] != len(tokens) or h_rows.shape[1] != self.hidden_size:
            raise ValueError(
                f"the MTP head needs one trunk hidden row of width {self.hidden_size} per token "
                f"(got {tuple(h_rows.shape)} for {len(tokens)} tokens; are feature taps set?)"
            )
        if not tokens:
            raise ValueError("no tokens to feed the MTP head")
        h_rows = h_rows.to(self.trunk.dtype)
        if start == 0 and (len(tokens) > 1 or not want_last):
            tokens, h_rows, start = tokens[1:], h_rows[1:], 1  # position 0 has no predecessor row
            if not tokens:
                self._place(1)
                return h_rows
        self._place(start)
        n = len(tokens)
        self.cache.ensure(start + n - self.base, self.max_context)
        self.counts.add(n)
        trunk, hp, w = self.trunk, self.trunk.hp, self.w
        e = rms_norm(w.embed[torch.tensor(tokens, dtype=torch.long, device=w.embed.device)], w.enorm, hp.rms_eps)  # [n, H]
        h = rms_norm(h_rows.to(w.embed.device), w.hnorm, hp.rms_eps)
        u = F.linear(torch.cat([e, h], dim=-1), w.eh_proj)  # [n, H]
        cos, sin = trunk.rope.tables(torch.arange(start, start + n, device=w.embed.device))
        u = trunk.attention_block(w.layer, u, self.cache, start - self.base, cos, sin)
        self.end = start + n
        return rms_norm(u, w.head_norm, hp.rms_eps)  # [n, H]
