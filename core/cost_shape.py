"""A target's forward cost by rows (``spec_verify_row_ms``) as a cost shape, for the loop's sizing
and plugins that price their own drafts."""

from __future__ import annotations

__all__ = ["parse_cost_shape", "rows_cost"]


def parse_cost_shape(value) -> tuple[tuple[int, float], ...] | None:
    """``((rows, ms), ..)`` from 1 row up, increasing; None for anything else (not used)."""
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
    """Cost of ``rows`` rows: linear between points, the last slope past the end."""
    for (r0, m0), (r1, m1) in zip(shape, shape[1:]):
        if rows <= r1:
            return m0 + (m1 - m0) * (max(rows, r0) - r0) / (r1 - r0)
    (r0, m0), (r1, m1) = shape[-2], shape[-1]
    return max(m1, m1 + (m1 - m0) / (r1 - r0) * (rows - r1))
