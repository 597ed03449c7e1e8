"""Numbers as printed tables show them: rounded, without float noise.

A memory class that is 0 up to rounding error comes out of the arithmetic as
``-2.22e-14``, which ``{:.1f}`` prints as ``-0.0`` and ``{:g}`` as ``-2.22e-14``: noise
that reads as a (negative!) result. Tables print through :func:`fmt_number`; files
(summary.json, Parquet, CSV) keep full precision.
"""

from __future__ import annotations

import math
import re

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


def group_reasons(reasons: dict[str, int], most: int = 5) -> list[str]:
    """Why requests were rejected or aborted, one line per kind, most frequent first:
    ``"180  prompt + output = 4102-4482 tokens exceeds the context window (...) 4096"``.

    A reason names its request's numbers (``summary.json`` keeps each exact text with its
    count), so reasons that differ only in their numbers are one kind here, a number that
    differs shown as its range. More than ``most`` kinds: the rest counted on a last line.
    """
    kinds: dict[tuple[str, ...], tuple[int, list[list[str]]]] = {}
    for reason, count in reasons.items():
        parts = re.split(r"(\d+(?:\.\d+)?)", str(reason))  # text, number, text, ..., text
        texts, numbers = tuple(parts[0::2]), parts[1::2]
        total, seen = kinds.get(texts, (0, [[] for _ in numbers]))
        for values, n in zip(seen, numbers):
            values.append(n)
        kinds[texts] = (total + int(count), seen)
    ranked = sorted(kinds.items(), key=lambda kv: -kv[1][0])
    width = len(str(ranked[0][1][0])) if ranked else 0
    lines = []
    for texts, (total, seen) in ranked[:most]:
        shown = [_span(values) for values in seen]
        lines.append(f"{total:>{width}}  " + "".join(t + n for t, n in zip(texts, [*shown, ""])))
    if len(ranked) > most:
        rest = sum(total for _, (total, _) in ranked[most:])
        lines.append(f"{rest:>{width}}  for {len(ranked) - most} other reasons (summary.json)")
    return lines


def _span(values: list[str]) -> str:
    """One number, or the range of several: ``4096``, ``4102-4482``."""
    lo, hi = min(values, key=float), max(values, key=float)
    return lo if float(lo) == float(hi) else f"{lo}-{hi}"
