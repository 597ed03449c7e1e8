"""Numbers as printed tables show them: rounded, without float noise.

A memory class that is 0 up to rounding error comes out of the arithmetic as
``-2.22e-14``, which ``{:.1f}`` prints as ``-0.0`` and ``{:g}`` as ``-2.22e-14``: noise
that reads as a (negative!) result. Tables print through :func:`fmt_number`; files
(summary.json, Parquet, CSV) keep full precision.
"""

from __future__ import annotations

import math

NOISE = 1e-9
"""Magnitudes below this print as 0 (every printed quantity is a count, a percentage, a time
in ms or s, or a rate: none is meaningful at 1e-9)."""


def fmt_number(value, fmt: str = "{:.6g}", missing: str = "-") -> str:
    """``value`` formatted with ``fmt``; ``missing`` for None or NaN; noise below :data:`NOISE`
    shown as 0, and never a negative zero ("-0.0" -> "0.0")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    if isinstance(value, float) and abs(value) < NOISE:
        value = 0.0
    text = fmt.format(value)
    mantissa = text.split("e")[0]
    if text.startswith("-") and "inf" not in text and not any(c in "123456789" for c in mantissa):
        text = text[1:]  # rounded to zero: drop the sign
    return text


def fmt_cell(value) -> str:
    """A table cell of any type: numbers through :func:`fmt_number` (10 significant digits,
    enough for any parameter a user types, none of the noise after them), the rest as text."""
    if isinstance(value, float):
        return fmt_number(value, "{:.10g}")
    return "-" if value is None else str(value)
