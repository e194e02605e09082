"""How the shared loop drives a trunk: a target's own cache, or one sequence of a paged batch.

The loop talks to the ``SpecTrunk`` protocol, which is the target's own members
(``spec_forward``, ``spec_keep``, ``spec_rewind_cache`` ...): a ``SpeculativeTarget`` is a trunk
as it is, and ``BatchedSpecTrunk`` offers the same members for one paged sequence.

Rollback has one contract: after any forward the loop calls ``spec_keep(rows_kept)``; the trunk
puts itself into the state after the first ``rows_kept`` rows of that forward, however it can
(KV length, per-row slot, restore + re-forward).
"""

from __future__ import annotations

from typing import Sequence

# how a verify's rows were kept, as counted in SpecStats.rollback_modes
ALL, COMMITTED, REWOUND, REFORWARD = "all", "committed", "rewound", "reforward"
KEEP_MODES = (ALL, COMMITTED, REWOUND, REFORWARD)


def forward_all(trunk, tokens: Sequence[int], *, want_hidden: bool):
    """Forward ``tokens`` and keep every row (prefill, plain steps): logits [1, vocab] of the
    last row, hidden [rows, F] or None."""
    logits, hidden = trunk.spec_forward(tokens, all_logits_rows=False, want_hidden=want_hidden)
    trunk.spec_keep(len(tokens))
    return logits, hidden


def keep(trunk, rows_kept: int, rows: int, persists: bool) -> str:
    """Keep the first ``rows_kept`` of the last verify's ``rows``; returns how (KEEP_MODES).
    A trunk may name its way by returning a mode from ``spec_keep``; one that returns None kept
    everything ('all'), or rewound its KV (``persists``) / committed its state for a prefix."""
    mode = trunk.spec_keep(rows_kept)
    if mode in KEEP_MODES:
        return mode
    if rows_kept == rows:
        return ALL
    return REWOUND if persists else COMMITTED
