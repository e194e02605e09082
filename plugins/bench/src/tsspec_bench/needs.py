"""What a drafter needs on this machine: the acceptance a draft of k tokens must reach to pay.

A step that drafts k tokens verifies them in one forward of k + 1 rows. In plain steps (a
1-row forward) it costs ``C(k) = R(k + 1) + k * d``: ``R(r)`` is the target's measured cost of
an r-row forward over a 1-row one, ``d`` a drafter's measured draft time per drafted token over
a plain step (0 for "drafting is free"). With the same per-token acceptance ``a`` at every
position (a draft token lands with chance ``a`` once the ones before it did: a geometric chain)
the step emits ``E(k, a) = 1 + a + ... + a^k`` tokens, so its speed-up over plain decoding is
``E(k, a) / C(k)``. From that, for each length k:

* break-even ``a``: ``E(k, a) = C(k)``;
* the ``a`` a goal speed-up ``g`` needs: ``E(k, a) = g * C(k)``;
* the ceiling, a perfect drafter of that length (``a = 1``): ``(k + 1) / C(k)``.

Worked example: 2 rows cost 1.22x one row, drafting free. k = 1: break-even 1 + a = 1.22,
a = 0.22; 1.4x needs 1 + a = 1.708, a = 0.708; the ceiling is 2 / 1.22 = 1.64x.

Every input is a figure measured on the machine the bench runs on (the cost by rows, timed in the
run itself where the target allows, else the run's own steps or the target's own profile; the
algorithms' draft time and acceptance at positions 1..k from the run); nothing here is a
constant of a machine. ``GOAL`` is a target to meet , not a measurement.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import attrs

from tsspec.cost_shape import parse_cost_shape, rows_cost

GOAL = 1.4  # the speed-up over plain a learned drafter should reach
SHORT_LENGTHS = (1, 2, 3)  # draft lengths shown beside the draft window
BISECTION_STEPS = 60  # halvings of [0, 1] when solving E(k, a) = target (2^-60: exact in floats)
MIN_VERIFIED = 20  # verified drafts below which a drafter's landing share is too rough to weigh (sd ~0.1)


def expected_tokens(a: float, k: int) -> float:
    """``E(k, a) = 1 + a + ... + a^k``: tokens a step drafting ``k`` emits at per-token
    acceptance ``a``.

    >>> expected_tokens(0.5, 2), expected_tokens(1.0, 3), expected_tokens(0.0, 4)
    (1.75, 4.0, 1.0)
    """
    total, chain = 1.0, 1.0
    for _ in range(int(k)):
        chain *= a
        total += chain
    return total


def acceptance_for(speedup: float, k: int, cost: float) -> float | None:
    """The per-token acceptance at which a ``k``-token draft costing ``cost`` plain steps runs
    at ``speedup`` over plain: 0 when even a = 0 reaches it, None when not even a = 1 does.

    >>> round(acceptance_for(1.4, 1, 1.22), 3), acceptance_for(2.0, 1, 1.22), acceptance_for(1.0, 1, 0.9)
    (0.708, None, 0.0)
    """
    if k < 1 or cost <= 0:
        return None
    need = speedup * cost  # tokens per step
    if need <= 1.0:
        return 0.0
    if need > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < need:
            lo = mid
        else:
            hi = mid
    return hi


def relative_costs(shape, rows: Sequence[int]) -> dict[int, float] | None:
    """``{r: R(r)}``: the cost of an r-row forward over a 1-row one, for each r in ``rows``, from
    a cost by rows ``((rows, ms), ..)`` (linear between its points, as the runtime prices drafts);
    None when the shape is missing or malformed.

    >>> relative_costs(((1, 10.0), (2, 12.2), (3, 15.0), (9, 40.0)), (2, 3, 6))
    {2: 1.22, 3: 1.5, 6: 2.75}
    """
    parsed = parse_cost_shape(shape)
    if parsed is None:
        return None
    one = rows_cost(parsed, 1)
    return {int(r): round(rows_cost(parsed, int(r)) / one, 6) for r in rows}


def shape_from_steps(plain_ms: float | None, verify_ms: Mapping[int, float]) -> tuple | None:
    """A cost by rows from a run's own step times: a plain step is 1 row, a verify step of a
    ``k``-token draft ``k + 1`` rows (``verify_ms``: {rows: ms a step}); None without a plain
    step or a verify step.

    >>> shape_from_steps(7.0, {3: 9.0, 9: 28.0})
    ((1, 7.0), (3, 9.0), (9, 28.0))
    """
    points = {int(r): float(ms) for r, ms in verify_ms.items() if r > 1 and ms and ms > 0}
    if not plain_ms or plain_ms <= 0 or not points:
        return None
    return parse_cost_shape([(1, float(plain_ms)), *points.items()])


def draft_lengths(window: int) -> list[int]:
    """The lengths the section shows: 1, 2, 3 and the draft window (those within it).

    >>> draft_lengths(8), draft_lengths(2)
    ([1, 2, 3, 8], [1, 2])
    """
    return sorted({k for k in (*SHORT_LENGTHS, int(window)) if 1 <= k <= int(window)})


@attrs.frozen
class LengthNeed:
    """What a draft of ``k`` tokens needs: its cost and the acceptance figures."""

    k: int
    verify_cost: float  # R(k + 1): a (k + 1)-row forward over a 1-row one
    draft_cost: float  # k * d, in plain steps
    break_even: float | None  # per-token acceptance where it pays for itself (None: never)
    goal: float | None  # per-token acceptance for GOAL (None: not even a perfect drafter)
    ceiling: float  # speed-up of a perfect drafter of this length

    @property
    def cost(self) -> float:
        return self.verify_cost + self.draft_cost

    def to_json(self) -> dict:
        return {"k": self.k, "rows": self.k + 1, "verify_cost": round(self.verify_cost, 4),
                "draft_cost": round(self.draft_cost, 4), "break_even": _round(self.break_even),
                "goal_acceptance": _round(self.goal), "ceiling": round(self.ceiling, 4)}


def length_needs(costs: Mapping[int, float], lengths: Sequence[int], *, draft_share: float = 0.0,
                 goal: float = GOAL) -> list[LengthNeed]:
    """A ``LengthNeed`` for each k in ``lengths`` (those whose k + 1 rows ``costs`` has), each
    drafted token costing ``draft_share`` of a plain step."""
    out = []
    for k in lengths:
        verify = costs.get(k + 1)
        if verify is None:
            continue
        cost = verify + k * draft_share
        out.append(LengthNeed(k, verify, k * draft_share, acceptance_for(1.0, k, cost),
                              acceptance_for(goal, k, cost), (k + 1) / cost))
    return out


@attrs.frozen
class DrafterMeasure:
    """What the run measured of one algorithm (all classes)."""

    name: str
    draft_ms_per_token: float | None  # draft-phase ms per drafted token (see report.drafter_needs_of)
    drafted_per_verify: float  # mean drafted tokens per verify step
    accepted: Sequence[float]  # [i]: share of its drafts whose token i + 1 landed
    speedup: float | None  # its own median paired speed-up
    verified: int = 0  # its drafts that reached a verify
    tokens_per_verify: float = 0.0  # tokens a verify step emitted on average


@attrs.frozen
class DrafterNeed:
    """One algorithm's needs under its own draft cost, beside what it landed."""

    measure: DrafterMeasure
    draft_share: float | None  # d: draft ms per drafted token over a plain step (None: unknown)
    needs: list[LengthNeed]
    verdict: str
    worth: float | None = None  # its verify steps' speed-up by these costs (tokens per verify / C(its length))

    def to_json(self) -> dict:
        m = self.measure
        return {"name": m.name, "draft_ms_per_token": _round(m.draft_ms_per_token),
                "draft_share": _round(self.draft_share), "drafted_per_verify": round(m.drafted_per_verify, 4),
                "verified_drafts": m.verified, "tokens_per_verify": round(m.tokens_per_verify, 4),
                "accepted_per_position": [round(x, 4) for x in m.accepted], "speedup": _round(m.speedup),
                "verify_steps_worth": _round(self.worth),
                "needs": [n.to_json() for n in self.needs], "verdict": self.verdict}


