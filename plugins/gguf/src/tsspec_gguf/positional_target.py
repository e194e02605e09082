"""``PositionalTarget``: the rollback of a target whose whole state is stored by absolute position.

When every layer keeps its keys (and whatever else it derives from a row) by position and a row
only reads positions at or before its own, keeping the first ``n`` rows of the last forward or
rewinding to any earlier length is a change of length: nothing is snapshotted or re-forwarded
(``spec_verify_persists_accepted_kv = True``). This holds the length, the last forward's span,
the counters and the ``SpeculativeTarget`` members that only touch them; a subclass runs its
trunk in ``spec_forward`` between ``_rows_in`` and ``_forwarded``.
"""

from __future__ import annotations

from typing import Sequence

import attrs


@attrs.define
class TargetCounters:
    forward_calls: int = 0
    forward_rows: int = 0
    keeps: int = 0  # spec_keep calls that dropped rows


class PositionalTarget:
    """Length, last-forward span and rollback for a by-position target (subclass it)."""

    speculation_profitable = True  # the trunk verifies without a drafter: n-gram serves it
    speculation_refusal = None
    spec_preferred_draft_window = None
    spec_verify_persists_accepted_kv = True

    def _start_positions(self, cache, max_context: int, vocab_size: int) -> None:
        """An empty state over ``cache`` (with ``ensure(n)`` and ``nbytes()``)."""
        self._cache = cache
        self._max_context = int(max_context)
        self._vocab_size = int(vocab_size)
        self.counters = TargetCounters()
        self._len = 0
        self._last_start = self._last_end = 0  # the last forward covered positions _last_start .. _last_end - 1
        self.draft_head = None

    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_context

    @property
    def cache_bytes(self) -> int:
        return self._cache.nbytes()

    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self._max_context:
            raise ValueError(f"{required_seq_len} positions exceed the context of {self._max_context}")
        self._cache.ensure(required_seq_len)

    def _rows_in(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` checked (at least one, inside the vocabulary) with room made for them."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("spec_forward needs at least one token")
        bad = [t for t in tokens if not 0 <= t < self._vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self._vocab_size - 1})")
        self.spec_ensure_capacity(self._len + len(tokens))
        return tokens

    def _forwarded(self, rows: int) -> None:
        """``rows`` rows were forwarded at the current length."""
        start = self._len
        self.counters.forward_calls += 1
        self.counters.forward_rows += rows
        self._len = start + rows
        self._last_start, self._last_end = start, start + rows

    def spec_keep(self, rows_kept: int) -> None:
        """Keep the state after the first ``rows_kept`` rows of the last forward."""
        if not 0 <= rows_kept <= self._last_end - self._last_start:
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {self._last_end - self._last_start}")
        if self._len != self._last_end:
            raise RuntimeError("spec_keep after the cache was rewound past the last forward")
        if self._last_start + rows_kept < self._len:
            self.counters.keeps += 1
        self._len = self._last_start + rows_kept
        self._last_end = self._len

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self._len}")
        self._len = length
        self._last_start = self._last_end = length
        if length == 0 and self.draft_head is not None:
            self.draft_head.reset()
