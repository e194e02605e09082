"""tsspec-select: ``auto``'s choice, by measured gain, among the speculators it may compose.

Where ``auto`` would pair the weight-free algorithm with the drafter the target carries (the
head says ``auto_fallback``), the registry hands both to the algorithm registered with
``composes_auto``: this plugin's ``select``, which runs each member alone, the pair (weight-free
first) or nothing, whichever its own step timings say is fastest (``choice.MeasuredChoice``).
Importing registers nothing by itself: the plugin manager calls the hook below at start-up.
"""

from __future__ import annotations

from tsspec import SpeculatorDeclined
from tsspec.hookspecs import hookimpl

from .choice import NAME, MeasuredChoice

__all__ = ["MeasuredChoice", "make_select", "tsspec_register_speculators"]

DESCRIPTION = (
    "auto's composer: runs the weight-free algorithm, the drafter, their pair or plain steps, "
    "whichever measures fastest in this request (re-measured as it runs); use --spec-type auto"
)


def make_select(target, options, members=None, memory=None):
    """The composition of ``members`` ({name: speculator}, the weight-free one first); asked
    directly (``--spec-type select``) it has nothing to compose and declines."""
    if not members:
        raise SpeculatorDeclined("select composes what auto pairs (a drafter with an auto_fallback head); "
                                 "use --spec-type auto")
    return MeasuredChoice(members, memory=memory)


@hookimpl
def tsspec_register_speculators(register):
    register(NAME, make_select, requires_draft_head=True, weight_free=False, composes_auto=True,
             description=DESCRIPTION, drafter_hint="a drafter whose head backs up the weight-free algorithm")