def cost_at(costs: Mapping[int, float], rows: float) -> float | None:
    """R at a fractional row count (a mean draft length + 1): linear between the neighbouring
    whole row counts of ``costs`` (1 row costs 1); None outside them.

    >>> cost_at({2: 1.2, 3: 1.5}, 2.5), cost_at({2: 1.2}, 1.5), cost_at({2: 1.2}, 4.0)
    (1.35, 1.1, None)
    """
    table = {1: 1.0, **{int(r): float(c) for r, c in costs.items()}}
    lo, hi = math.floor(rows), math.ceil(rows)
    if lo not in table or hi not in table:
        return None
    return table[lo] if lo == hi else table[lo] + (table[hi] - table[lo]) * (rows - lo)


def steps_worth(m: DrafterMeasure, costs: Mapping[int, float] | None, draft_share: float | None) -> float | None:
    """What the drafter's verify steps are worth by these costs: its tokens per verify over the
    cost of a step at its mean draft length (None without verified drafts or costs)."""
    if not costs or not m.verified or m.drafted_per_verify <= 0:
        return None
    verify = cost_at(costs, 1.0 + m.drafted_per_verify)
    if verify is None:
        return None
    return m.tokens_per_verify / (verify + m.drafted_per_verify * (draft_share or 0.0))


