"""tsspec.cost_shape: a target's cost by rows read as a shape, priced at any row count."""

from __future__ import annotations

import pytest

import tsspec
from tsspec.cost_shape import parse_cost_shape, rows_cost


def test_a_profile_is_sorted_and_typed_and_a_bad_one_is_none():
    assert parse_cost_shape([(4, "20"), (1, 10), (2, 12.0)]) == ((1, 10.0), (2, 12.0), (4, 20.0))
    nan = float("nan")
    for bad in (None, "1:2", 7, [(1, "x"), (2, 3.0)], ((2, 5.0), (4, 6.0)), ((1, 5.0),),
                ((1, 5.0), (2, -1.0)), ((1, 5.0), (2, nan)), ((1, 5.0), (1, 6.0))):
        assert parse_cost_shape(bad) is None


def test_a_profile_where_more_rows_cost_less_is_not_used():
    """A profile timed while another job ran (1 row slower than 2) says nothing about the rows."""
    assert parse_cost_shape(((1, 26.2), (2, 23.5), (3, 30.8))) is None
    assert parse_cost_shape(((1, 10.0), (2, 12.0), (4, 11.0))) is None  # a falling last point
    assert parse_cost_shape(((1, 10.0), (2, 10.0), (4, 10.0))) is None  # no row costs anything
    assert parse_cost_shape(((1, 10.0), (2, 10.0), (4, 13.0))) == ((1, 10.0), (2, 10.0), (4, 13.0))  # flat, then rising


def test_rows_are_priced_between_points_and_past_the_last_by_its_slope():
    shape = parse_cost_shape(((1, 10.0), (2, 12.0), (4, 20.0)))
    assert rows_cost(shape, 1) == 10.0 and rows_cost(shape, 2) == 12.0
    assert rows_cost(shape, 3) == pytest.approx(16.0)  # halfway from 2 to 4 rows
    assert rows_cost(shape, 6) == pytest.approx(28.0)  # the last segment's 4 ms a row, on past 4
    flat_end = parse_cost_shape(((1, 10.0), (2, 12.0), (4, 12.0)))  # a flat last segment
    assert rows_cost(flat_end, 8) == 12.0  # never below the last point


def test_the_functions_are_public_for_plugins():
    assert tsspec.parse_cost_shape is parse_cost_shape and tsspec.rows_cost is rows_cost
    assert tsspec.parse_cost_shape and tsspec.rows_cost  # importable, not exported
