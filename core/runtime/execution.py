"""SpeculativeExecution: the one implementation of draft -> verify -> accept -> rollback -> commit.

Per decode step, with ``last`` the newest token (emitted, not yet in the trunk's cache) at
position ``p``:

1. Draft: ``speculator.propose(DraftContext)``. The result is untrusted input: a wrong type, an id
   outside the vocabulary, more tokens than allowed or an exception ends drafting for that step
   and is counted as a fault; after ``MAX_FAULTS`` the speculator is parked for the sequence.
2. Verify: ``[last, d1..dK]`` in ONE forward with all-row logits. Row i draws the token at
   position ``p+1+i`` with the position-seeded sampler; drafts are accepted while the draw equals
   the draft. The first draw that differs (or row K's draw when all are accepted) is the
   correction / bonus token. Every emitted token therefore comes from a trunk row: lossless.
3. Rollback: keep ``m+1`` rows (``last`` and m accepted drafts) through the trunk: a per-row
   recurrent snapshot is committed directly, a KV is rewound, or the pre-verify state is restored
   and the kept prefix re-forwarded.
4. Commit: the kept tokens and the exact hidden rows that predicted them go to the speculator.

An empty proposal is an ordinary one-row step that still commits to the speculator. The cost
governor beside the loop may park drafting; then steps are plain one-row steps.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
from typing import Callable, Sequence

import torch

from ..protocols import DraftContext
from .governor import SpeculationCostGovernor
from .sampling import Sampler
from .stats import SpecStats

log = logging.getLogger("tsspec.execution")

MAX_FAULTS = 3  # faults in one sequence before the speculator is parked for it

# fault kinds, as counted in SpecStats.fault_kinds
PROPOSE_RAISED = "propose_raised"
COMMIT_RAISED = "commit_raised"
BAD_TYPE = "bad_type"
BAD_ID = "bad_id"
OUT_OF_VOCAB = "out_of_vocab"
TOO_MANY = "too_many_tokens"

_logged_faults: set[str] = set()  # speculators whose first fault was already logged


def validate_proposal(raw: object, max_tokens: int, vocab_size: int) -> tuple[list[int], str | None]:
    """Turn an untrusted proposal into a list of ids, or ([], fault kind). Total: whatever the
    proposal's own methods do (raise, lie about their length, iterate forever) it returns.

    >>> validate_proposal([3, 4], 8, 10)
    ([3, 4], None)
    >>> validate_proposal([3, 99], 8, 10)
    ([], 'out_of_vocab')
    """
    if raw is None:
        return [], None
    try:  # hasattr / len run the proposal's own code, which may raise anything
        if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__") or not hasattr(raw, "__iter__"):
            return [], BAD_TYPE
        n = len(raw)
    except Exception:
        return [], BAD_TYPE
    if n > max_tokens:
        return [], TOO_MANY
    ids: list[int] = []
    try:
        # never iterate past the claimed length: an iterator that yields more is lying
        for item in itertools.islice(raw, n + 1):
            if len(ids) == n:
                return [], BAD_TYPE
            if isinstance(item, bool):
                return [], BAD_ID
            try:
                value = operator.index(item)  # ints, numpy ints, 0-d int tensors; never floats
            except Exception:
                return [], BAD_ID
            if not 0 <= value < vocab_size:
                return [], OUT_OF_VOCAB
            ids.append(value)
    except Exception:  # the iterator itself raised
        return [], BAD_TYPE
    return ids, None


class HistoryView(Sequence[int]):
    """A read-only view of the sequence so far, handed to ``propose`` without copying it
    (copying would make every step O(context)). Valid for the duration of the call."""

    __slots__ = ("_items",)

    def __init__(self, items: list[int]):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        return self._items[index]

    def __iter__(self):
        return iter(self._items)

    def __repr__(self) -> str:
        return f"HistoryView(len={len(self._items)})"


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
        self.label = speculator_label or getattr(speculator, "name", "speculator")
        # after a reused KV prefix: None asks the speculator (can_arm_after_prefix_reuse);
        # False is the old rule (never arm after reuse), kept for comparisons
        self.arm_after_reuse = arm_after_reuse
        self.stats = SpecStats()
        self._cached: list[int] = []  # tokens in the trunk's cache after the last run
        self._armed = False
        self._faults = 0

    # -- helpers ---------------------------------------------------------------------------
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
        t0 = self.clock()
        try:
            self.speculator.commit(list(tokens), rows, start)
        except Exception as exc:
            self._fault(COMMIT_RAISED, repr(exc))
        self.stats.add_phase("commit", self._ms(t0))

    def _propose(self, ctx: DraftContext) -> list[int]:
        t0 = self.clock()
        try:
            raw = self.speculator.propose(ctx)
        except Exception as exc:
            self.stats.add_phase("draft", self._ms(t0))
            self._fault(PROPOSE_RAISED, repr(exc))
            return []
        drafts, fault = validate_proposal(raw, ctx.max_tokens, self.vocab_size)
        self.stats.add_phase("draft", self._ms(t0))
        if fault:
            self._fault(fault)
        return drafts

    # -- the run ---------------------------------------------------------------------------
    def run(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        on_token: Callable[[int], bool | None] | None = None,
    ) -> list[int]:
        """Generate up to ``max_tokens`` tokens after ``prompt``. ``on_token(tok)`` is called for
        each emitted token and may return True to stop after it (stop strings)."""
        prompt = [int(t) for t in prompt]
        trunk, sampler, stats = self.trunk, self.sampler, SpecStats()
        self.stats = stats
        stats.prompt_tokens = len(prompt)
        self._faults = 0
        run_start = self.clock()
        emitted: list[int] = []
        if max_tokens <= 0:
            return emitted
        spec = self.speculator
        want_hidden = bool(spec is not None and spec.needs_hidden_state)
        self.governor.reset()

        # -- prefill, reusing a cached prefix when the trunk can rewind --------------------
        reuse = 0
        if trunk.can_rewind and self._cached and trunk.seq_len == len(self._cached):
            limit = min(len(self._cached), len(prompt) - 1)
            while reuse < limit and self._cached[reuse] == prompt[reuse]:
                reuse += 1
        if not reuse:  # a prefix cache's blocks the trunk was admitted with (batched trunks)
            reuse = min(int(getattr(trunk, "adopted_prefix", 0) or 0), len(prompt) - 1)
        if reuse:
            trunk.rewind(reuse)
        else:
            trunk.reset()
        # can_arm_after_prefix_reuse is optional in the protocol, default False
        arms = bool(getattr(spec, "can_arm_after_prefix_reuse", False)) and self.arm_after_reuse is not False
        self._armed = spec is not None and (reuse == 0 or arms)
        stats.prefix_reused = reuse
        if reuse and spec is not None:
            stats.armed_after_reuse = self._armed
            log.info("speculator %s %s after a reused prefix of %d tokens", self.label,
                     "armed" if self._armed else "not armed", reuse)
        if spec is not None and self._armed:
            try:
                spec.reset()
            except Exception as exc:
                self._fault(COMMIT_RAISED, repr(exc))
        suffix = prompt[reuse:]
        t0 = self.clock()
        trunk.ensure_capacity(len(prompt))
        logits, hidden = trunk.forward_keep_all(suffix, want_hidden=want_hidden and self._armed)
        stats.add_phase("prefill", self._ms(t0))
        carry = None
        if hidden is not None:
            carry = hidden[-1]
            shifted = torch.cat([hidden.new_zeros(1, hidden.shape[-1]), hidden[:-1]], dim=0)
            # row 0 of the suffix was predicted by the last reused row, which we do not have
            self._commit(suffix, shifted, reuse)
        else:
            self._commit(suffix, None, reuse)
        history = list(prompt)
        decode_start = self.clock()

        def emit(tok: int) -> bool:
            """Record one emitted token; True when generation must stop after it."""
            emitted.append(tok)
            history.append(tok)
            stop = tok in self.stop_tokens or len(emitted) >= max_tokens
            if on_token is not None and on_token(tok):
                stop = True
            return stop

        tok = sampler.sample(logits[-1], len(prompt), history)
        done = emit(tok)
        max_ctx = trunk.max_context_length
        while not done:
            p = trunk.seq_len  # position of `last`, the newest emitted token
            if p + 1 > max_ctx:
                break  # no room to forward the last token: the context is full
            last = history[-1]
            step_start = self.clock()
            k_max = min(self.window, max_ctx - p - 1, max_tokens - len(emitted) - 1)
            drafts: list[int] = []
            attempted = False
            if self._armed and k_max > 0 and self.governor.want_speculation():
                attempted = True
                ctx = DraftContext(
                    last_token=last,
                    position=p,
                    max_tokens=self.governor.draft_limit(k_max),
                    history=HistoryView(history),
                    carry_hidden=carry,
                    adjust_logits=sampler.adjust,
                    vocab_size=self.vocab_size,
                    adjust_lookback=sampler.lookback,
                )
                drafts = self._propose(ctx)
            stats.steps += 1
            if not drafts:
                draft_ms = self._ms(step_start)
                t1 = self.clock()
                logits, hidden = trunk.forward_keep_all([last], want_hidden=want_hidden and self._armed)
                stats.add_phase("plain", self._ms(t1))
                stats.plain_steps += 1
                self._commit([last], None if carry is None else carry[None], p)
                carry = hidden[-1] if hidden is not None else None
                tok = sampler.sample(logits[-1], p + 1, history)
                if attempted:
                    self.governor.record_empty_proposal(draft_ms)
                self.governor.record(False, self._ms(t1), 1)
                done = emit(tok)
                continue

            # -- verify ------------------------------------------------------------------
            k = len(drafts)
            rows_in = [last, *drafts]
            trunk.ensure_capacity(p + k + 1)
            t1 = self.clock()
            trunk.snapshot()
            stats.add_phase("snapshot", self._ms(t1))
            t1 = self.clock()
            logits, hidden = trunk.verify(rows_in, want_hidden=want_hidden)
            # -- accept: row i draws position p+1+i; accept while it equals the draft -----
            drawn: list[int] = []
            accepted = 0
            back = sampler.lookback
            recent = history[-back:] if back else []
            for i in range(k + 1):
                tok = sampler.sample(logits[i], p + 1 + i, recent + drafts[:i] if back else recent)
                drawn.append(tok)
                if i < k and tok == drafts[i]:
                    accepted += 1
                    continue
                break
            stats.add_phase("verify", self._ms(t1))
            stats.verify_steps += 1
            stats.record_acceptance(k, accepted)
            # emit drawn tokens in order; a stop token, the budget or a stop string may end
            # the step early, and then the cache keeps only what plain decoding would hold
            out = 0
            for tok in drawn:
                out += 1
                if emit(tok):
                    done = True
                    break
            kept_rows = out  # `last` plus the (out - 1) drafts emitted before the final token
            t1 = self.clock()
            mode = trunk.keep(p, rows_in, kept_rows)
            stats.add_phase("rollback", self._ms(t1))
            stats.rollback_modes[mode] = stats.rollback_modes.get(mode, 0) + 1
            if hidden is not None:
                rows = torch.cat([carry[None], hidden[: kept_rows - 1]], dim=0) if carry is not None else hidden[:kept_rows]
                self._commit(rows_in[:kept_rows], rows, p)
                carry = hidden[kept_rows - 1]
            else:
                self._commit(rows_in[:kept_rows], None, p)
            self.governor.record(True, self._ms(step_start), out)

        end = self.clock()
        stats.emitted_tokens = len(emitted)
        stats.decode_ms = (end - decode_start) * 1000.0
        stats.wall_ms = (end - run_start) * 1000.0
        stats.governor_wins = self.governor.wins
        stats.governor_losses = self.governor.losses
        stats.governor_parked_steps = self.governor.parked_steps
        self._cached = history[: trunk.seq_len] if trunk.seq_len <= len(history) else []
        return emitted
