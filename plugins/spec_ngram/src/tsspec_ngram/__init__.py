"""tsspec-ngram: the weight-free ``ngram`` speculator (prompt lookup), as a tsspec plugin.

The entry point ``ngram = "tsspec_ngram"`` points here; importing registers nothing by itself:
the plugin manager calls the hook below once at start-up.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

from .matching import NGramDrafter, NGramIndex, required_match_length
from .speculator import DEFAULT_MIN_DRAFT_PROB, NAME, NGramSpeculator, make_ngram

__all__ = [
    "NGramDrafter",
    "NGramIndex",
    "NGramSpeculator",
    "make_ngram",
    "required_match_length",
    "tsspec_register_speculators",
]

DESCRIPTION = (
    "n-gram prompt lookup: drafts what followed the last occurrence of the current suffix; "
    "no weights, serves every model"
)


@hookimpl
def tsspec_register_speculators(register):
    # auto_priority: `auto` prefers ngram over other weight-free algorithms on drafter-less models
    register(NAME, make_ngram, requires_draft_head=False, weight_free=True,
             auto_priority=100, description=DESCRIPTION)
