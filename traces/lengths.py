"""Length samplers: the prompt and output token counts of generated requests.

A sampler draws ``size`` (prompt, output) pairs at once as two int64 arrays of
values >= 1; the generator calls it in chunks (4096 by default) and yields one
request at a time. Samplers hold no random state: the caller passes a
``numpy.random.Generator``, so a seed fixes every draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class LengthSampler(Protocol):
    """Draws (prompt_tokens, output_tokens) pairs."""

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Two int64 arrays of ``size`` token counts, each >= 1."""
        ...


def _check(name: str, value: float, *, low: float, integer: bool = False) -> None:
    """ValueError naming the parameter and its allowed range unless ``value >= low``."""
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds):
        ok = False
    else:
        ok = math.isfinite(value) and value >= low
    if not ok:
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {what} >= {low}; got {value!r}")


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same prompt and output length (tokens)."""

    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _check("prompt_tokens", self.prompt_tokens, low=1, integer=True)
        _check("output_tokens", self.output_tokens, low=1, integer=True)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.full(size, int(self.prompt_tokens), dtype=np.int64),
            np.full(size, int(self.output_tokens), dtype=np.int64),
        )

    def expected_means(self) -> tuple[float, float]:
        return float(self.prompt_tokens), float(self.output_tokens)


@dataclass(frozen=True)
class UniformLengths:
    """Prompt and output lengths uniform over the integers ``[min, max]`` (inclusive)."""

    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int

    def __post_init__(self) -> None:
        for side in ("prompt", "output"):
            low, high = getattr(self, f"{side}_min"), getattr(self, f"{side}_max")
            _check(f"{side}_min", low, low=1, integer=True)
            _check(f"{side}_max", high, low=low, integer=True)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        prompt = rng.integers(self.prompt_min, self.prompt_max + 1, size, dtype=np.int64)
        output = rng.integers(self.output_min, self.output_max + 1, size, dtype=np.int64)
        return prompt, output

    def expected_means(self) -> tuple[float, float]:
        return (self.prompt_min + self.prompt_max) / 2, (self.output_min + self.output_max) / 2


def lognormal_log_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the normal whose exponential has this mean and std:
    ``sigma**2 = ln(1 + (std/mean)**2)``, ``mu = ln(mean) - sigma**2 / 2``."""
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


@dataclass(frozen=True)
class LognormalLengths:
    """Independent lognormal prompt and output lengths with the given mean and std
    (tokens), rounded to integers and raised to at least 1.

    Rounding is unbiased; raising values below 0.5 to 1 adds a bias that is
    negligible unless the std is large compared with the mean.
    """

    prompt_mean: float
    prompt_std: float
    output_mean: float
    output_std: float

    def __post_init__(self) -> None:
        _check("prompt_mean", self.prompt_mean, low=1)
        _check("prompt_std", self.prompt_std, low=0)
        _check("output_mean", self.output_mean, low=1)
        _check("output_std", self.output_std, low=0)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        mu_p, sigma_p = lognormal_log_params(self.prompt_mean, self.prompt_std)
        mu_o, sigma_o = lognormal_log_params(self.output_mean, self.output_std)
        prompt = np.rint(rng.lognormal(mu_p, sigma_p, size)).astype(np.int64)
        output = np.rint(rng.lognormal(mu_o, sigma_o, size)).astype(np.int64)
        return np.maximum(prompt, 1), np.maximum(output, 1)


