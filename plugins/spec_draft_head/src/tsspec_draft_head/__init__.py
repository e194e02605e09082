"""tsspec-draft-head: the ``draft-head`` speculation algorithm for per-token learned drafters
(NextN / MTP, EAGLE-shaped heads). Registered through the ``tsspec`` entry point ``draft-head``.

Importing this package stays cheap (no torch): the speculator's modules load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .plugin import (tsspec_register_drafters, tsspec_register_speculators, tsspec_register_switches,
                     tsspec_register_trainers)

_LAZY = {
    "GATE_TOP_K": ".confidence",
    "passes_gate": ".confidence",
    "top1_over_topk": ".confidence",
    "make_draft_head": ".plugin",
    "FOLD_ENV": ".speculator",
    "DraftHeadSpeculator": ".speculator",
    "HeadCallCounters": ".speculator",
    "fold_enabled": ".speculator",
    "NATIVE_ENV": ".nextn_file",
}

__all__ = [*_LAZY, "tsspec_register_speculators", "tsspec_register_drafters", "tsspec_register_trainers",
           "tsspec_register_switches"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


