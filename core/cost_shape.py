"""A target's forward cost by rows (its ``spec_verify_row_ms`` capability) read as a cost shape.

Layer 0: the runtime's confidence sizing (``calibration.StepCosts``) and any plugin that prices
its own drafts (a block drafter's value rule) read the same capability through these functions.
"""

from __future__ import annotations

__all__ = ["parse_cost_shape", "rows_cost"]


def parse_cost_shape(value) -> tuple[tuple[int, float], ...] | None:
    """A target's forward cost by rows, ``((rows, ms), ..)`` from 1 row up, as a cost shape; None
    for anything else: a missing or malformed profile, and one that is not increasing (a point
    that costs less than one of fewer rows, or the widest no more than one row: a measurement
    noise decided) is simply not used."""
    if value is None:
        return None
    try:
        pairs = tuple(sorted((int(r), float(ms)) for r, ms in value))
    except (TypeError, ValueError):
        return None
    if len(pairs) < 2 or pairs[0][0] != 1 or any(ms <= 0 or ms != ms for _, ms in pairs):
        return None
    if len({r for r, _ in pairs}) != len(pairs):
        return None
    if any(b < a for (_, a), (_, b) in zip(pairs, pairs[1:])) or pairs[-1][1] <= pairs[0][1]:
        return None
    return pairs


def rows_cost(shape: tuple[tuple[int, float], ...], rows: int) -> float:
    """The shape's cost of a forward of ``rows`` rows: linear between its points, the last
    segment's slope past its end (never below the last point's cost)."""
    for (r0, m0), (r1, m1) in zip(shape, shape[1:]):
        if rows <= r1:
            return m0 + (m1 - m0) * (max(rows, r0) - r0) / (r1 - r0)
    (r0, m0), (r1, m1) = shape[-2], shape[-1]
    return max(m1, m1 + (m1 - m0) / (r1 - r0) * (rows - r1))