@dataclass(frozen=True)
class PoolLengths:
    """Rows of a lengths table (e.g. a real trace), sampled uniformly with
    replacement; a row's prompt and output stay together, keeping their correlation."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) == 0 or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError("a length pool needs >= 1 row and as many outputs as prompts")
        if min(self.prompt_tokens.min(), self.output_tokens.min()) < 1:
            raise ValueError("a length pool's token counts must all be >= 1")

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        rows = rng.integers(0, len(self.prompt_tokens), size)
        return self.prompt_tokens[rows], self.output_tokens[rows]

    def expected_means(self) -> tuple[float, float]:
        return float(self.prompt_tokens.mean()), float(self.output_tokens.mean())


@dataclass(frozen=True)
class DiscreteLengths:
    """Prompt and output lengths drawn independently from two probability tables,
    keeping only pairs with ``prompt + output <= max_total_tokens``.

    ``*_values`` are token counts (>= 1) and ``*_probs`` their probabilities.
    Because the tables are finite the exact means after the cut are known
    (:meth:`expected_means`); the presets are built on this.
    """

    prompt_values: np.ndarray
    prompt_probs: np.ndarray
    output_values: np.ndarray
    output_probs: np.ndarray
    max_total_tokens: int | None = None
    _cdfs: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for side in ("prompt", "output"):
            values, probs = getattr(self, f"{side}_values"), getattr(self, f"{side}_probs")
            if len(values) == 0 or len(values) != len(probs) or values.min() < 1:
                raise ValueError(f"{side}_values must be >= 1 tokens, one per probability")
            if probs.min() < 0 or not math.isclose(probs.sum(), 1.0, rel_tol=1e-9):
                raise ValueError(f"{side}_probs must be >= 0 and sum to 1")
        if self.max_total_tokens is not None:
            _check("max_total_tokens", self.max_total_tokens, low=2, integer=True)
        cdfs = (np.cumsum(self.prompt_probs), np.cumsum(self.output_probs))
        object.__setattr__(self, "_cdfs", cdfs)
        if self.expected_means() is None:
            raise ValueError("no (prompt, output) pair fits in max_total_tokens")

    def _draw(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        prompt_cdf, output_cdf = self._cdfs
        # side="right" never picks a zero-probability value; min() guards cdf[-1] < 1.
        pi = np.minimum(
            np.searchsorted(prompt_cdf, rng.random(size), side="right"), len(prompt_cdf) - 1
        )
        oi = np.minimum(
            np.searchsorted(output_cdf, rng.random(size), side="right"), len(output_cdf) - 1
        )
        return self.prompt_values[pi].astype(np.int64), self.output_values[oi].astype(np.int64)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        if self.max_total_tokens is None:
            return self._draw(rng, size)
        limit = self.max_total_tokens
        return rejection_sample(self._draw, lambda p, o: p + o <= limit, rng, size)

    def expected_means(self) -> tuple[float, float] | None:
        """Exact (prompt, output) means of the samples; None if no pair fits."""
        pv, pp = self.prompt_values.astype(float), self.prompt_probs
        ov, op = self.output_values.astype(float), self.output_probs
        if self.max_total_tokens is None:
            return float(pv @ pp), float(ov @ op)
        order = np.argsort(ov)
        ov, op = ov[order], op[order]
        # For each prompt value: the probability of an output that fits, and its partial mean.
        fits = np.searchsorted(ov, self.max_total_tokens - pv, side="right")
        mass = np.concatenate(([0.0], np.cumsum(op)))[fits]
        partial = np.concatenate(([0.0], np.cumsum(ov * op)))[fits]
        accepted = float(pp @ mass)
        if accepted <= 0:
            return None
        return float(pp @ (pv * mass)) / accepted, float(pp @ partial) / accepted


@dataclass(frozen=True)
class FilteredLengths:
    """Another sampler's pairs, keeping those for which ``keep(prompt, output)``
    (vectorised, returns a boolean array) is true - e.g. vLLM's ShareGPT filter."""

    inner: LengthSampler
    keep: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        return rejection_sample(self.inner.sample, self.keep, rng, size)


def rejection_sample(draw, keep, rng: np.random.Generator, size: int):
    """``size`` pairs from ``draw`` that pass ``keep``, drawing in rounds of ``size``.

    Raises ValueError rather than loop (almost) forever when ``keep`` accepts
    fewer than 1 in 1000 pairs.
    """
    prompts, outputs = [], []
    accepted = drawn = 0
    while accepted < size:
        batch = max(size, 1024)
        prompt, output = draw(rng, batch)
        mask = keep(prompt, output)
        prompts.append(prompt[mask])
        outputs.append(output[mask])
        accepted += int(mask.sum())
        drawn += batch
        if drawn >= 100_000 and accepted * 1000 < drawn:
            raise ValueError(
                f"the length filter kept {accepted} of {drawn} sampled (prompt, output) pairs; "
                "widen the lengths or drop the filter"
            )
    return np.concatenate(prompts)[:size], np.concatenate(outputs)[:size]
