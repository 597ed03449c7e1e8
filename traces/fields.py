"""Turn one cell of a trace row (a CSV string or a JSON value) into a number.

Every parser raises :class:`CellError` with a one-line problem such as
``column 'ContextTokens' is not an integer: 'abc'``; the loader adds the file
and line to make a :class:`~traces.errors.TraceError`. The common case (a
well-formed integer or float) takes one ``int()``/``float()`` call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import date, datetime, timezone

TIME_UNITS = ("s", "ms", "us", "ns", "datetime")
"""Units a timestamp column may be in; ``datetime`` is a wall-clock string such as
``2023-11-16 18:17:03.9799600`` (ISO 8601, any number of fractional digits)."""

_SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

MAX_TOKENS = 2**31 - 1
"""Largest token count a trace cell may hold: far beyond any model's context window (the
simulator rejects such a request and says why), and small enough that counts, sums and
tables stay exact 64-bit integers."""

MAX_SPAN_S = 1e7
"""Longest a workload may last, first arrival to last (1e7 s, about 116 days): the largest
public traces span days; a longer run is a unit mistake (ms read as s) or a rate near 0."""
SPAN_TEXT = "1e7 s (about 116 days)"


class CellError(ValueError):
    """One cell is unusable; ``problem`` is the one-line reason (no file or line)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


def _shown(raw: object) -> str:
    """The offending value as the user wrote it, shortened to stay one line."""
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_tokens(raw: object, column: str) -> int:
    """A token count: an integer >= 1 (``"12"``, ``12`` or an integral ``"12.0"``)."""
    if type(raw) is int:
        value = raw
    elif type(raw) is str:
        try:
            value = int(raw)
        except ValueError:
            value = _integral_text(raw, column)
    elif type(raw) is float and raw.is_integer():
        value = int(raw)
    elif raw is None:
        raise CellError(f"column '{column}' is empty")
    else:
        raise CellError(f"column '{column}' is not an integer: {_shown(raw)}")
    if value < 1:
        kind = "negative" if value < 0 else "zero"
        raise CellError(f"column '{column}' is {kind}: {_shown(raw)} (token counts must be >= 1)")
    if value > MAX_TOKENS:
        raise CellError(f"column '{column}' is too large: {_shown(raw)} (token counts are at most {MAX_TOKENS})")
    return value


def _integral_text(raw: str, column: str) -> int:
    """Slow path of :func:`parse_tokens`: empty cells and integral floats like ``"12.0"``."""
    if not raw.strip():
        raise CellError(f"column '{column}' is empty")
    try:
        number = float(raw)
    except ValueError:  # (also a string of more digits than Python converts)
        number = math.nan
    if math.isinf(number):
        raise CellError(f"column '{column}' is too large: {_shown(raw)} (token counts are at most {MAX_TOKENS})")
    if not number.is_integer():
        raise CellError(f"column '{column}' is not an integer: {_shown(raw)}")
    return int(number)


def time_unit_seconds(unit: str) -> float:
    """Seconds in one ``unit`` (s, ms, us, ns)."""
    if unit not in _SECONDS_PER_UNIT:
        raise ValueError(f"time unit must be one of s, ms, us, ns; got {unit!r}")
    return _SECONDS_PER_UNIT[unit]


def time_parser(unit: str, column: str) -> Callable[[object], float]:
    """A function turning a timestamp cell into seconds (an arbitrary origin; the
    loader rebases times to the first request). Numbers must be finite and >= 0."""
    if unit == "datetime":
        return _DateTimeParser(column)
    if unit not in _SECONDS_PER_UNIT:
        raise ValueError(f"time unit must be one of {', '.join(TIME_UNITS)}; got {unit!r}")
    scale = _SECONDS_PER_UNIT[unit]

    def parse(raw: object) -> float:
        if type(raw) is str:
            try:
                value = float(raw)
            except ValueError:
                if not raw.strip():
                    raise CellError(f"column '{column}' is empty") from None
                raise CellError(f"column '{column}' is not a number: {_shown(raw)}") from None
        elif type(raw) is int or type(raw) is float:
            value = float(raw)
        elif raw is None:
            raise CellError(f"column '{column}' is empty")
        else:
            raise CellError(f"column '{column}' is not a number: {_shown(raw)}")
        if not math.isfinite(value):
            raise CellError(f"column '{column}' is not a finite number: {_shown(raw)}")
        if value < 0:
            raise CellError(f"column '{column}' is negative: {_shown(raw)}")
        return value * scale

    return parse


