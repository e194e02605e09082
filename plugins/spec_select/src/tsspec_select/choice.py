"""MeasuredChoice: run whichever of auto's candidates this request's own steps say is fastest.

The candidates are each member alone, the pair (the first member proposes, the second where it
finds nothing) and plain steps (propose nothing). The speculator times itself: every step ends in
exactly one ``commit``, so the time from one commit to the next is one step's cost, and the
tokens it commits are what that step emitted; the step is charged to the candidate that proposed
it (plain when none was asked: the governor's own plain steps count too). Milliseconds per
emitted token over a rolling window rank the candidates.

A request starts by probing every candidate for a few steps (or, when an earlier request on the
same target left its gains in ``memory``, from the best of them), then runs the fastest. It
re-picks within the request: at once when the running candidate's recent cost falls behind
another's measured cost, and by re-probing the others after a gap that doubles while the pick
holds. A candidate slower than plain steps is never the pick (plain is), so a losing
configuration only ever runs for its probes. Choosing never changes a token: every step is
verified by the loop like any other proposal.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

from tsspec.capabilities import speculator_info

log = logging.getLogger("tsspec.select")

NAME = "select"
PLAIN = "plain"
PROBE_STEPS = 4  # steps each candidate runs when probed
WINDOW = 24  # steps in a candidate's rolling cost
FIRST_GAP, MAX_GAP = 32, 512  # steps before the others are probed again (doubling while the pick holds)
MARGIN = 0.05  # a candidate must be this much cheaper per token to take over


class _Window:
    """The last ``size`` steps of one candidate: (ms, emitted tokens)."""

    def __init__(self, size: int):
        self.steps: deque[tuple[float, int]] = deque(maxlen=size)

    def add(self, ms: float, tokens: int) -> None:
        self.steps.append((ms, tokens))

    def ms_per_token(self) -> float | None:
        tokens = sum(t for _, t in self.steps)
        return sum(ms for ms, _ in self.steps) / tokens if tokens else None


class MeasuredChoice:
    """Speculator over ``members`` ({name: speculator}, at most two: the weight-free one first)
    that proposes with the candidate measured fastest in this request."""

    def __init__(self, members: Mapping[str, Any], *, memory: dict | None = None,
                 clock: Callable[[], float] = time.perf_counter, probe_steps: int = PROBE_STEPS,
                 window: int = WINDOW, first_gap: int = FIRST_GAP, max_gap: int = MAX_GAP):
        if not 1 <= len(members) <= 2:
            raise ValueError(f"select composes one or two speculators, got {len(members)}")
        self.members = dict(members)
        self.infos = {n: speculator_info(m) for n, m in self.members.items()}
        names = list(self.members)
        self.order = tuple(names)  # the pair's order: the first member proposes first
        self.pair = "+".join(names) if len(names) == 2 else None
        self.candidates = [*([self.pair] if self.pair else []), *names, PLAIN]
        self.name = NAME
        infos = list(self.infos.values())
        self.needs_hidden_state = any(i.needs_hidden_state for i in infos)
        self.can_arm_after_prefix_reuse = all(i.can_arm_after_prefix_reuse for i in infos)
        limits = [i.max_draft_tokens for i in infos]
        self.max_draft_tokens = None if None in limits else max(limits)
        self.memory = memory if memory is not None else {}
        self.clock, self.probe_steps, self.window_size = clock, probe_steps, window
        self.first_gap, self.max_gap = first_gap, max_gap
        self.picks: list[tuple[int, str, str]] = []  # (step, candidate, why) at every change of pick
        self.steps_by = {c: 0 for c in self.candidates}  # steps each candidate ran, this request
        self._start()

    # -- the loop's calls ----------------------------------------------------------------------
    def propose(self, ctx) -> Sequence[int]:
        self._asked, self._source = True, self.current
        if self.current == PLAIN:
            return []
        for name in (self.order if self.current == self.pair else (self.current,)):
            drafts = self.infos[name].propose(ctx)
            if drafts is not None and len(drafts):
                return drafts  # as the member gave it (a Proposal keeps its confidence)
        return []

    def commit(self, tokens: Sequence[int], hidden_rows: Any, start_pos: int) -> None:
        for info in self.infos.values():
            info.commit(tokens, hidden_rows, start_pos)
        now = self.clock()
        if self._last is not None:  # the step that ends here began at the last commit
            source = self._source if self._asked else PLAIN
            self.windows[source].add((now - self._last) * 1000.0, len(tokens))
            self.steps_by[source] += 1
            self._after_step(source)
        self._last, self._asked, self._source = now, False, PLAIN

    def reset(self) -> None:
        for info in self.infos.values():
            info.reset()
        self._start()

    def close(self) -> None:
        self.memory["gain"] = self.gains()
        for info in self.infos.values():
            info.close()

    # -- measuring and choosing ----------------------------------------------------------------
    def cost(self, candidate: str) -> float | None:
        """This request's milliseconds per emitted token of ``candidate`` (None: not measured)."""
        return self.windows[candidate].ms_per_token()

    def gains(self) -> dict[str, float]:
        """Each measured candidate's speed over plain steps (plain's cost / its cost)."""
        plain = self.cost(PLAIN)
        out = {}
        for c in self.candidates:
            mine = self.cost(c)
            if plain is not None and mine:
                out[c] = plain / mine
        return out

    def _start(self) -> None:
        """A new request: fresh windows; start from the remembered best, else probe everything."""
        self.windows = {c: _Window(self.window_size) for c in self.candidates}
        self._last, self._asked, self._source = None, False, PLAIN
        self.step, self.gap, self.since_pick = 0, self.first_gap, 0
        remembered = {c: g for c, g in dict(self.memory.get("gain") or {}).items() if c in self.candidates}
        if remembered:
            best = max(remembered, key=remembered.get)
            self.queue: list[str] = []
            self._pick(best if remembered[best] > 1.0 else PLAIN, "remembered from the last request")
        else:
            self.queue = list(self.candidates)
            self._probe_next()

    def _probe_next(self) -> None:
        while self.queue:
            candidate = self.queue.pop(0)
            if candidate == PLAIN and len(self.windows[PLAIN].steps) >= self.probe_steps:
                continue  # the governor's own plain steps already measured it
            self.windows[candidate].steps.clear()  # measured afresh: the context has moved on
            self.current, self.probing, self.probe_left = candidate, True, self.probe_steps
            return
        self.probing = False
        self._pick(self._best(), "probed")

    def _best(self) -> str:
        measured = {c: self.cost(c) for c in self.candidates if self.cost(c) is not None}
        if not measured:
            return PLAIN
        return min(measured, key=lambda c: (measured[c], c != PLAIN))

    def _pick(self, candidate: str, why: str) -> None:
        if not self.picks or self.picks[-1][1] != candidate:
            self.picks.append((self.step, candidate, why))
            log.info("select: step %d runs %s (%s)", self.step, candidate, why)
            self.gap = self.first_gap
        else:
            self.gap = min(self.max_gap, 2 * self.gap)
        self.current, self.probing, self.since_pick = candidate, False, 0

    def _after_step(self, source: str) -> None:
        self.step += 1
        if self.probing:
            if source == self.current:
                self.probe_left -= 1
            if self.probe_left <= 0:
                self._probe_next()
            return
        self.since_pick += 1
        mine = self.cost(self.current)
        if mine is not None and self.since_pick >= self.probe_steps:  # judged on fresh steps
            rivals = {c: self.cost(c) for c in self.candidates if c != self.current and self.cost(c) is not None}
            if rivals:
                best = min(rivals, key=rivals.get)
                if rivals[best] < mine * (1.0 - MARGIN):
                    self._pick(best, f"{self.current} fell behind")
                    return
        if self.since_pick >= self.gap:
            others = [c for c in self.candidates if c != self.current]
            others.sort(key=lambda c: self.cost(c) if self.cost(c) is not None else float("inf"))
            self.queue = [*others, self.current]
            self._probe_next()
