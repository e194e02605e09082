"""Trunks: the seam between the shared loop and a model's KV regime.

``LinearSpecTrunk`` drives a ``SpeculativeTarget`` through its own linear cache;
``BatchedSpecTrunk`` (``tsspec.runtime.batched_trunk``) is one sequence of a paged target that
the scheduler batches with others. The loop only ever talks to the ``SpecTrunk`` protocol.

Rollback has one contract: after any forward the trunk calls the target's
``spec_keep(rows_kept)``; the target puts itself into the state after the first ``rows_kept``
rows of that forward, however it can (KV length, per-row slot, restore + re-forward).
"""

from __future__ import annotations

from typing import Sequence

# how a verify's rows were kept, as counted in SpecStats.rollback_modes
ALL, COMMITTED, REWOUND, REFORWARD = "all", "committed", "rewound", "reforward"
KEEP_MODES = (ALL, COMMITTED, REWOUND, REFORWARD)


class LinearSpecTrunk:
    """One sequence on a target's own cache."""

    def __init__(self, target):
        self.target = target
        self._rows = 0  # rows of the last forward

    @property
    def seq_len(self) -> int:
        return self.target.cache_seq_len

    @property
    def max_context_length(self) -> int:
        return self.target.max_context_length

    @property
    def feature_size(self) -> int:
        return self.target.spec_feature_size

    @property
    def can_rewind(self) -> bool:
        return bool(self.target.spec_verify_persists_accepted_kv)

    def ensure_capacity(self, required_seq_len: int) -> None:
        self.target.spec_ensure_capacity(required_seq_len)

    def forward_keep_all(self, tokens: Sequence[int], *, want_hidden: bool):
        logits, hidden = self.target.spec_forward(tokens, all_logits_rows=False, want_hidden=want_hidden)
        self.target.spec_keep(len(tokens))
        return logits, hidden

    def verify(self, tokens: Sequence[int], *, want_hidden: bool):
        self._rows = len(tokens)
        return self.target.spec_forward(tokens, all_logits_rows=True, want_hidden=want_hidden)

    def keep(self, rows_kept: int) -> str:
        """Keep the first ``rows_kept`` rows of the last ``verify``; returns how (KEEP_MODES).
        A target may name its way by returning a mode from ``spec_keep``; one that returns None
        kept everything ('all'), or rewound its KV / committed its state for a prefix."""
        mode = self.target.spec_keep(rows_kept)
        if mode in KEEP_MODES:
            return mode
        if rows_kept == self._rows:
            return ALL
        return REWOUND if self.can_rewind else COMMITTED

    def rewind(self, length: int) -> None:
        self.target.spec_rewind_cache(length)

    def reset(self) -> None:
        self.target.spec_rewind_cache(0)
