"""Arrival processes: when generated requests arrive.

Each process draws inter-arrival gaps (seconds) in vectorised chunks. The mean
gap is always ``1 / rate``; the processes differ in burstiness, measured by the
coefficient of variation (CV = std / mean) of the gaps:

* ``constant``: CV 0, evenly spaced requests;
* ``poisson``: exponential gaps, CV 1 (the vLLM paper's workloads);
* ``gamma``: gamma gaps with any CV; CV > 1 is burstier than Poisson. This is
  vLLM's benchmark ``burstiness`` knob: a gamma shape ``k = burstiness = 1/CV**2``
  and scale ``1 / (rate * k)``, so the mean rate stays ``rate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ArrivalProcess(Protocol):
    """Draws inter-arrival gaps; ``rate`` is the mean arrival rate in requests/s."""

    rate: float

    def gaps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` inter-arrival gaps in seconds (float64, >= 0)."""
        ...


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")


@dataclass(frozen=True)
class PoissonArrivals:
    """Poisson process: independent exponential gaps with mean ``1 / rate``."""

    rate: float  # requests per second

    def __post_init__(self) -> None:
        _check_positive("rate", self.rate)

    def gaps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size)


@dataclass(frozen=True)
class GammaArrivals:
    """Gamma-distributed gaps with mean ``1 / rate`` and coefficient of variation ``cv``
    (``cv = 1`` is Poisson; vLLM's ``burstiness`` is ``1 / cv**2``)."""

    rate: float  # requests per second
    cv: float  # std / mean of the gaps

    def __post_init__(self) -> None:
        _check_positive("rate", self.rate)
        _check_positive("cv", self.cv)

    def gaps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, 1.0 / (self.rate * shape), size)


@dataclass(frozen=True)
class ConstantArrivals:
    """Evenly spaced arrivals, one every ``1 / rate`` seconds (draws nothing)."""

    rate: float  # requests per second

    def __post_init__(self) -> None:
        _check_positive("rate", self.rate)

    def gaps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, 1.0 / self.rate)


def make_arrivals(kind: str, rate: float, cv: float | None = None) -> ArrivalProcess:
    """An arrival process by name: ``poisson``, ``gamma`` (needs ``cv``) or ``constant``."""
    if kind == "poisson":
        return PoissonArrivals(rate)
    if kind == "gamma":
        if cv is None:
            raise ValueError("gamma arrivals need cv (the gaps' std / mean, > 0)")
        return GammaArrivals(rate, cv)
    if kind == "constant":
        return ConstantArrivals(rate)
    raise ValueError(f"arrival kind must be poisson, gamma or constant; got {kind!r}")