class _DateTimeParser:
    """Wall-clock strings to seconds since midnight of the first date seen.

    Measuring from the first date (not 1970) keeps 0.1 us resolution in a float.
    The fast path handles ``YYYY-MM-DD HH:MM:SS.fffffff`` (Azure's shape, 7
    fractional digits, which Python < 3.11 cannot parse) with one dictionary
    look-up per row: the seconds up to each distinct minute are cached. Anything
    else, e.g. a timezone suffix, goes through ``datetime.fromisoformat``.
    """

    def __init__(self, column: str):
        self.column = column
        self._origin: int | None = None  # proleptic ordinal of the first date seen
        self._minutes: dict[str, float] = {}  # "YYYY-MM-DD HH:MM" -> seconds

    def __call__(self, raw: object) -> float:
        if type(raw) is not str:
            if raw is None:
                raise CellError(f"column '{self.column}' is empty")
            raise CellError(f"column '{self.column}' is not a date-time string: {_shown(raw)}")
        minute = self._minutes.get(raw[:16])
        if minute is None:
            minute = self._minute_start(raw[:16])
        if minute is not None and raw[16:17] == ":":
            try:
                second = float(raw[17:])
            except ValueError:
                second = -1.0
            if 0.0 <= second < 61.0:
                return minute + second
        return self._slow(raw.strip(), raw)

    def _minute_start(self, s: str) -> float | None:
        """Seconds from the origin to the minute ``YYYY-MM-DD HH:MM``; None if not that shape."""
        if len(s) != 16 or s[4] != "-" or s[7] != "-" or s[10] not in " T" or s[13] != ":":
            return None
        try:
            day = date.fromisoformat(s[:10])
            hour, minute = int(s[11:13]), int(s[14:16])
        except ValueError:
            return None
        if not (s[11:13].isdigit() and s[14:16].isdigit() and hour < 24 and minute < 60):
            return None
        seconds = self._day_offset(day) + hour * 3600 + minute * 60
        self._minutes[s] = seconds
        return seconds

    def _day_offset(self, day: date) -> float:
        if self._origin is None:
            self._origin = day.toordinal()
        return (day.toordinal() - self._origin) * 86400.0

    def _slow(self, s: str, raw: object) -> float:
        if not s:
            raise CellError(f"column '{self.column}' is empty")
        text = s.replace("Z", "+00:00")
        # Python < 3.11 accepts only 3 or 6 fractional digits: keep at most 6.
        head, dot, rest = text.partition(".")
        if dot:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            text = head + "." + rest[: min(digits, 6)].ljust(6, "0") + rest[digits:]
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise CellError(
                f"column '{self.column}' is not a date-time like "
                f"'2023-11-16 18:17:03.9799600': {_shown(raw)}"
            ) from None
        if moment.tzinfo is not None:
            moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
        midnight = datetime(moment.year, moment.month, moment.day)
        return self._day_offset(moment.date()) + (moment - midnight).total_seconds()


def parse_hash_ids(raw: object, column: str) -> tuple[int, ...]:
    """Prefix-block identities: a JSON list of integers, or in a CSV cell a list
    written ``[1, 2, 3]``, ``1 2 3`` or ``1;2;3``."""
    if type(raw) is list:
        items = raw
    elif type(raw) is str:
        text = raw.strip().removeprefix("[").removesuffix("]")
        items = text.replace(",", " ").replace(";", " ").split()
        try:
            return tuple(int(item) for item in items)
        except ValueError:
            raise CellError(f"column '{column}' is not a list of integers: {_shown(raw)}") from None
    elif raw is None:
        raise CellError(f"column '{column}' is empty")
    else:
        raise CellError(f"column '{column}' is not a list of integers: {_shown(raw)}")
    for item in items:
        if type(item) is not int:
            raise CellError(f"column '{column}' holds a non-integer id: {_shown(item)}")
    return tuple(items)


MAX_TOKEN_ID = 2**32 - 1
"""Largest token id accepted: vocabularies hold at most a few hundred thousand tokens, and ids
are read as 32-bit integers (see ``simulator.decoding.token_block_contents``)."""


def parse_token_ids(raw: object, column: str) -> tuple[int, ...]:
    """A prompt's token ids: a JSON list of integers from 0 to ``MAX_TOKEN_ID`` (in a CSV cell,
    written as :func:`parse_hash_ids` accepts)."""
    ids = parse_hash_ids(raw, column)
    for item in ids:
        if not 0 <= item <= MAX_TOKEN_ID:
            raise CellError(f"column '{column}' holds a token id out of range: {_shown(item)} "
                            f"(token ids are integers from 0 to {MAX_TOKEN_ID})")
    return ids
