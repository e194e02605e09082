"""The GLM 5.x NextN layer as the target's per-token ``DraftHead``.

For token x at position p, h the trunk's post-norm row of p-1 (or the previous step's output)::

    u = eh_proj([RMSNorm_e(Emb(x)) ; RMSNorm_h(h)]);  u' = decoder layer(u) at p (own compressed
    KV cache, dense attention: no indexer);  out = RMSNorm_head(u') (chained);  logits = head(out)

llama.cpp's ``glm-dsa`` ``graph_mtp``: ``shared_head_norm`` falls back to ``output_norm``,
``shared_head_head`` / ``nextn.embed_tokens`` to the trunk's. transformers does not build this
layer; tests/test_nextn.py holds it to a float64 reference of these equations. The cache holds
positions ``base .. end-1`` by absolute position; position 0 has no predecessor row and is never
seen; a catch-up from ``start`` drops what lies at or after it, a start past ``end`` restarts
there. ``for_sequence()`` is a view over the same weights with its own cache and positions.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F

from tsspec.protocols import DraftHeadKind, HeadCounts

from .ops import rms_norm
from .weights import NextNWeights


class NextNHead:
    """A per-token draft head over the NextN layer of a ``GlmDsaTrunk``."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False

    def __init__(self, trunk, nextn: NextNWeights, max_context: int):
        self.trunk = trunk
        self.w = nextn
        self.max_context = max_context
        self.hidden_size = trunk.hp.hidden_size
        self.embed = nextn.embed if nextn.embed is not None else trunk.w.embed
        self.head = nextn.head if nextn.head is not None else trunk.w.lm_head
        self.counts = HeadCounts()
        self._new_state()

    def _new_state(self) -> None:
        self.cache = self.trunk.new_layer_cache(self.w.layer)
        self.base: int | None = None
        self.end = 0

    def for_sequence(self) -> "NextNHead":
        view = copy.copy(self)
        view._new_state()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        self._new_state()

    # -- the DraftHead protocol -----------------------------------------------------------------
    def reset(self) -> None:
        self.base, self.end = None, 0

    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``token`` at ``pos`` with ``h_prev`` [H]; (logits [vocab] for pos+1, h_out [H])."""
        return self.draft_catch_up_and_step([int(token)], h_prev.reshape(1, -1), pos)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)

    def draft_catch_up_and_step(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up on ``tokens[:-1]`` and the step on ``tokens[-1]`` in one call; the last
        row's (logits [vocab], h_out [H])."""
        out = self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)
        return F.linear(out[-1:], self.head)[0], out[-1]

    def draft_block(self, last_token, h_prev, position, max_tokens):
        raise NotImplementedError("the NextN head is a per-token head: use draft_step")

    # -- internals ------------------------------------------------------------------------------
    def _place(self, start: int) -> None:
        if self.base is None or start < self.base or start > self.end:
            self.base, self.end = start, start
        else:
            self.end = start

    def _advance(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool) -> torch.Tensor:
        if h_rows is None or h_rows.dim() != 2 or h_rows.shape[0] != len(tokens) or h_rows.shape[1] != self.hidden_size:
            shape = None if h_rows is None else tuple(h_rows.shape)
            raise ValueError(f"the NextN head needs one trunk hidden row of width {self.hidden_size} per token "
                             f"(got {shape} for {len(tokens)} tokens)")
        if not tokens:
            raise ValueError("no tokens to feed the NextN head")
        h_rows = h_rows.to(self.trunk.dtype)
        if start == 0 and (len(tokens) > 1 or not want_last):
            tokens, h_rows, start = tokens[1:], h_rows[1:], 1  # position 0 has no predecessor row
            if not tokens:
                self._place(1)
                return h_rows
        self._place(start)
        n = len(tokens)
        self.cache.ensure(start + n)
        self.counts.add(n)
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
            out = rms_norm(torch.cat(outs), w.head_norm, hp.rms_eps)
        self.end = start + n
        return out  # [n, H]
