"""SpeculativeExecution: the one implementation of draft -> verify -> accept -> keep -> commit.

A verify forwards ``[last, d1..dK]`` once; row i draws position ``p+1+i`` with the position-seeded
sampler and drafts are accepted while the draw equals them, so every emitted token comes from a
trunk row (lossless). The trunk keeps those rows (``spec_keep``); the speculator is committed
the kept tokens and the rows that predicted them. ``MAX_FAULTS`` faults park the speculator."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Iterator, Sequence

import attrs
import torch

from ..capabilities import speculator_info, target_info, trunk_extras
from ..protocols import DraftContext
from .governor import SpeculationCostGovernor
from .proposal import COMMIT_RAISED, MAX_FAULTS, PROPOSE_RAISED, HistoryView, proposal_confidence, validate_proposal
from .sampling import Sampler
from .stats import SpecStats
from .trunk import forward_all, keep

log = logging.getLogger("tsspec.execution")

_logged_faults: set[str] = set()  # speculators whose first fault was already logged


def accept(draw: Callable[[int], int], drafts: Sequence[int]) -> list[int]:
    """The tokens one verify emits: drafts accepted while row i draws ``drafts[i]``, then the
    corrected (or bonus) token. Rows are drawn lazily.

    >>> accept(lambda i: [5, 7, 9][i], [5, 6])  # 5 accepted, 7 corrects 6
    [5, 7]"""
    drawn: list[int] = []
    for i in range(len(drafts) + 1):
        token = draw(i)
        drawn.append(token)
        if i == len(drafts) or token != drafts[i]:
            break
    return drawn


@attrs.define
class _Timer:
    ms: float = 0.0
    start: float = 0.0  # the clock when the block began


@attrs.define
class SequenceState:
    """One running sequence: what it emitted and what the next step needs."""

    history: list[int]  # prompt + emitted tokens; history[-1] is the newest, not yet cached
    max_tokens: int
    on_token: Callable[[int], bool | None] | None = None
    emitted: list[int] = attrs.field(factory=list)
    carry: torch.Tensor | None = None  # [F]: the trunk row that predicted history[-1]
    want_hidden: bool = False
    done: bool = False


class SpeculativeExecution:
    """Runs one sequence at a time on a trunk, with an optional speculator."""

    def __init__(
        self,
        trunk,
        sampler: Sampler,
        *,
        vocab_size: int,
        speculator=None,
        window: int = 8,
        governor: SpeculationCostGovernor | None = None,
        stop_tokens: frozenset[int] = frozenset(),
        clock: Callable[[], float] = time.perf_counter,
        speculator_label: str | None = None,
        arm_after_reuse: bool | None = None,
    ):
        self.trunk = trunk
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.speculator = speculator
        self.window = window
        self.governor = governor or SpeculationCostGovernor(enabled=False)
        self.stop_tokens = frozenset(stop_tokens)
        self.clock = clock
        # what the loop reads of the speculator, once (a wrong member: ContractError, named)
        self.info = speculator_info(speculator) if speculator is not None else None
        self.label = speculator_label or (self.info.name if self.info is not None else "speculator")
        # after a reused KV prefix: None asks the speculator (can_arm_after_prefix_reuse);
        # False never arms after reuse (the refuse-all rule the serving benchmark compares against)
        self.arm_after_reuse = arm_after_reuse
        self.stats = SpecStats()
        self.seq: SequenceState | None = None
        self._cached: list[int] = []  # tokens in the trunk's cache after the last sequence
        self._armed = False
        self._faults = 0
        self._run_start = self._decode_start = 0.0
        # does the trunk undo a rejected tail by a KV rewind alone (any cached prefix reusable)?
        self._persists = target_info(trunk).verify_persists_accepted_kv

    def run(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        on_token: Callable[[int], bool | None] | None = None,
    ) -> list[int]:
        """Generate up to ``max_tokens`` after ``prompt``; ``on_token`` returning True stops."""
        seq = self.start(prompt, max_tokens, on_token=on_token)
        if max_tokens <= 0:
            return seq.emitted
        while not seq.done:
            self.step()
        self.finish()
        return seq.emitted

    def start(self, prompt: Sequence[int], max_tokens: int, *, on_token=None) -> SequenceState:
        """Prefill ``prompt`` and emit the first token."""
        prompt = [int(t) for t in prompt]
        self.stats = SpecStats(prompt_tokens=len(prompt))
        self._faults = 0
        self._run_start = self.clock()
        seq = self.seq = SequenceState(history=prompt, max_tokens=max_tokens, on_token=on_token)
        if max_tokens <= 0:
            seq.done = True
            return seq
        seq.want_hidden = self.info is not None and self.info.needs_hidden_state
        self.governor.reset()
        self._persists = target_info(self.trunk).verify_persists_accepted_kv
        logits = self._prefill(seq)
        self._decode_start = self.clock()
        self._emit(seq, self.sampler.sample(logits[-1], len(prompt), seq.history))
        return seq

    def step(self) -> None:
        """One decode step: a verify when the speculator drafts, else a plain one-row step."""
        seq = self.seq
        p = self.trunk.cache_seq_len  # position of `last`, the newest emitted token
        max_ctx = self.trunk.max_context_length
        if p + 1 > max_ctx:
            seq.done = True  # no room to forward the last token: the context is full
            return
        step_start = self.clock()
        k_max = min(self.window, max_ctx - p - 1, seq.max_tokens - len(seq.emitted) - 1)
        attempted = self._armed and k_max > 0 and self.governor.want_speculation()
        drafts, confidence = self._propose(self._context(seq, p, k_max)) if attempted else ([], None)
        if drafts and confidence is not None:  # verify only what pays
            drafts = drafts[: self.governor.size_proposal(len(drafts), confidence)]
        self.stats.steps += 1
        if drafts:
            self._verify_step(seq, p, drafts, step_start, confidence)
        else:
            self._plain_step(seq, p, attempted, self._ms(step_start))

    def finish(self) -> None:
        """Close the sequence's statistics and remember what the trunk caches for the next."""
        seq, stats, end = self.seq, self.stats, self.clock()
        stats.emitted_tokens = len(seq.emitted)
        stats.decode_ms = (end - self._decode_start) * 1000.0
        stats.wall_ms = (end - self._run_start) * 1000.0
        stats.governor_wins = self.governor.wins
        stats.governor_losses = self.governor.losses
        stats.governor_parked_steps = self.governor.parked_steps
        stats.declined_drafts = self.governor.declined
        n = self.trunk.cache_seq_len
        self._cached = seq.history[:n] if n <= len(seq.history) else []

    def _prefill(self, seq: SequenceState) -> torch.Tensor:
        """Forward the prompt after the longest reusable cached prefix and commit it; last row's logits."""
        trunk, prompt, info = self.trunk, seq.history, self.info
        reuse = self._reusable_prefix(prompt)
        if not reuse:  # a prefix cache's blocks the trunk was admitted with (batched trunks)
            reuse = min(trunk_extras(trunk)[0], len(prompt) - 1)
        trunk.spec_rewind_cache(reuse)
        arms = info is not None and info.can_arm_after_prefix_reuse and self.arm_after_reuse is not False
        self._armed = info is not None and (reuse == 0 or arms)
        self.stats.prefix_reused = reuse
        if reuse and info is not None:
            self.stats.armed_after_reuse = self._armed
            log.info("speculator %s %s after a reused prefix of %d tokens", self.label,
                     "armed" if self._armed else "not armed", reuse)
        if self._armed:
            try:
                info.reset()
            except Exception as exc:
                self._fault(COMMIT_RAISED, repr(exc))
        suffix = prompt[reuse:]
        with self._phase("prefill"):
            trunk.spec_ensure_capacity(len(prompt))
            logits, hidden = forward_all(trunk, suffix, want_hidden=seq.want_hidden and self._armed)
        rows = None
        if hidden is not None:
            # row k predicted suffix[k]: row 0's predecessor is the last reused row (or none at
            # position 0), which we do not have: zeros
            rows = torch.cat([hidden.new_zeros(1, hidden.shape[-1]), hidden[:-1]], dim=0)
            seq.carry = hidden[-1]
        if not (info is not None and info.handles_own_prefill):  # else it reads the prompt itself
            self._commit(suffix, rows, reuse)
        return logits

    def _plain_step(self, seq: SequenceState, p: int, attempted: bool, draft_ms: float) -> None:
        """Forward ``last`` alone, commit it and draw the next token from its row."""
        last, carry = seq.history[-1], seq.carry
        with self._phase("plain") as forward:
            logits, hidden = forward_all(self.trunk, [last], want_hidden=seq.want_hidden and self._armed)
        self.stats.plain_steps += 1
        self._commit([last], None if carry is None else carry[None], p)
        seq.carry = hidden[-1] if hidden is not None else None
        token = self.sampler.sample(logits[-1], p + 1, seq.history)
        # the step's cost is the forward, the draw and the commit: what a verify step's is, but
        # for the drafting (an attempt's cost is speculation's, charged apart just below)
        step_ms = self._ms(forward.start) if self._armed else forward.ms
        if attempted:
            self.governor.record_empty_proposal(draft_ms)
        self.governor.record(False, step_ms, 1)
        self._emit(seq, token)

    def _verify_step(self, seq: SequenceState, p: int, drafts: list[int], step_start: float,
                     confidence: list[float] | None = None) -> None:
        """Verify ``[last, *drafts]`` in one forward, emit what it accepts, keep those rows."""
        stats, sampler = self.stats, self.sampler
        rows_in = [seq.history[-1], *drafts]
        self.trunk.spec_ensure_capacity(p + len(rows_in))
        with self._phase("verify"):
            logits, hidden = self.trunk.spec_forward(rows_in, all_logits_rows=True, want_hidden=seq.want_hidden)
            back = sampler.lookback
            recent = seq.history[-back:] if back else []
            drawn = accept(
                lambda i: sampler.sample(logits[i], p + 1 + i, recent + drafts[:i] if back else recent),
                drafts,
            )
        stats.verify_steps += 1
        stats.record_acceptance(len(drafts), len(drawn) - 1)
        # emit in order; a stop token, the budget or a stop string may end the step early, and
        # then the cache keeps only what plain decoding would hold
        kept = 0  # rows kept: `last` plus the drafts emitted before the final token
        for token in drawn:
            kept += 1
            if self._emit(seq, token):
                break
        with self._phase("rollback"):
            mode = keep(self.trunk, kept, len(rows_in), self._persists)
        stats.rollback_modes[mode] = stats.rollback_modes.get(mode, 0) + 1
        rows = None
        if hidden is not None and seq.carry is not None:
            # row k of the commit predicted rows_in[k]: carry for `last`, then verify rows
            rows = torch.cat([seq.carry[None], hidden[: kept - 1]], dim=0)
            seq.carry = hidden[kept - 1]
        self._commit(rows_in[:kept], rows, p)
        # a batched trunk also charges what the verify's extra rows cost the rest of its batch
        ms = self._ms(step_start) + trunk_extras(self.trunk)[1]
        self.governor.record(True, ms, kept, drafted=len(drafts),
                             confidence=None if confidence is None else confidence[: len(drafts)])

    def _reusable_prefix(self, prompt: list[int]) -> int:
        """Leading prompt tokens the trunk still caches (never the whole prompt)."""
        cached = self._cached
        if not (self._persists and cached and self.trunk.cache_seq_len == len(cached)):
            return 0
        limit, reuse = min(len(cached), len(prompt) - 1), 0
        while reuse < limit and cached[reuse] == prompt[reuse]:
            reuse += 1
        return reuse

    def _context(self, seq: SequenceState, p: int, k_max: int) -> DraftContext:
        return DraftContext(
            last_token=seq.history[-1],
            position=p,
            max_tokens=self.governor.draft_limit(k_max),
            history=HistoryView(seq.history),
            carry_hidden=seq.carry,
            adjust_logits=self.sampler.adjust,
            vocab_size=self.vocab_size,
            adjust_lookback=self.sampler.lookback,
            window=self.window,
        )

    def _emit(self, seq: SequenceState, token: int) -> bool:
        """Record one emitted token; True when the sequence must stop after it."""
        seq.emitted.append(token)
        seq.history.append(token)
        stop = token in self.stop_tokens or len(seq.emitted) >= seq.max_tokens
        if seq.on_token is not None and seq.on_token(token):
            stop = True
        seq.done = seq.done or stop
        return stop

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[_Timer]:
        """Time the block into ``stats.phase_ms[name]``."""
        t0 = self.clock()
        timer = _Timer(start=t0)
        try:
            yield timer
        finally:
            timer.ms = self._ms(t0)
            self.stats.add_phase(name, timer.ms)

    def _ms(self, start: float) -> float:
        return (self.clock() - start) * 1000.0

    def _fault(self, kind: str, detail: str = "") -> None:
        self.stats.record_fault(kind)
        self._faults += 1
        if self.label not in _logged_faults:
            _logged_faults.add(self.label)
            log.warning("speculator %s: %s %s (output is unaffected)", self.label, kind, detail)
        if self._faults >= MAX_FAULTS and self._armed:
            self._armed = False
            self.stats.speculator_parked = True
            log.warning("speculator %s parked for this sequence after %d faults", self.label, self._faults)

    def _commit(self, tokens: Sequence[int], rows: torch.Tensor | None, start: int) -> None:
        if not self._armed:
            return
        with self._phase("commit"):
            try:
                self.info.commit(list(tokens), rows, start)
            except Exception as exc:
                self._fault(COMMIT_RAISED, repr(exc))

    def _propose(self, ctx: DraftContext) -> tuple[list[int], list[float] | None]:
        """The checked drafts and their confidence (None: none given)."""
        drafts, confidence, fault = [], None, None
        start = self.clock()  # the "draft" phase (as _phase times it; inline: this runs every step)
        try:  # the checks are total: only the speculator's own code raises
            raw = self.info.propose(ctx)
            drafts, kind = validate_proposal(raw, ctx.max_tokens, self.vocab_size)
            if drafts and not kind:
                confidence, kind = proposal_confidence(raw, len(drafts))
            if kind:
                drafts, confidence = [], None
            fault = (kind, "") if kind else None
        except Exception as exc:
            fault = (PROPOSE_RAISED, repr(exc))
        finally:
            self.stats.add_phase("draft", self._ms(start))
        if fault:
            self._fault(*fault)
        return drafts, confidence
