"""vLLM's ShareGPT filter: the length rules vLLM's serving benchmark applies to
ShareGPT conversations before sampling requests.

A request is kept when ``prompt >= 4``, ``output >= 4``, ``prompt <= 1024`` and
``prompt + output <= 2048`` tokens: it drops degenerate rows and keeps every request
within a 2048-token context (OPT's, the vLLM paper's models).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from kvsim.traces.request import Request
from kvsim.traces.transforms import renumber

MIN_TOKENS = 4  # shortest prompt and shortest output kept
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048  # prompt + output


def sharegpt_keep(prompt, output):
    """True where vLLM's ShareGPT filter keeps a (prompt, output) pair; works on ints
    and elementwise on numpy arrays."""
    return (
        (prompt >= MIN_TOKENS)
        & (output >= MIN_TOKENS)
        & (prompt <= MAX_PROMPT_TOKENS)
        & (prompt + output <= MAX_TOTAL_TOKENS)
    )


def sharegpt_filter(requests: Iterable[Request]) -> Iterator[Request]:
    """The requests vLLM's ShareGPT filter keeps, renumbered 0, 1, 2, ..."""
    kept = (r for r in requests if sharegpt_keep(r.prompt_tokens, r.output_tokens))
    return renumber(kept)


def sharegpt_keep_array(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """:func:`sharegpt_keep` for arrays, typed for use as a length-sampler filter."""
    return np.asarray(sharegpt_keep(prompt, output), dtype=bool)
