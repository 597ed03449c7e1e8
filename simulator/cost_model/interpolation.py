"""Piecewise-linear interpolation on a measured grid: the profiled model's operator tables
and attention grid (``profiled``) and the MoE block's table (``moe``) read their times so.

Inside the grid: linear between the two bracketing points; below it, the first point's
value; above it, extrapolated along a wide secant (``bracket``). The side is returned so
that the caller can count what it read outside the grid.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def bracket(xs: Sequence[float], x: float) -> tuple[int, int, float, int]:
    """``(i0, i1, w, side)`` with ``y(x) = y[i0] + w * (y[i1] - y[i0])``, piecewise linear.

    ``side`` -1: below the grid (clamped to the first point); +1: above it, extrapolated
    along the secant from the largest point at or below half the last one to the last (the
    last two points of a doubling grid; on a dense grid a wide baseline, not the slope of
    two neighbours' measurement noise); 0: inside.
    """
    n = len(xs)
    if x <= xs[0] or n == 1:
        side = -1 if x < xs[0] else (1 if x > xs[0] else 0)
        return 0, 0, 0.0, side
    if x >= xs[-1]:
        last = n - 1
        if x == xs[-1]:
            return last, last, 0.0, 0
        i0 = min(last - 1, max(0, bisect.bisect_right(xs, xs[-1] / 2) - 1))
        return i0, last, (x - xs[i0]) / (xs[-1] - xs[i0]), 1
    i = bisect.bisect_right(xs, x)
    return i - 1, i, (x - xs[i - 1]) / (xs[i] - xs[i - 1]), 0


def lerp(xs: Sequence[float], ys: Sequence[float], x: float) -> tuple[float, int]:
    """Piecewise-linear ``y(x)`` through the points, and the side (see ``bracket``)."""
    i0, i1, w, side = bracket(xs, x)
    y0 = ys[i0]
    return (y0 + w * (ys[i1] - y0) if w else y0), side
