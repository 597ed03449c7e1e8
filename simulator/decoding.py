"""Decoding-side models: parallel-sample lengths, beam-search parent choice, prompt-block contents.

These are the stochastic or content-dependent parts of sharing, kept as small
pure functions so the scheduler stays a story about queues.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Hashable
from functools import lru_cache

import numpy as np

from kvsim.traces import Request


def sample_targets(request: Request, policy: str, rng: np.random.Generator, max_total: int) -> list[int]:
    """Output lengths (tokens) of a request's ``n`` parallel samples.

    ``same``: every sample generates the request's output length (the trace's).
    ``independent``: each sample's length is drawn from an exponential distribution
    with the request's output length as its mean (the maximum-entropy choice when
    only the mean is known), rounded up and clipped to [1, max_total - prompt].
    """
    n, out = request.n, request.output_tokens
    if n == 1 or policy == "same":
        return [out] * n
    cap = max(1, max_total - request.prompt_tokens)
    draws = np.ceil(rng.exponential(out, size=n)).astype(int)
    return [int(min(max(d, 1), cap)) for d in draws]


@lru_cache(maxsize=256)
def _parent_cdf(width: int, concentration: float) -> tuple[float, ...]:
    """Cumulative probability of choosing each rank as a parent."""
    weights = [math.exp(-concentration * rank) for rank in range(width)]
    total = sum(weights)
    return tuple(itertools.accumulate(w / total for w in weights))


def beam_parent_counts(concentration: float, uniforms: list[float]) -> list[int]:
    """How many of the next step's beams descend from each current beam (best first),
    given one uniform draw in [0, 1) per beam (the beam width is their number).

    Each new beam picks its parent independently with probability proportional to
    ``exp(-concentration * rank)``: 0 is uniform; larger values favour the best
    beams, as a sharp next-token distribution does. A beam picked by nobody dies;
    one picked m times forks into m. (Inverse-CDF sampling in plain Python: this runs
    for every beam group at every step, and beams are few; the scheduler draws the
    uniforms of all groups of a step at once.)
    """
    width = len(uniforms)
    cdf = _parent_cdf(width, concentration)
    counts = [0] * width
    last = width - 1
    for u in uniforms:
        rank = bisect.bisect_right(cdf, u)
        counts[rank if rank < last else last] += 1
    return counts


def prefix_contents(request: Request, block_size: int, *, with_output: bool = False) -> list[Hashable]:
    """The content of each leading full prompt block that other requests may share.

    Mooncake ``hash_ids`` name 512-token blocks (``hash_block_tokens``); a block of
    ``block_size`` tokens (which must divide it) is named by its hash id and its
    position inside that 512-token block. A ``prefix_id`` names a common prefix
    of ``prefix_tokens`` tokens. Tokens after the shared part are unique.

    A request with ``token_ids`` (the prompt's real tokens) names every full prompt block
    by its tokens: :func:`token_block_identities`, exact at any block size.

    ``with_output``: when the request also knows its answer (``output_token_ids``), the
    names go on past the prompt over the generated tokens (prompt + answer, chained), so a
    later prompt that resends prompt + answer (the next turn of a conversation) finds the
    answer's blocks. vLLM v1 asks for this; v0's cache holds prompt blocks only, and
    parallel samples or beams (which v1 does not run) would keep private generated tokens.
    """
    if request.token_ids is not None:
        if with_output and request.output_token_ids is not None:
            return token_block_identities(request.token_ids + request.output_token_ids, block_size)
        return token_block_identities(request.token_ids, block_size)
    if request.hash_ids:
        hb = request.hash_block_tokens
        if hb % block_size:
            raise ValueError(f"block size {block_size} does not divide the trace's hash block of {hb} tokens")
        covered = min(len(request.hash_ids) * hb, request.prompt_tokens)
        per = hb // block_size
        return [("h", request.hash_ids[j // per], j % per) for j in range(covered // block_size)]
    if request.prefix_id is not None and request.prefix_tokens:
        return [("p", request.prefix_id, j) for j in range(min(request.prefix_tokens, request.prompt_tokens) // block_size)]
    return []


def token_block_identities(token_ids: tuple[int, ...], block_size: int) -> list[Hashable]:
    """The identity of each full block of ``block_size`` tokens of a prompt (a partial last
    block has none: it is not cached).

    Block j's identity is a digest of (block j-1's identity, block j's token ids), so two
    prompts share block j exactly when they agree on every token up to its end: a change in
    one token changes its block and every later one. blake2b (16 bytes) of the ids as
    little-endian 32-bit integers: the same on every machine and run (Python's ``hash`` of
    a str or bytes is salted per process), and a collision is out of reach (2^-64 for
    2^32 blocks).
    """
    ids = np.asarray(token_ids, dtype="<u4")
    out: list[Hashable] = []
    parent = b""
    for j in range(len(ids) // block_size):
        parent = hashlib.blake2b(parent + ids[j * block_size:(j + 1) * block_size].tobytes(),
                                 digest_size=16).digest()
        out.append(("t", parent))
    return out
