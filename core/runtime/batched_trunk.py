"""``BatchedSpecTrunk``: one sequence of a batched paged target, driven by the loop like any trunk.

Each forward becomes work for the ``BatchDriver``; prefills go in chunks of ``chunk_rows``.
``cache_seq_len`` counts positions whose KV is written; a sequence admitted with a cached prefix
starts with ``adopted_prefix`` positions it never computed."""

from __future__ import annotations

from typing import Sequence

import torch

from ..capabilities import paged_info

ALL, REWOUND = "all", "rewound"


class Cancelled(Exception):
    """The sequence was cancelled: unwind and free it."""


class BatchedSpecTrunk:
    """``table``: the sequence's blocks; ``seq_id``: its key in the paged KV; ``cancelled`` ends it."""

    def __init__(self, driver, table, *, max_context_length: int, chunk_rows: int, seq_id: int):
        self.driver = driver
        self.table = table
        self.seq_id = seq_id
        self.cancelled = False
        self._max_ctx = max_context_length
        self.chunk_rows = max(1, chunk_rows)
        self._len = table.length  # positions with KV written (adopted prefix included)
        self.adopted_prefix = table.reused_tokens
        self._last: tuple[int, list[int], bool] = (0, [], False)  # start, tokens, all rows?
        self._paged = paged_info(driver.kv)
        # what the last verify's extra rows cost the other sequences of its batch (ms); the
        # loop adds it to the verify's cost for the governor
        self.extra_cost_ms = 0.0

    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_ctx

    @property
    def spec_feature_size(self) -> int:  # read live: a drafter may set feature taps after admission
        return self.driver.target.spec_feature_size

    @property
    def _recurrent(self):
        """The paged KV's ``keep`` when it holds per-sequence recurrent state, else None."""
        return self._paged.keep

    @property
    def spec_verify_persists_accepted_kv(self) -> bool:
        return self._recurrent is None  # KV only: a rewind is the whole rollback

    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self._max_ctx:
            from ..errors import GenerationError

            raise GenerationError(f"{required_seq_len} tokens exceed the model's context of {self._max_ctx}")

    def _forward(self, tokens: list[int], *, all_logits: bool, want_hidden: bool):
        logits, hidden = self.driver.submit(self, tokens, all_logits=all_logits, want_hidden=want_hidden)
        self._len += len(tokens)
        return logits, hidden

    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        """A verify in one request, anything else in chunks of ``chunk_rows``; ``spec_keep`` follows."""
        tokens = [int(t) for t in tokens]
        self._last = (self._len, tokens, all_logits_rows)
        if all_logits_rows:
            return self._forward(tokens, all_logits=True, want_hidden=want_hidden)
        hiddens: list[torch.Tensor] = []
        logits = None
        for at in range(0, len(tokens), self.chunk_rows):
            logits, hidden = self._forward(tokens[at : at + self.chunk_rows], all_logits=False, want_hidden=want_hidden)
            if hidden is not None:
                hiddens.append(hidden)
        return logits, (torch.cat(hiddens, dim=0) if hiddens else None)

    def spec_keep(self, rows_kept: int) -> str:
        """Keep the first ``rows_kept`` rows of the last forward."""
        start, tokens, verify = self._last
        if not 1 <= rows_kept <= len(tokens):
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {len(tokens)}")
        if not verify and rows_kept != len(tokens):
            raise ValueError("only a verify (all_logits_rows) may keep fewer rows than it forwarded")
        mode = None
        keep = self._recurrent
        if keep is not None and verify:  # a hybrid: its recurrent state commits the kept row's slot
            mode = keep(self.seq_id, rows_kept)
        self._len = start + rows_kept
        self.table.commit(tokens[:rows_kept], start)
        self._last = (self._len, [], False)
        if mode is not None:
            return mode
        return ALL if rows_kept == len(tokens) else REWOUND

    def spec_rewind_cache(self, length: int) -> None:
        """Go back to ``length`` positions: any on a KV-only trunk, 0 on a hybrid."""
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot rewind {self._len} positions to {length}")
        if self._recurrent is not None and length not in (0, self._len):
            raise ValueError(f"cannot rewind a recurrent trunk from {self._len} to {length}")
        if self._paged.release is not None and self._recurrent is not None and length == 0 and self._len:
            self._paged.release(self.seq_id)  # a fresh state at the next forward
        self._len = length
        if length < self.table.length:
            self.table.truncate(length)
