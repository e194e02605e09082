"""Trunks: the seam between the shared loop and a model's KV regime.

``LinearSpecTrunk`` drives a ``SpeculativeTarget`` through its own linear cache;
``BatchedSpecTrunk`` (``tsspec.runtime.batched_trunk``) is one sequence of a paged target that
the scheduler batches with others. The loop only ever talks to the ``SpecTrunk`` protocol, so a batch-invariant
(deterministic) trunk can later be slotted in the same way.
"""

from __future__ import annotations

from typing import Sequence

ALL, COMMITTED, REWOUND, REFORWARD = "all", "committed", "rewound", "reforward"


class LinearSpecTrunk:
    """One sequence on a target's own cache."""

    def __init__(self, target):
        self.target = target

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
        self.target.spec_on_verify_accepted(len(tokens) - 1, len(tokens))
        return logits, hidden

    def snapshot(self) -> None:
        self.target.spec_snapshot_recurrent_state()

    def verify(self, tokens: Sequence[int], *, want_hidden: bool):
        return self.target.spec_forward(tokens, all_logits_rows=True, want_hidden=want_hidden)

    def keep(self, start: int, tokens: Sequence[int], kept_rows: int) -> str:
        rows = len(tokens)
        if self.target.spec_on_verify_accepted(kept_rows - 1, rows):
            return COMMITTED
        if kept_rows == rows:
            return ALL
        if self.target.spec_verify_persists_accepted_kv:
            self.target.spec_rewind_cache(start + kept_rows)
            return REWOUND
        # no per-row snapshot and no usable KV: restore and re-advance over the kept prefix
        self.target.spec_restore_recurrent_state()
        self.target.spec_rewind_cache(start)
        self.target.spec_forward(tokens[:kept_rows], all_logits_rows=False, want_hidden=False)
        self.target.spec_on_verify_accepted(kept_rows - 1, kept_rows)
        return REFORWARD

    def rewind(self, length: int) -> None:
        self.target.spec_rewind_cache(length)

    def reset(self) -> None:
        self.target.spec_rewind_cache(0)
