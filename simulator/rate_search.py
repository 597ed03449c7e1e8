"""Sustainable-rate search: the highest request rate a system serves within a latency bound.

Systems are compared by this one number (the vLLM paper, Kwon et al., SOSP 2023, Sec. 6.2:
"vLLM can sustain 1.7x-2.7x higher request rates"). A rate is *sustainable* when every bound
of a :class:`SustainabilityCriterion` holds for the run at that rate:

* ``max_normalized_latency`` (s/token, default 0.1): mean over requests of end-to-end
  latency / output tokens - the paper's y-axis. 0.1 s/token is about ten times an unloaded
  decode step of a 7B-13B model on an A100 (10-30 ms), so a run under it is before the
  knee of the latency curve; past the knee latency grows without bound as the queue
  builds, so the rate found barely moves if the bound is halved or doubled;
* ``max_p99_ttft_ms`` / ``max_p99_tpot_ms`` (optional): p99 time to first token and time per
  output token, in milliseconds (service-level objectives).

A run that completes no request is not sustainable.

Latency is assumed to grow with the rate (monotone), so the search is a bisection over
``[lo, hi]`` (requests/s, or a rate multiplier for traces): evaluate both ends, then the
midpoint of the bracket (last sustainable rate, first unsustainable rate) until it is at most
``tolerance`` wide. The answer is the bracket's low end: a rate that was *run* and met the
bound, never an interpolation. With a generator workload and a fixed seed, the runs at
different rates see the same requests arriving at proportionally scaled times (common
random numbers), which keeps the measured curve monotone in practice.

:class:`RateBisection` is the search as a state machine (what to run next, what came back),
so that a sweep can run the searches of many systems at once on a process pool or Ray;
:func:`find_sustainable_rate` drives it sequentially for any ``rate -> bool`` function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_MAX_NORMALIZED_LATENCY = 0.1  # s/token; see the module docstring
DEFAULT_STEPS = 5  # bisection steps when no tolerance is given: tolerance = (hi - lo) / 2**5


@dataclass(frozen=True)
class SustainabilityCriterion:
    """Bounds a run's summary must meet; ``None`` disables a bound."""

    max_normalized_latency: float | None = DEFAULT_MAX_NORMALIZED_LATENCY  # s/token
    max_p99_ttft_ms: float | None = None  # ms
    max_p99_tpot_ms: float | None = None  # ms

    def __post_init__(self) -> None:
        bounds = (self.max_normalized_latency, self.max_p99_ttft_ms, self.max_p99_tpot_ms)
        if all(b is None for b in bounds):
            raise ValueError("a sustainability criterion needs at least one bound")
        for name, b in zip(
            ("max_normalized_latency", "max_p99_ttft_ms", "max_p99_tpot_ms"), bounds
        ):
            if b is not None and not (isinstance(b, (int, float)) and math.isfinite(b) and b > 0):
                raise ValueError(f"{name} must be a number > 0 (got {b!r})")

    def checks(self) -> list[tuple[str, float]]:
        """(summary key, upper bound) pairs that are enabled."""
        pairs = [
            ("normalized_latency_s_per_token", self.max_normalized_latency),
            ("p99_ttft_ms", self.max_p99_ttft_ms),
            ("p99_tpot_ms", self.max_p99_tpot_ms),
        ]
        return [(k, b) for k, b in pairs if b is not None]

    def sustainable(self, summary: Mapping) -> bool:
        """True when the run completed requests and every bound holds (NaN fails)."""
        if not summary.get("completed"):
            return False
        for key, bound in self.checks():
            v = summary.get(key)
            if v is None or not (v <= bound):  # `not <=` is also True for NaN
                return False
        return True

    def describe(self) -> str:
        names = {
            "normalized_latency_s_per_token": ("normalized latency", "s/token"),
            "p99_ttft_ms": ("p99 TTFT", "ms"),
            "p99_tpot_ms": ("p99 TPOT", "ms"),
        }
        return " and ".join(f"{names[k][0]} <= {b:g} {names[k][1]}" for k, b in self.checks())


@dataclass(frozen=True)
class RatePoint:
    """One evaluated rate."""

    rate: float
    sustainable: bool


@dataclass(frozen=True)
class RateSearchResult:
    """The outcome of a search.

    ``status``: ``ok`` (the knee lies in ``[lo, hi]``), ``below_lo`` (even ``lo`` is not
    sustainable: ``rate`` is None - lower ``lo``), ``above_hi`` (``hi`` is sustainable:
    ``rate`` is ``hi``, a lower bound - raise ``hi``).
    ``bracket``: (highest sustainable rate run, lowest unsustainable rate run); either
    side is None when no such run exists.
    """

    rate: float | None
    status: Literal["ok", "below_lo", "above_hi"]
    bracket: tuple[float | None, float | None]
    points: tuple[RatePoint, ...]


