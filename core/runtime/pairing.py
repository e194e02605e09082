"""SpeculatorPair: ``auto``'s pairing of a weight-free algorithm with a learned drafter.

The primary (the preferred weight-free algorithm, e.g. prompt lookup) proposes first: it costs
next to nothing and, where it finds a match, usually lands more than a small drafter. Only where
it finds nothing does the backup (the algorithm that serves the drafter the target carries)
propose, and only while the backup's OWN cost governor measures it paying: the pair keeps a
``SpeculationCostGovernor`` for the backup, fed with the steps the backup drafted and the plain
steps (its baseline), so a drafter that loses on this machine and this prompt is parked while
the primary keeps drafting. Steps the primary drafted teach the backup's governor nothing.

The loop's own governor still judges the pair as a whole. The primary sizes its own drafts
(the pair says ``sizes_own_drafts``); the backup's length is its governor's ``draft_limit``.
Both members see every commit, so either can propose at the next step. Neither can change the
output: the loop verifies whatever is proposed.

The loop reports each step to a speculator that has ``observe_step(speculative, ms, tokens,
drafted)`` (optional in the protocol); the pair uses it to feed the backup's governor.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs

from .governor import SpeculationCostGovernor

PRIMARY, BACKUP = "primary", "backup"


class SpeculatorPair:
    """A primary speculator with a governed backup (see the module docstring)."""

    handles_own_prefill = False
    sizes_own_drafts = True  # the primary sizes its drafts; the backup's governor sizes the backup's

    def __init__(self, primary: Any, backup: Any, *, governor: SpeculationCostGovernor | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.primary, self.backup = primary, backup
        self.name = f"{getattr(primary, 'name', 'primary')}+{getattr(backup, 'name', 'backup')}"
        self.needs_hidden_state = bool(primary.needs_hidden_state or backup.needs_hidden_state)
        self.can_arm_after_prefix_reuse = bool(
            getattr(primary, "can_arm_after_prefix_reuse", False) and getattr(backup, "can_arm_after_prefix_reuse", False)
        )
        self.max_draft_tokens = max(_limit(primary), _limit(backup))
        self.governor = governor or SpeculationCostGovernor()
        self.clock = clock
        self.source: str | None = None  # who proposed this step's drafts (None: nobody)
        self.proposed = {PRIMARY: 0, BACKUP: 0}  # proposals that reached verification, by member

    def propose(self, ctx) -> Sequence[int]:
        self.source = None
        drafts = _as_list(self.primary.propose(ctx))
        if drafts:
            self.source = PRIMARY
            return drafts
        if not self.governor.want_speculation():
            return []
        limit = min(_limit(self.backup), int(ctx.max_tokens), self.governor.draft_limit(int(ctx.max_tokens)))
        if limit < 1:
            return []
        start = self.clock()
        drafts = _as_list(self.backup.propose(attrs.evolve(ctx, max_tokens=limit)))
        if drafts:
            self.source = BACKUP
        else:  # an attempt that found nothing: its cost is the backup's
            self.governor.record_empty_proposal((self.clock() - start) * 1000.0)
        return drafts

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        self.primary.commit(tokens, hidden_rows, start_pos)
        self.backup.commit(tokens, hidden_rows, start_pos)

    def observe_step(self, speculative: bool, ms: float, tokens: int, drafted: int) -> None:
        """The loop's report of the step just taken (after ``propose`` and the commit)."""
        if speculative:
            if self.source is not None:
                self.proposed[self.source] += 1
            if self.source == BACKUP:
                self.governor.record(True, ms, tokens, drafted=drafted)
        else:
            self.governor.record(False, ms, tokens)
        self.source = None

    def reset(self) -> None:
        self.source = None
        self.governor.reset()
        self.primary.reset()
        self.backup.reset()

    def close(self) -> None:
        for member in (self.primary, self.backup):
            close = getattr(member, "close", None)
            if callable(close):
                close()


def _limit(speculator: Any) -> int:
    """A member's ``max_draft_tokens`` (a large number when it declares none or garbage)."""
    try:
        return max(0, int(getattr(speculator, "max_draft_tokens", 1 << 16)))
    except Exception:
        return 1 << 16


def _as_list(proposal: Any) -> list:
    """A member's proposal as a list (None: nothing); the loop validates the pair's result."""
    return [] if proposal is None else list(proposal)