@attrs.frozen
class DrafterNeeds:
    """The section: the machine's needs (drafting free) and each algorithm's."""

    source: str | None  # where the cost by rows came from (None: not measured)
    costs: dict[int, float] | None  # {rows: R(rows)}
    plain_ms: float | None
    goal: float
    machine: list[LengthNeed]
    machine_verdict: str
    drafters: list[DrafterNeed]
    beside: dict[str, dict[int, float]] = attrs.field(factory=dict)  # other sources' {rows: R}, for comparison

    def to_json(self) -> dict:
        return {"source": self.source, "goal": self.goal, "plain_ms": _round(self.plain_ms),
                "relative_cost_by_rows": _costs_json(self.costs),
                "other_sources": {name: _costs_json(c) for name, c in self.beside.items()},
                "machine": [n.to_json() for n in self.machine], "machine_verdict": self.machine_verdict,
                "drafters": [d.to_json() for d in self.drafters]}


def _costs_json(costs: Mapping[int, float] | None) -> dict | None:
    return None if costs is None else {str(r): round(c, 4) for r, c in sorted(costs.items())}


def _round(x: float | None, places: int = 4) -> float | None:
    return None if x is None else round(x, places)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _least_goal(needs: Sequence[LengthNeed]) -> LengthNeed | None:
    """The length whose goal needs the lowest acceptance (ties: the shorter)."""
    reachable = [n for n in needs if n.goal is not None]
    return min(reachable, key=lambda n: (n.goal, n.k)) if reachable else None


def machine_verdict(needs: Sequence[LengthNeed], goal: float = GOAL) -> str:
    """One line on what the verify cost by rows allows a drafter whose drafting is free."""
    if not needs:
        return "No cost by rows was measured in this run: nothing to say what a drafter needs."
    best = max(needs, key=lambda n: n.ceiling)
    least = _least_goal(needs)
    if least is None:
        return (f"Even a perfect drafter with free drafting reaches only {best.ceiling:.2f}x (k = {best.k}): "
                f"the verify cost by rows stops every drafter short of {goal}x on this machine.")
    return (f"With free drafting, {goal}x needs a >= {least.goal:.2f} at k = {least.k} (the least of "
            f"k = {', '.join(str(n.k) for n in needs)}); a perfect 1-token drafter reaches "
            f"{needs[0].ceiling:.2f}x, a perfect {best.k}-token one {best.ceiling:.2f}x.")


