"""How the loop drives a trunk: after any forward, one ``spec_keep(rows_kept)``."""

from __future__ import annotations

from typing import Sequence

# how a verify's rows were kept, as counted in SpecStats.rollback_modes
ALL, COMMITTED, REWOUND, REFORWARD = "all", "committed", "rewound", "reforward"
KEEP_MODES = (ALL, COMMITTED, REWOUND, REFORWARD)


def forward_all(trunk, tokens: Sequence[int], *, want_hidden: bool):
    """Forward ``tokens`` keeping every row: logits [1, vocab], hidden [rows, F] or None."""
    logits, hidden = trunk.spec_forward(tokens, all_logits_rows=False, want_hidden=want_hidden)
    trunk.spec_keep(len(tokens))
    return logits, hidden


def keep(trunk, rows_kept: int, rows: int, persists: bool) -> str:
    """Keep the first ``rows_kept`` of ``rows``; how (KEEP_MODES), inferred when the trunk says None."""
    mode = trunk.spec_keep(rows_kept)
    if mode in KEEP_MODES:
        return mode
    if rows_kept == rows:
        return ALL
    return REWOUND if persists else COMMITTED
