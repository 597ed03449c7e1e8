"""Length presets for the vLLM paper's workloads: ``sharegpt-paper`` and ``alpaca-paper``.

The paper (Kwon et al., SOSP 2023, Section 6.1 and Fig. 11) gives only the means:
ShareGPT 161.31 input / 337.99 output tokens, Alpaca 19.31 / 58.45, "with higher
variance" for ShareGPT. The shape is our choice, made as follows:

* **Family: lognormal**, rounded to integers. Token counts of prompts and replies
  are positive and right-skewed (many short, a long tail), which a lognormal fits
  with one spread parameter. Prompt and output are drawn independently.
* **Cut to vLLM's ShareGPT filter** (:mod:`traces.sharegpt_filter`): prompt and
  output >= 4 tokens, prompt <= 1024, prompt + output <= 2048. The paper serves
  OPT models with a 2048-token context, and vLLM's benchmark applies exactly this
  filter, so the paper's requests lie in this region.
* **Spread (log-space std sigma)**: ShareGPT uses the spreads measured on the
  ShareGPT lengths file shipped in ``traces/data`` (Llama-2 tokenizer; sigma 1.63 for
  prompts, 1.00 for outputs). Its prompts include earlier conversation turns, so
  their level is far above the paper's, but the spread is the best real evidence
  we ship. No Alpaca data ships, so Alpaca's spreads are assumptions: 0.60 for its
  short, template-like instructions and 1.00 for outputs (one word to several
  paragraphs) - smaller absolute variance than ShareGPT, as the paper reports.
* **Level (log-space mean mu)**: solved numerically so that the exact means of the
  integer, filtered distribution equal the paper's numbers (to 1e-9 relative); the
  filter and rounding would otherwise shift them.

For workloads that must follow real data, use ``pool`` lengths on a real lengths
file instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from kvsim.traces.lengths import DiscreteLengths
from kvsim.traces.sharegpt_filter import MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS, MIN_TOKENS


@dataclass(frozen=True)
class PaperWorkload:
    """Target means (tokens, from the paper) and the log-space spreads chosen above."""

    name: str
    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float


PAPER_WORKLOADS = {
    w.name: w
    for w in (
        PaperWorkload("sharegpt-paper", 161.31, 337.99, prompt_sigma=1.63, output_sigma=1.00),
        PaperWorkload("alpaca-paper", 19.31, 58.45, prompt_sigma=0.60, output_sigma=1.00),
    )
}
PRESET_NAMES = tuple(PAPER_WORKLOADS)


@cache
def preset_lengths(name: str) -> DiscreteLengths:
    """The length sampler of a paper workload preset (see the module docstring)."""
    if name not in PAPER_WORKLOADS:
        raise ValueError(f"length preset must be one of {', '.join(PRESET_NAMES)}; got {name!r}")
    w = PAPER_WORKLOADS[name]
    return truncated_lognormal_lengths(w.prompt_mean, w.output_mean, w.prompt_sigma, w.output_sigma)


def truncated_lognormal_lengths(
    prompt_mean: float,
    output_mean: float,
    prompt_sigma: float,
    output_sigma: float,
    *,
    min_tokens: int = MIN_TOKENS,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    max_total_tokens: int = MAX_TOTAL_TOKENS,
) -> DiscreteLengths:
    """Rounded lognormal prompt and output lengths cut to ``[min_tokens,
    max_prompt_tokens]`` (prompt), ``>= min_tokens`` (output) and
    ``prompt + output <= max_total_tokens``, whose exact means are the given ones.

    Each step multiplies a lognormal's median by target / current mean; the
    means rise monotonically with the medians, so this converges in a few dozen steps.
    """
    if not min_tokens * 2 <= max_total_tokens or not min_tokens <= max_prompt_tokens:
        raise ValueError("need min_tokens <= max_prompt_tokens and 2 * min_tokens <= max_total")
    if not min_tokens < prompt_mean < max_prompt_tokens:
        raise ValueError(
            f"prompt_mean must lie in ({min_tokens}, {max_prompt_tokens}); got {prompt_mean}"
        )
    if not min_tokens < output_mean < max_total_tokens - min_tokens:
        raise ValueError(
            f"output_mean must lie in ({min_tokens}, {max_total_tokens - min_tokens}); "
            f"got {output_mean}"
        )
    for name, sigma in (("prompt_sigma", prompt_sigma), ("output_sigma", output_sigma)):
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"{name} must be a finite number > 0; got {sigma!r}")
    prompt_values = np.arange(min_tokens, max_prompt_tokens + 1)
    output_values = np.arange(min_tokens, max_total_tokens - min_tokens + 1)
    mu_p, mu_o = math.log(prompt_mean), math.log(output_mean)
    for _ in range(200):
        lengths = DiscreteLengths(
            prompt_values,
            _rounded_lognormal(prompt_values, mu_p, prompt_sigma),
            output_values,
            _rounded_lognormal(output_values, mu_o, output_sigma),
            max_total_tokens,
        )
        got_p, got_o = lengths.expected_means()
        if abs(got_p / prompt_mean - 1) < 1e-10 and abs(got_o / output_mean - 1) < 1e-10:
            return lengths
        mu_p += math.log(prompt_mean / got_p)
        mu_o += math.log(output_mean / got_o)
    raise ValueError(f"cannot reach means ({prompt_mean}, {output_mean}) within the length limits")


_erf = np.vectorize(math.erf, otypes=[float])


def _rounded_lognormal(values: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    """P(round(X) = v | X rounds into ``values``) for X lognormal(mu, sigma);
    ``values`` are consecutive integers >= 1."""
    edges = np.append(values - 0.5, values[-1] + 0.5)
    cdf = 0.5 * (1.0 + _erf((np.log(edges) - mu) / (sigma * math.sqrt(2.0))))
    probs = np.diff(cdf)
    total = probs.sum()
    if not total > 0:
        raise ValueError(f"lognormal(mu={mu:.3g}, sigma={sigma}) puts no mass on the lengths")
    return probs / total