def drafter_verdict(need: DrafterNeed, free: Sequence[LengthNeed], goal: float = GOAL) -> str:
    """One line that follows from the numbers: what stops this drafter short of ``goal``, if
    anything (the verify cost by rows, its draft cost, or its acceptance)."""
    m, needs = need.measure, need.needs
    if not needs:
        return "No cost by rows was measured in this run: nothing to weigh its acceptance against."
    a1 = m.accepted[0] if m.accepted else None
    if a1 is None or m.verified < MIN_VERIFIED:
        return f"only {m.verified} of its drafts reached a verify in this run: too few to weigh."
    least = _least_goal(needs)
    best = max(needs, key=lambda n: n.ceiling)
    if least is None:
        free_least = _least_goal(free)
        if free_least is None or not need.draft_share:
            return (f"even a perfect drafter of up to {best.k} tokens reaches only {best.ceiling:.2f}x "
                    f"(k = {best.k}): the verify cost by rows stops it short of {goal}x.")
        return (f"at its draft cost ({need.draft_share:.2f} of a plain step a token) even a perfect drafter "
                f"reaches only {best.ceiling:.2f}x (k = {best.k}), where free drafting would reach {goal}x "
                f"from a >= {free_least.goal:.2f} at k = {free_least.k}: its draft cost stops it.")
    paid = f" at its draft cost ({need.draft_share:.2f} of a plain step a token)" if need.draft_share else ""
    text = f"{goal}x needs a >= {least.goal:.2f} at k = {least.k}{paid}; it lands {a1:.2f} of its first drafts"
    if a1 < least.goal:
        free_least = _least_goal(free) if paid else None
        if free_least is not None and a1 >= free_least.goal:
            return (text + f": its draft cost stops it (with free drafting a >= {free_least.goal:.2f} at "
                    f"k = {free_least.k} would do).")
        low = [n for n in needs if n.break_even is not None]
        be = min(low, key=lambda n: (n.break_even, n.k)) if low else None
        if be is not None and a1 < be.break_even:
            text += f", below even the break-even {be.break_even:.2f} (k = {be.k})"
        text += ": acceptance stops it"
        if free_least is not None:
            text += f" (free drafting would still need a >= {free_least.goal:.2f} at k = {free_least.k})"
        return text + "."
    measured = ""
    if need.worth is not None and m.speedup is not None:
        measured = (f" Its verify steps are worth {need.worth:.2f}x by these costs; it measured {m.speedup:.2f}x "
                    "over plain, its undrafted steps included.")
    if least.k == 1:
        return text + f": enough for {goal}x with one-token drafts." + measured
    later = ", ".join(f"{x:.2f}" for x in m.accepted[1:least.k])
    return (text + f": enough at position 1; {goal}x also needs positions 2..{least.k} to land that often "
            f"given the ones before (it lands {later or 'nothing'} of its drafts there)." + measured)


def drafter_needs(costs: Mapping[int, float] | None, source: str | None, window: int, plain_ms: float | None,
                  measures: Sequence[DrafterMeasure], goal: float = GOAL,
                  beside: Mapping[str, Mapping[int, float]] | None = None) -> DrafterNeeds:
    """The section's figures: ``costs`` {rows: R(rows)} (None: not measured), the draft
    ``window``, a plain step's ms (for the draft shares) and each algorithm's measures;
    ``beside``: other sources' costs by name, kept for comparison only."""
    lengths = draft_lengths(window)
    costs = dict(costs) if costs else None
    machine = length_needs(costs, lengths, goal=goal) if costs else []
    drafters = []
    for m in measures:
        share = (m.draft_ms_per_token / plain_ms
                 if m.draft_ms_per_token is not None and plain_ms and math.isfinite(m.draft_ms_per_token) else None)
        needs = length_needs(costs, lengths, draft_share=share or 0.0, goal=goal) if costs else []
        partial = DrafterNeed(m, share, needs, "", steps_worth(m, costs, share))
        drafters.append(attrs.evolve(partial, verdict=drafter_verdict(partial, machine, goal)))
    return DrafterNeeds(source if costs else None, costs, plain_ms, goal, machine,
                        machine_verdict(machine, goal), drafters,
                        {name: dict(c) for name, c in (beside or {}).items()})


def rounded_length(drafted_per_verify: float) -> int:
    """A mean draft length rounded half up, at least 1.

    >>> rounded_length(1.5), rounded_length(1.49), rounded_length(0.2)
    (2, 1, 1)
    """
    return max(1, int(math.floor(drafted_per_verify + 0.5)))
