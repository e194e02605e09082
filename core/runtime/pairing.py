"""SpeculatorPair: ``auto``'s pairing of a weight-free algorithm with a learned drafter.

The primary (the preferred weight-free algorithm, e.g. prompt lookup) proposes first: it costs
next to nothing and, where it finds a match, usually lands more than a small drafter. Only where
it finds nothing does the backup (the algorithm that serves the drafter the target carries)
propose. Each member has its OWN ``SpeculationCostGovernor``, fed with the steps that member
drafted and the plain steps (the baseline both share), so a drafter that loses on this machine
and this prompt is parked while the primary keeps drafting, and the other way round. Judging
the pair as a whole would let a losing backup park a winning primary. The pair therefore
governs itself (``governs_itself``: the loop's governor stands aside) and sizes the drafts
(``sizes_own_drafts``): each member gets its governor's ``draft_limit`` (a member that sizes
its own drafts gets the whole window, one token while its probe has landed nothing). Both
members see every commit, so either can propose at the next step. Neither can change the
output: the loop verifies whatever is proposed.

A backup that lost is remembered across sequences: the pair writes its governor's park (steps
left, next backoff) into ``memory`` (a dict the registry keeps per target) when a sequence ends
parked, and the next sequence on that target starts the backup parked for the rest of it, with
the backoff still growing. Otherwise every request would pay a fresh probe of a drafter that
keeps losing on this machine; a backup that won, or that ends a sequence unparked, leaves no
memory and the next sequence probes it afresh. The primary always starts fresh (the weight-free
algorithm's gain depends on the prompt, and its probes cost next to nothing).

The loop reports each step to a speculator that has ``observe_step(speculative, ms, tokens,
drafted)`` (optional in the protocol); the pair uses it to feed its members' governors and
passes it on to members that have it: a member hears its own verifies as verifies and every
other step (the other member's verifies included) as a step it did not draft, so its state is
what it would be drafting alone (ngram keys its next proposal by whether ITS last drafts all
landed; hearing the backup's failed verifies as its own declined its good matches).

A member's proposal that carries ``evidence`` (``tsspec.protocols.Proposal``) is sized by that
member's governor for its key (``SpeculationCostGovernor.size_proposal``); one it declines
counts in ``declined_drafts`` and leaves the step to the backup, as an empty one does.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs

from ..capabilities import SpeculatorInfo, speculator_info
from .governor import SpeculationCostGovernor
from .proposal import proposal_confidence, proposal_evidence

PRIMARY, BACKUP = "primary", "backup"


class SpeculatorPair:
    """A primary speculator with a governed backup (see the module docstring)."""

    handles_own_prefill = False
    sizes_own_drafts = True  # each member's governor sizes that member's drafts
    governs_itself = True  # the loop's governor stands aside: the members' own govern

    def __init__(self, primary: Any, backup: Any, *, adaptive: bool = True,
                 governors: tuple[SpeculationCostGovernor, SpeculationCostGovernor] | None = None,
                 memory: dict | None = None, clock: Callable[[], float] = time.perf_counter):
        self.primary, self.backup = primary, backup
        self.infos = {PRIMARY: speculator_info(primary), BACKUP: speculator_info(backup)}
        first, second = self.infos[PRIMARY], self.infos[BACKUP]
        self.name = f"{first.name}+{second.name}"
        self.needs_hidden_state = first.needs_hidden_state or second.needs_hidden_state
        self.can_arm_after_prefix_reuse = first.can_arm_after_prefix_reuse and second.can_arm_after_prefix_reuse
        self.max_draft_tokens = max(_limit(first), _limit(second))
        if governors is None:
            governors = tuple(
                SpeculationCostGovernor(enabled=adaptive, size_drafts=not i.sizes_own_drafts)
                for i in (first, second)
            )
        self.governors = {PRIMARY: governors[0], BACKUP: governors[1]}
        self.memory = memory  # the backup's park carried between sequences (see the module docstring)
        self.clock = clock
        self.source: str | None = None  # who proposed this step's drafts (None: nobody)
        self.proposed = {PRIMARY: 0, BACKUP: 0}  # proposals that reached verification, by member
        self.evidence = None  # the evidence key of this step's drafts
        self.confidence = None  # their per-draft confidence (None: not given)
        self.declined_drafts = 0  # keyed proposals a member's governor did not verify

    def propose(self, ctx) -> Sequence[int]:
        self.source, self.evidence, self.confidence = None, None, None
        for role, member in ((PRIMARY, self.primary), (BACKUP, self.backup)):
            drafts = self._ask(role, member, ctx)
            if drafts:
                self.source = role
                return drafts
        return []

    def _ask(self, role: str, member: Any, ctx) -> list:
        """``member``'s drafts, when its governor lets it draft (its cost is recorded)."""
        governor = self.governors[role]
        if not governor.want_speculation():
            return []
        window = int(ctx.max_tokens)
        limit = min(_limit(self.infos[role]), window, governor.draft_limit(window))
        if limit < 1:
            return []
        start = self.clock()
        raw = member.propose(attrs.evolve(ctx, max_tokens=limit))
        drafts = _as_list(raw)
        if drafts:
            evidence, _ = proposal_evidence(raw)  # unhashable evidence: sized as unkeyed
            confidence, _ = proposal_confidence(raw, len(drafts))  # malformed: sized without it
            keep = governor.size_proposal(len(drafts), evidence, confidence)
            if keep < 1:
                self.declined_drafts += 1
            drafts = drafts[:keep]
            self.evidence = evidence
            self.confidence = None if confidence is None else confidence[:keep]
        if not drafts:  # an attempt that found nothing (or was declined): its cost is this member's
            governor.record_empty_proposal((self.clock() - start) * 1000.0)
        return drafts

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        self.infos[PRIMARY].commit(tokens, hidden_rows, start_pos)
        self.infos[BACKUP].commit(tokens, hidden_rows, start_pos)

    def observe_step(self, speculative: bool, ms: float, tokens: int, drafted: int) -> None:
        """The loop's report of the step just taken (after ``propose`` and the commit)."""
        if speculative and self.source is not None:
            self.proposed[self.source] += 1
            self.governors[self.source].record(True, ms, tokens, drafted=drafted, evidence=self.evidence,
                                               confidence=self.confidence)
        elif not speculative:
            for governor in self.governors.values():
                governor.record(False, ms, tokens)
        for role, info in self.infos.items():
            observe = info.observe_step
            if observe is None:
                continue
            if speculative and role == self.source:
                observe(True, ms, tokens, drafted)
            else:  # the other member's verify is, to this one, a step it did not draft
                observe(False, ms, tokens, 0)
        self.source, self.evidence, self.confidence = None, None, None

    def governor_counts(self) -> tuple[int, int, int]:
        """(wins, losses, parked steps) of both members' governors together."""
        gs = self.governors.values()
        return sum(g.wins for g in gs), sum(g.losses for g in gs), sum(g.parked_steps for g in gs)

    def reset(self) -> None:
        self._remember()  # a sequence that ended without close (the loop reuses the pair)
        self.source = None
        for governor in self.governors.values():
            governor.reset()
        carried = self.memory.pop(BACKUP, None) if self.memory is not None else None
        if carried is not None:
            self.governors[BACKUP].start_parked(*carried)
        self.infos[PRIMARY].reset()
        self.infos[BACKUP].reset()

    def _remember(self) -> None:
        if self.memory is not None:
            carried = self.governors[BACKUP].carry_over()
            if carried is not None:
                self.memory[BACKUP] = carried

    def close(self) -> None:
        self._remember()
        for info in self.infos.values():
            info.close()


def _limit(info: SpeculatorInfo) -> int:
    """A member's ``max_draft_tokens`` (a large number when it declares none)."""
    return 1 << 16 if info.max_draft_tokens is None else info.max_draft_tokens


def _as_list(proposal: Any) -> list:
    """A member's proposal as a list (None: nothing); the loop validates the pair's result."""
    return [] if proposal is None else list(proposal)
