"""Decoding-side models: parallel-sample lengths, beam-search parent choice, prompt-block contents.

These are the stochastic or content-dependent parts of sharing, kept as small
pure functions so the scheduler stays a story about queues.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Hashable, Sequence
from functools import lru_cache

import numpy as np

from kvsim.policies.indexes.token_blocks import TokenBlocks
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


HASH_POSITIONS = 1 << 20
"""Positions one Mooncake hash id can name (``hash_block_tokens // block_size`` must be
smaller): block ``j`` of hash id ``h`` is the integer ``h * HASH_POSITIONS + j``."""

_NUMPY_HASH_IDS = 1 << 42
"""Hash ids below this (in magnitude) are spread to blocks in numpy's int64 without overflow
(``2**42 * HASH_POSITIONS < 2**63``); larger ones take Python's unbounded ints."""


def prefix_contents(request: Request, block_size: int, *, with_output: bool = False) -> Sequence[Hashable]:
    """The content of each leading full prompt block that other requests may share.

    A content names one block on its own, not chained: every consumer interns the pair
    (parent block's key, content) (``policies.indexes.key_chain``, the reference's ``chain_key``),
    so two prompts share block j exactly when they agree on every block up to j. Three kinds
    that never compare equal to each other:

    - ``token_ids`` (the prompt's real tokens): the block's tokens as bytes
      (:func:`token_block_contents`, all of a prompt's in one ``TokenBlocks``), exact at
      any block size; they win over the others.
    - Mooncake ``hash_ids`` name 512-token blocks (``hash_block_tokens``); a block of
      ``block_size`` tokens (which must divide it) is named by its hash id and its position
      j inside that hash block, as one int ``hash_id * HASH_POSITIONS + j`` (an ``array``
      of them: :func:`hash_block_contents`).
    - A ``prefix_id`` names a common prefix of ``prefix_tokens`` tokens: ``("p", id, j)``.

    Tokens after the shared part are unique. Why ints and bytes rather than tuples or a
    digest per block: they are built a whole prompt at a time in C (numpy, ``array``), compare
    at C speed in the key chain's slice comparisons, and hold a third of a tuple's memory;
    a digest chain costs a hash call per block (the top item of a profile of the multi-turn bench).

    ``with_output``: when the request also knows its answer (``output_token_ids``), the
    names go on past the prompt over the generated tokens (prompt + answer), so a later
    prompt that resends prompt + answer (the next turn of a conversation) finds the
    answer's blocks. vLLM v1 asks for this; v0's cache holds prompt blocks only, and
    parallel samples or beams (which v1 does not run) would keep private generated tokens.
    """
    if request.token_ids is not None:
        if with_output and request.output_token_ids is not None:
            return token_block_contents(request.token_ids, block_size, request.output_token_ids)
        return token_block_contents(request.token_ids, block_size)
    if request.hash_ids:
        return hash_block_contents(request.hash_ids, request.hash_block_tokens, block_size,
                                   request.prompt_tokens)
    if request.prefix_id is not None and request.prefix_tokens:
        return [("p", request.prefix_id, j) for j in range(min(request.prefix_tokens, request.prompt_tokens) // block_size)]
    return []


def hash_block_contents(hash_ids: tuple[int, ...], hash_block_tokens: int, block_size: int,
                        prompt_tokens: int) -> Sequence[int]:
    """Block j of a prompt named by hash ids covering ``hash_block_tokens`` tokens each:
    ``hash_ids[j // per] * HASH_POSITIONS + j % per`` with ``per = hash_block_tokens //
    block_size``, for the full blocks the hash ids and the prompt both cover (one numpy
    expression for the whole prompt: no Python step per block). An ``array`` of 64-bit
    ints (no int object per block; ``policies.indexes.key_chain`` keeps such contents 8 bytes
    each), or a list of ints when a hash id is too large for numpy's int64 spread."""
    hb = hash_block_tokens
    if hb % block_size:
        raise ValueError(f"block size {block_size} does not divide the trace's hash block of {hb} tokens")
    per = hb // block_size
    if per >= HASH_POSITIONS:
        raise ValueError(f"hash blocks of {hb} tokens hold {per} blocks of {block_size}; at most "
                         f"{HASH_POSITIONS - 1} are allowed")
    count = min(len(hash_ids) * hb, prompt_tokens) // block_size
    if count == 0:
        return []
    used = hash_ids[:-(-count // per)]
    if max(map(abs, used)) >= _NUMPY_HASH_IDS:
        return [used[j // per] * HASH_POSITIONS + j % per for j in range(count)]
    # row i of the (hash ids x positions) grid is hash id i's blocks, in order
    grid = np.array(used, dtype=np.int64)[:, None] * HASH_POSITIONS + np.arange(per, dtype=np.int64)
    return array("q", grid.reshape(-1)[:count].tobytes())


def token_block_contents(token_ids: tuple[int, ...], block_size: int,
                         more_ids: tuple[int, ...] = ()) -> TokenBlocks:
    """The content of each full block of ``block_size`` tokens of ``token_ids`` followed by
    ``more_ids`` (a partial last block has none: it is not cached): the block's ids as
    32-bit integers (``traces.fields.MAX_TOKEN_ID``), in bytes.

    Exact: two blocks get equal contents exactly when their tokens are equal (no hash that
    could collide), and the consumers chain them (:func:`prefix_contents`). Built in C for
    the whole prompt: the ids into an ``array`` of 32-bit ints, its bytes held as one
    :class:`~policies.indexes.token_blocks.TokenBlocks` (a sequence of the blocks' bytes, with no
    object per block).
    """
    ids = array("I", token_ids)
    if more_ids:
        ids.extend(more_ids)
    count = len(ids) // block_size
    return TokenBlocks(ids[:count * block_size].tobytes(), ids.itemsize * block_size)
