"""SpeculatorPair: ``auto``'s weight-free algorithm (primary) with a learned drafter (backup).

The backup proposes only where the primary finds nothing; both see every commit. To the loop
the pair is one speculator, parked and sized like any other."""

from __future__ import annotations

from typing import Any, Sequence

from ..capabilities import speculator_info

PRIMARY, BACKUP = "primary", "backup"


class SpeculatorPair:
    """A primary speculator with a backup that drafts where the primary finds nothing."""

    def __init__(self, primary: Any, backup: Any):
        self.primary, self.backup = primary, backup
        self.infos = {PRIMARY: speculator_info(primary), BACKUP: speculator_info(backup)}
        first, second = self.infos[PRIMARY], self.infos[BACKUP]
        self.name = f"{first.name}+{second.name}"
        self.needs_hidden_state = first.needs_hidden_state or second.needs_hidden_state
        self.can_arm_after_prefix_reuse = first.can_arm_after_prefix_reuse and second.can_arm_after_prefix_reuse
        limits = [i.max_draft_tokens for i in (first, second)]
        self.max_draft_tokens = None if None in limits else max(limits)
        self.source: str | None = None  # who proposed this step's drafts (None: nobody)
        self.proposed = {PRIMARY: 0, BACKUP: 0}  # proposals that came back with drafts, by member

    def propose(self, ctx) -> Sequence[int]:
        self.source = None
        for role, member in ((PRIMARY, self.primary), (BACKUP, self.backup)):
            drafts = member.propose(ctx)
            if drafts is not None and len(drafts):
                self.source = role
                self.proposed[role] += 1
                return drafts  # as the member gave it (a Proposal keeps its confidence)
        return []

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        self.infos[PRIMARY].commit(tokens, hidden_rows, start_pos)
        self.infos[BACKUP].commit(tokens, hidden_rows, start_pos)

    def reset(self) -> None:
        self.source = None
        self.infos[PRIMARY].reset()
        self.infos[BACKUP].reset()

    def close(self) -> None:
        for info in self.infos.values():
            info.close()