def _round_rate(x: float) -> float:
    """Six significant digits, so configs and table columns hold readable numbers."""
    return float(f"{x:.6g}")


@dataclass
class RateBisection:
    """Bisection on the rate as a state machine.

    Call :meth:`wanted` for the rates to run now (both ends first, so they can run in
    parallel; then one midpoint at a time), :meth:`record` each outcome, until
    :attr:`done`; then read :meth:`result`.
    """

    lo: float
    hi: float
    tolerance: float | None = None  # same unit as the rate; default (hi - lo) / 2**DEFAULT_STEPS
    points: dict[float, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a rate > 0 (got {v!r})")
        if not self.lo < self.hi:
            raise ValueError(f"lo ({self.lo}) must be below hi ({self.hi})")
        if self.tolerance is None:
            self.tolerance = (self.hi - self.lo) / 2**DEFAULT_STEPS
        if not (math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"tolerance must be > 0 (got {self.tolerance!r})")
        self.lo, self.hi = float(self.lo), float(self.hi)

    def _bracket(self) -> tuple[float | None, float | None]:
        ok = [r for r, s in self.points.items() if s]
        bad = [r for r, s in self.points.items() if not s]
        return (max(ok) if ok else None), (min(bad) if bad else None)

    @property
    def done(self) -> bool:
        if self.lo not in self.points or self.hi not in self.points:
            return False
        if not self.points[self.lo] or self.points[self.hi]:
            return True
        good, bad = self._bracket()
        return bad - good <= self.tolerance or self._midpoint(good, bad) in (good, bad)

    @staticmethod
    def _midpoint(good: float, bad: float) -> float:
        return _round_rate((good + bad) / 2)

    def wanted(self) -> list[float]:
        """Rates whose outcome the search needs next (none when done)."""
        ends = [r for r in (self.lo, self.hi) if r not in self.points]
        if ends:
            return ends
        if self.done:
            return []
        good, bad = self._bracket()
        return [self._midpoint(good, bad)]

    def remaining_estimate(self) -> int:
        """Rates still to evaluate if the knee lies inside the range (for progress bars)."""
        if self.done:
            return 0
        ends = sum(r not in self.points for r in (self.lo, self.hi))
        good, bad = self._bracket()
        width = (bad - good) if ends == 0 else (self.hi - self.lo)
        return ends + max(0, math.ceil(math.log2(width / self.tolerance)))

    def record(self, rate: float, sustainable: bool) -> None:
        self.points[float(rate)] = bool(sustainable)

    def result(self) -> RateSearchResult:
        if not self.done:
            raise RuntimeError("the search is not finished; run the rates wanted() returns")
        pts = tuple(RatePoint(r, s) for r, s in sorted(self.points.items()))
        good, bad = self._bracket()
        if not self.points[self.lo]:
            return RateSearchResult(None, "below_lo", (good, bad), pts)
        if self.points[self.hi]:
            return RateSearchResult(self.hi, "above_hi", (good, bad), pts)
        return RateSearchResult(good, "ok", (good, bad), pts)


def find_sustainable_rate(
    is_sustainable: Callable[[float], bool], lo: float, hi: float, tolerance: float | None = None
) -> RateSearchResult:
    """The highest rate in ``[lo, hi]`` (to ``tolerance``) for which ``is_sustainable`` holds,
    assuming it holds below some rate and fails above it."""
    search = RateBisection(lo, hi, tolerance)
    while not search.done:
        for rate in search.wanted():
            search.record(rate, is_sustainable(rate))
    return search.result()


@dataclass(frozen=True)
class RateSearchSpec:
    """A sweep file's ``find_rate:`` section: which key holds the rate, the range, the bound.

    ``key``: ``workload.arrivals.rate`` (requests/s, generated workloads) or
    ``workload.rate_scale`` (a multiplier of a trace's own rate).
    """

    key: str
    lo: float
    hi: float
    tolerance: float | None = None
    criterion: SustainabilityCriterion = SustainabilityCriterion()

    def bisection(self) -> RateBisection:
        return RateBisection(self.lo, self.hi, self.tolerance)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "lo": self.lo,
            "hi": self.hi,
            "tolerance": self.bisection().tolerance,
            "max_normalized_latency": self.criterion.max_normalized_latency,
            "max_p99_ttft_ms": self.criterion.max_p99_ttft_ms,
            "max_p99_tpot_ms": self.criterion.max_p99_tpot_ms,
        }


__all__ = [
    "DEFAULT_MAX_NORMALIZED_LATENCY",
    "RateBisection",
    "RatePoint",
    "RateSearchResult",
    "RateSearchSpec",
    "SustainabilityCriterion",
    "find_sustainable_rate",
]
