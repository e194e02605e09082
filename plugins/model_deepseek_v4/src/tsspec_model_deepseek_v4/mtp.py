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

The head's cache holds positions ``base .. end-1`` by absolute position. Position 0 has no
predecessor row; like the Qwen MTP head, the head never sees it (a catch-up from 0 starts at 1).
A catch-up from ``start`` drops everything at or after ``start``; a start past ``end`` is a gap
the head never saw, and it restarts there.

Sequence views: ``for_sequence()`` returns a head over the same weights and trunk (nothing is
copied) with its own layer cache and positions; the ``draft-head`` algorithm drives one view per
speculator, so sequences served at once (each from its own thread) never draft from each other's
history. ``close()`` frees a view's cache (it regrows on the next call). What views share is
read-only during a call, or guarded (the trunk's RoPE table grows under a lock); a view's
``counts`` (calls, rows) are also added to its head's (totals over every sequence).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch

from tsspec.protocols import DraftHeadKind, HeadCounts

from .attention import LayerCache
from .invariant import linear
from .ops import hyper_head, rms_norm
from .weights import MtpWeights


class MtpHead:
    """A per-token draft head over the MTP block of a ``DeepseekV4Trunk``."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False

    def __init__(self, trunk, mtp: MtpWeights, max_context: int):
        self.trunk = trunk
        self.w = mtp
        self.max_context = max_context
        hp = trunk.hp
        self.hc, self.hidden = hp.hc_mult, hp.hidden_size
        self.feature_size = hp.hc_mult * hp.hidden_size
        self.counts = HeadCounts()  # a view's calls and rows also add to the head's
        self._new_state()

    def _new_state(self) -> None:
        """Fresh sequence state: an empty cache, no positions."""
        self._drop_cache()

    def _drop_cache(self) -> None:
        self.cache = LayerCache(self.w.layer.attn, self.trunk.hp.head_dim, self.trunk.dtype)
        self.base: int | None = None
        self.end = 0

    # -- sequence views -------------------------------------------------------------------------
    def for_sequence(self) -> "MtpHead":
        """A view for one sequence: the same weights and trunk (nothing copied), its own cache and
        positions (see the module docstring)."""
        view = copy.copy(self)  # shallow: trunk and weights shared
        view._new_state()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) cache; a later call starts a new sequence."""
        self._drop_cache()

    # -- the DraftHead protocol ---------------------------------------------------------------
    def reset(self) -> None:
        self.base, self.end = None, 0

    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draft_catch_up_and_step([int(token)], h_prev.reshape(1, -1), pos)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)

    def draft_catch_up_and_step(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up on ``tokens[:-1]`` and the step on ``tokens[-1]`` in one call; the last
        row's (logits [vocab], chained streams [hc * H])."""
        streams = self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)
        return self.logits(streams[-1:])[0], streams[-1].reshape(-1)

    def draft_block(self, last_token, h_prev, position, max_tokens):
        raise NotImplementedError("the MTP head is a per-token head: use draft_step")

    def logits(self, streams: torch.Tensor) -> torch.Tensor:
        """[rows, hc, H] -> [rows, V] through the block's own hyper head and norm."""
        hp, w = self.trunk.hp, self.w
        collapsed = hyper_head(streams, w.hc_head.fn, w.hc_head.base, w.hc_head.scale,
                               hc_eps=hp.hc_eps, norm_eps=hp.rms_eps)
        return self.trunk.lm_head(rms_norm(collapsed, w.norm, hp.rms_eps))

    # -- internals ------------------------------------------------------------------------------
    def _place(self, start: int) -> None:
        if self.base is None or start < self.base or start > self.end:
            self.base, self.end = start, start
        else:
            self.end = start

    def _advance(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool) -> torch.Tensor:
        if h_rows is None or h_rows.dim() != 2 or h_rows.shape[0] != len(tokens) or h_rows.shape[1] != self.feature_size:
            shape = None if h_rows is None else tuple(h_rows.shape)
            raise ValueError(
                f"the MTP head needs one row of the trunk's streams ({self.feature_size} wide) per token "
                f"(got {shape} for {len(tokens)} tokens; are feature taps set?)"
            )
        if not tokens:
            raise ValueError("no tokens to feed the MTP head")
        h_rows = h_rows.to(self.trunk.dtype)
        if start == 0 and (len(tokens) > 1 or not want_last):
            tokens, h_rows, start = tokens[1:], h_rows[1:], 1  # position 0 has no predecessor row
            if not tokens:
                self._place(1)
                return h_rows.view(0, self.hc, self.hidden)
        self._place(start)
        n = len(tokens)
        self.cache.ensure(start + n)
        self.counts.add(n)
        trunk, hp, w = self.trunk, self.trunk.hp, self.w
        ids = torch.tensor(tokens, dtype=torch.long)
        with torch.no_grad():
            e = rms_norm(trunk.embed(ids), w.enorm, hp.rms_eps)  # [n, H]
            h = rms_norm(h_rows.view(n, self.hc, self.hidden), w.hnorm, hp.rms_eps)  # [n, hc, H]
            streams = linear(e, w.e_proj).unsqueeze(1) + linear(h.reshape(n * self.hc, self.hidden), w.h_proj).view(n, self.hc, self.hidden)  # [n, hc, H]
            streams = trunk.layer(w.layer, streams, ids, self.cache, start, 0, first=self.base)
        self.end = start + n
        return streams
