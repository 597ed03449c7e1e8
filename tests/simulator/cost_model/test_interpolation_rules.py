"""The rules of ``simulator/cost_model/interpolation.py`` (``bracket`` and ``lerp``, which
the profiled model's tables and the MoE table read their times through), at every boundary:
below, at and above the first and last points, at interior points, a one-point grid, and
the secant beyond the grid (from the largest point at or below half the last one)."""

from __future__ import annotations

import pytest

from kvsim.simulator.cost_model.interpolation import bracket, lerp

XS = [1.0, 2.0, 4.0, 8.0]  # a doubling grid
YS = [10.0, 25.0, 40.0, 100.0]


@pytest.mark.parametrize("x, expected", [
    (0.5, (0, 0, 0.0, -1)),  # below: clamped to the first point, counted as below
    (1.0, (0, 0, 0.0, 0)),  # the first point itself is inside
    (1.5, (0, 1, 0.5, 0)),
    (2.0, (1, 2, 0.0, 0)),  # an interior point: its own value, weight 0
    (3.0, (1, 2, 0.5, 0)),
    (7.0, (2, 3, 0.75, 0)),
    (8.0, (3, 3, 0.0, 0)),  # the last point itself is inside
    (16.0, (2, 3, 3.0, 1)),  # above: the secant from 4 (= 8 / 2) to 8
])
def test_bracket_on_a_doubling_grid(x, expected):
    assert bracket(XS, x) == expected


@pytest.mark.parametrize("x, expected", [
    (0.5, (10.0, -1)), (1.0, (10.0, 0)), (1.5, (17.5, 0)), (2.0, (25.0, 0)), (3.0, (32.5, 0)),
    (7.0, (85.0, 0)), (8.0, (100.0, 0)), (16.0, (40.0 + 3.0 * 60.0, 1)),
])
def test_lerp_reads_the_bracket_s_points(x, expected):
    assert lerp(XS, YS, x) == expected


def test_a_one_point_grid_is_that_point_everywhere_with_the_side_it_was_read_on():
    assert [bracket([5.0], x) for x in (4.0, 5.0, 6.0)] == [(0, 0, 0.0, -1), (0, 0, 0.0, 0), (0, 0, 0.0, 1)]
    assert [lerp([5.0], [3.0], x) for x in (4.0, 5.0, 6.0)] == [(3.0, -1), (3.0, 0), (3.0, 1)]


@pytest.mark.parametrize("xs, x, expected", [
    ([1.0, 2.0, 3.0, 5.0, 8.0], 10.0, (2, 4, 1.4, 1)),  # the largest point at or below 4 is 3
    ([1.0, 2.0, 4.0, 8.0], 12.0, (2, 3, 2.0, 1)),  # 4 is at half the last: it counts
    ([10.0, 11.0, 12.0], 14.0, (0, 2, 2.0, 1)),  # no point at or below 6: from the first
    ([1.0, 10.0], 19.0, (0, 1, 2.0, 1)),  # two points: their own secant
    ([-8.0, -4.0], -2.0, (0, 1, 1.5, 1)),  # half the last is above it: still the last two
])
def test_above_the_grid_the_secant_starts_at_the_largest_point_at_or_below_half_the_last(xs, x, expected):
    assert bracket(xs, x) == expected
