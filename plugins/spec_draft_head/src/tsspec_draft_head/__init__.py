"""tsspec-draft-head: the ``draft-head`` speculation algorithm for per-token learned drafters
(NextN / MTP, EAGLE-shaped heads). Registered through the ``tsspec`` entry point ``draft-head``.
"""

from .confidence import GATE_TOP_K, passes_gate, top1_over_topk
from .plugin import make_draft_head, tsspec_register_speculators
from .speculator import FOLD_ENV, DraftHeadSpeculator, HeadCallCounters, fold_enabled

__all__ = [
    "DraftHeadSpeculator",
    "HeadCallCounters",
    "make_draft_head",
    "top1_over_topk",
    "passes_gate",
    "fold_enabled",
    "GATE_TOP_K",
    "FOLD_ENV",
    "tsspec_register_speculators",
]
