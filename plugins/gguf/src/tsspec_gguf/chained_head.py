"""``ChainedHead``: the position bookkeeping of a per-token draft head that chains its own output.

An MTP / NextN head runs one decoder block over (the token, the trunk row that predicted it) with
a cache of its own, and its output row is the next step's input row. What every such head does
alike lives here: the ``DraftHead`` members, sequence views, and which positions the cache holds.

The cache holds positions ``base .. end-1`` by absolute position. Position 0 has no predecessor
row, so the head never sees it (a catch-up from 0 starts at 1). A catch-up from ``start`` drops
everything at or after ``start`` (rejected drafts); a start past ``end`` is a gap the head never
saw, and it restarts there. ``for_sequence()`` is a view over the same weights and trunk (nothing
copied) with its own cache and positions; its ``counts`` add to the head's.

A subclass gives ``name``, ``_new_cache()``, ``_run(tokens, h_rows, start) -> [n, ...]`` (the
block over positions ``start ..``, growing the cache) and ``logits(rows) -> [rows, vocab]``.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch

from tsspec.protocols import DraftHeadKind, HeadCounts


class ChainedHead:
    """A per-token draft head over one block with its own cache (subclass it; see the module)."""

    kind = DraftHeadKind.PER_TOKEN
    block_size = 1
    resumes_after_gap = False
    name = "the draft head"  # in error messages
    row_text = "one trunk hidden row"  # what ``h_rows`` holds per token, in error messages
    row_hint = ""  # appended to the width error (e.g. a likely cause)

    def __init__(self, trunk, weights, max_context: int, feature_size: int):
        self.trunk = trunk
        self.w = weights
        self.max_context = max_context
        self.feature_size = feature_size  # the width of one h row
        self.counts = HeadCounts()  # a view's calls and rows also add to the head's
        self._new_state()

    # -- what a subclass gives ------------------------------------------------------------------
    def _new_cache(self):
        raise NotImplementedError

    def _run(self, tokens: list[int], h_rows: torch.Tensor, start: int) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- sequence state -------------------------------------------------------------------------
    def _new_state(self) -> None:
        """Fresh sequence state: an empty cache, no positions."""
        self.cache = self._new_cache()
        self.base: int | None = None  # first position held in the cache
        self.end = 0  # next position to write

    def for_sequence(self):
        """A view for one sequence: the same weights and trunk, its own cache and positions."""
        view = copy.copy(self)  # shallow: trunk and weights shared
        view._new_state()
        view.counts = self.counts.view()
        return view

    def close(self) -> None:
        """Free this head's (or view's) cache; a later call starts a new sequence."""
        self._new_state()

    # -- the DraftHead protocol -----------------------------------------------------------------
    def reset(self) -> None:
        self.base, self.end = None, 0

    def draft_step(self, token: int, h_prev: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``token`` at ``pos`` with ``h_prev`` [F]; (logits [vocab] for pos+1, h_out [F])."""
        return self.draft_catch_up_and_step([int(token)], h_prev.reshape(1, -1), pos)

    def draft_catch_up(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int) -> None:
        """Tokens landed at ``start_pos ..``; ``h_rows`` [n, F] are the rows that predicted them."""
        self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=False)

    def draft_catch_up_and_step(self, tokens: Sequence[int], h_rows: torch.Tensor, start_pos: int
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up on ``tokens[:-1]`` and the step on ``tokens[-1]`` in one call; the last
        row's (logits [vocab], h_out [F])."""
        out = self._advance([int(t) for t in tokens], h_rows, int(start_pos), want_last=True)
        return self.logits(out[-1:])[0], out[-1].reshape(-1)

    def draft_block(self, last_token, h_prev, position, max_tokens):
        raise NotImplementedError(f"{self.name} is a per-token head: use draft_step")

    # -- positions ------------------------------------------------------------------------------
    def _place(self, start: int) -> None:
        """Make ``start`` the next position to write (dropping later entries, or restarting)."""
        if self.base is None or start < self.base or start > self.end:
            self.base, self.end = start, start
        else:
            self.end = start

    def _advance(self, tokens: list[int], h_rows: torch.Tensor, start: int, *, want_last: bool) -> torch.Tensor:
        if h_rows is None or h_rows.dim() != 2 or h_rows.shape[0] != len(tokens) or h_rows.shape[1] != self.feature_size:
            shape = None if h_rows is None else tuple(h_rows.shape)
            raise ValueError(f"{self.name} needs {self.row_text} ({self.feature_size} wide) per token "
                             f"(got {shape} for {len(tokens)} tokens{self.row_hint})")
        if not tokens:
            raise ValueError(f"no tokens to feed {self.name}")
        h_rows = h_rows.to(self.trunk.dtype)
        if start == 0 and (len(tokens) > 1 or not want_last):
            tokens, h_rows, start = tokens[1:], h_rows[1:], 1  # position 0 has no predecessor row
            if not tokens:
                self._place(1)
                return h_rows
        self._place(start)
        self.counts.add(len(tokens))
        out = self._run(tokens, h_rows, start)
        self.end = start + len(tokens)
        return out
