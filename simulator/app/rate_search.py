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

Latency is assumed to grow with the rate (monotone), so the search is a bisection: evaluate
both ends of ``[lo, hi]`` (requests/s, or a rate multiplier for traces), then the midpoint of
the bracket (last sustainable rate, first unsustainable rate) until the bracket is narrower
than the precision asked for: by default 2% of the rate found (``rel_tolerance``), so a
system that sustains 0.3 req/s is placed as precisely as one that sustains 30; an absolute
``tolerance`` (same unit as the rate) can be asked for instead or as well. When the answer
lies outside ``[lo, hi]`` (``lo`` already fails, or ``hi`` still passes), the range is
widened by ``widen_factor`` on that side, up to ``max_widenings`` times; only then is the
result reported as a bound (``below_lo``/``above_hi``), never as a rate. The answer is the
bracket's low end: a rate that was *run* and met the bound, never an interpolation, and
the bracket goes with it wherever it is reported. With a generator workload and a fixed
seed, the runs at different rates see the same requests arriving at proportionally scaled
times (common random numbers), which keeps the measured curve monotone in practice.

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
DEFAULT_REL_TOLERANCE = 0.02  # bracket width / rate found, when no tolerance is given
DEFAULT_WIDEN_FACTOR = 4.0  # a range end that does not bracket the answer moves this far out
DEFAULT_MAX_WIDENINGS = 4  # ...at most this many times (4**4 = 256x the range)


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

    ``status``: ``ok`` (a sustainable and an unsustainable rate bracket the knee to the
    precision asked for), ``below_lo`` (even the lowest rate tried, after widening, is not
    sustainable: ``rate`` is None), ``above_hi`` (the highest rate tried, after widening, is
    sustainable: ``rate`` is that rate, a *lower bound*).
    ``bracket``: (highest sustainable rate run, lowest unsustainable rate run); either
    side is None when no such run exists. ``widened``: how many times the range was widened.
    """

    rate: float | None
    status: Literal["ok", "below_lo", "above_hi"]
    bracket: tuple[float | None, float | None]
    points: tuple[RatePoint, ...]
    widened: int = 0

    @property
    def is_bound(self) -> bool:
        """True when ``rate`` is not a bracketed answer (a ratio built on it is a bound too)."""
        return self.status != "ok"


def _round_rate(x: float) -> float:
    """Six significant digits, so configs and table columns hold readable numbers."""
    return float(f"{x:.6g}")


@dataclass
class RateBisection:
    """Bisection on the rate as a state machine.

    Call :meth:`wanted` for the rates to run now (both ends first, so they can run in
    parallel; then one widening or midpoint at a time), :meth:`record` each outcome, until
    :attr:`done`; then read :meth:`result`.

    Precision: the search stops when the bracket's width is at most ``tolerance`` (absolute,
    the rate's unit) and at most ``rel_tolerance`` times its low end - each only if given;
    with neither, ``rel_tolerance`` is :data:`DEFAULT_REL_TOLERANCE`.
    """

    lo: float
    hi: float
    tolerance: float | None = None  # absolute bracket width (rate unit)
    rel_tolerance: float | None = None  # bracket width / rate found
    widen_factor: float = DEFAULT_WIDEN_FACTOR
    max_widenings: int = DEFAULT_MAX_WIDENINGS
    points: dict[float, bool] = field(default_factory=dict)
    _widenings: set[float] = field(default_factory=set, repr=False)  # rates run to widen

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a rate > 0 (got {v!r})")
        if not self.lo < self.hi:
            raise ValueError(f"lo ({self.lo}) must be below hi ({self.hi})")
        if self.tolerance is None and self.rel_tolerance is None:
            self.rel_tolerance = DEFAULT_REL_TOLERANCE
        for name in ("tolerance", "rel_tolerance"):
            v = getattr(self, name)
            if v is not None and not (
                isinstance(v, (int, float)) and math.isfinite(v) and v > 0
            ):
                raise ValueError(f"{name} must be > 0 (got {v!r})")
        if not (isinstance(self.widen_factor, (int, float)) and self.widen_factor > 1):
            raise ValueError(f"widen_factor must be > 1 (got {self.widen_factor!r})")
        if not (isinstance(self.max_widenings, int) and self.max_widenings >= 0):
            raise ValueError(f"max_widenings must be an integer >= 0 (got {self.max_widenings!r})")
        self.lo, self.hi = float(self.lo), float(self.hi)

    def _bracket(self) -> tuple[float | None, float | None]:
        ok = [r for r, s in self.points.items() if s]
        bad = [r for r, s in self.points.items() if not s]
        return (max(ok) if ok else None), (min(bad) if bad else None)

    @property
    def widened(self) -> int:
        """How many times the range was widened (widening rates that were run)."""
        return len(self._widenings & self.points.keys())

    def _widen(self, rate: float) -> list[float]:
        if self.widened >= self.max_widenings:
            return []
        self._widenings.add(rate)
        return [rate]

    def _narrow_enough(self, good: float, bad: float) -> bool:
        width = bad - good
        if self.tolerance is not None and width > self.tolerance:
            return False
        if self.rel_tolerance is not None and width > self.rel_tolerance * good:
            return False
        return True

    def _next(self) -> list[float]:
        """The rates the search needs now; [] when it is finished."""
        ends = [r for r in (self.lo, self.hi) if r not in self.points]
        if ends:
            return ends
        good, bad = self._bracket()
        if good is None:  # even the lowest rate failed: widen downwards
            return self._widen(_round_rate(min(self.points) / self.widen_factor))
        if bad is None:  # even the highest rate passed: widen upwards
            return self._widen(_round_rate(max(self.points) * self.widen_factor))
        if bad <= good or self._narrow_enough(good, bad):
            return []
        mid = self._midpoint(good, bad)
        return [] if mid in (good, bad) else [mid]

    @property
    def done(self) -> bool:
        return not self._next()

    @staticmethod
    def _midpoint(good: float, bad: float) -> float:
        return _round_rate((good + bad) / 2)

    def wanted(self) -> list[float]:
        """Rates whose outcome the search needs next (none when done)."""
        return self._next()

    def remaining_estimate(self) -> int:
        """Rates still to evaluate if the knee lies inside the range (for progress bars)."""
        if self.done:
            return 0
        ends = sum(r not in self.points for r in (self.lo, self.hi))
        good, bad = self._bracket()
        if ends or good is None or bad is None:
            good, bad = self.lo, self.hi
        target = min(
            t
            for t in (self.tolerance, (self.rel_tolerance or 0) * good or None)
            if t is not None
        )
        return ends + max(0, math.ceil(math.log2(max(bad - good, target) / target)))

    def record(self, rate: float, sustainable: bool) -> None:
        self.points[float(rate)] = bool(sustainable)

    def result(self) -> RateSearchResult:
        if not self.done:
            raise RuntimeError("the search is not finished; run the rates wanted() returns")
        pts = tuple(RatePoint(r, s) for r, s in sorted(self.points.items()))
        good, bad = self._bracket()
        if good is None:
            return RateSearchResult(None, "below_lo", (good, bad), pts, self.widened)
        if bad is None:
            return RateSearchResult(good, "above_hi", (good, bad), pts, self.widened)
        return RateSearchResult(good, "ok", (good, bad), pts, self.widened)


def find_sustainable_rate(
    is_sustainable: Callable[[float], bool],
    lo: float,
    hi: float,
    tolerance: float | None = None,
    rel_tolerance: float | None = None,
    max_widenings: int = DEFAULT_MAX_WIDENINGS,
) -> RateSearchResult:
    """The highest rate (to the precision asked for) for which ``is_sustainable`` holds,
    assuming it holds below some rate and fails above it; the range widens if needed."""
    search = RateBisection(lo, hi, tolerance, rel_tolerance, max_widenings=max_widenings)
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
    rel_tolerance: float | None = None
    max_widenings: int = DEFAULT_MAX_WIDENINGS

    def bisection(self) -> RateBisection:
        return RateBisection(
            self.lo, self.hi, self.tolerance, self.rel_tolerance, max_widenings=self.max_widenings
        )

    def as_dict(self) -> dict:
        search = self.bisection()
        return {
            "key": self.key,
            "lo": self.lo,
            "hi": self.hi,
            "tolerance": search.tolerance,
            "rel_tolerance": search.rel_tolerance,
            "max_widenings": search.max_widenings,
            "max_normalized_latency": self.criterion.max_normalized_latency,
            "max_p99_ttft_ms": self.criterion.max_p99_ttft_ms,
            "max_p99_tpot_ms": self.criterion.max_p99_tpot_ms,
        }


__all__ = [
    "DEFAULT_MAX_NORMALIZED_LATENCY",
    "DEFAULT_MAX_WIDENINGS",
    "DEFAULT_REL_TOLERANCE",
    "RateBisection",
    "RatePoint",
    "RateSearchResult",
    "RateSearchSpec",
    "SustainabilityCriterion",
    "find_sustainable_rate",
]
