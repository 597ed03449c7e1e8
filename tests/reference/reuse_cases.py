"""Requests that come back to a few shared prefixes, for the differential tests of what a
cache keeps (eviction policies, cache tiers): a hypothesis strategy, and the same shape
drawn from a seeded ``random.Random`` for the tests that measure how often the cases reach
an eviction or a load (a measured count must not move between runs, so those cases do not
come from hypothesis).

Each request reuses one of three prefixes, as prefix ids (``prefix_tokens`` of 16, 32, 48
or the whole prompt) or as Mooncake hash ids of 16-token blocks (``10 p .. 10 p + blocks``):
a prefix returns after the others pushed it out, so a cache chooses among several victims.
Times are in seconds, lengths in tokens."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import strategies as st

from kvsim.traces import Request

GAPS_S = (0.0, 0.011, 0.07, 0.3)  # time between two arrivals (s)
SHARED_TOKENS = (16, 32, 48)  # prefix lengths besides the whole prompt
HASH_BLOCK_TOKENS = 16
PREFIXES = 3


def with_priorities(draw, requests: list[Request]) -> list[Request]:
    """Priorities 0-2 (the ``priority`` policy's key; the others must ignore them)."""
    return [dataclasses.replace(r, priority=draw(st.integers(0, 2))) for r in requests]


def reuse_request(rid: int, t: float, prompt: int, output: int, p: int, shared: int | None,
                  priority: int = 0) -> Request:
    """Request ``rid`` at ``t`` s reusing prefix ``p``: by id over ``shared`` tokens (capped at
    the prompt), or, when ``shared`` is None, as hash ids covering its whole prompt."""
    if shared is not None:
        return Request(rid, round(t, 6), prompt, output, prefix_id=f"p{p}",
                       prefix_tokens=min(shared, prompt), priority=priority)
    blocks = -(-prompt // HASH_BLOCK_TOKENS)
    return Request(rid, round(t, 6), prompt, output, hash_block_tokens=HASH_BLOCK_TOKENS,
                   hash_ids=tuple(range(10 * p, 10 * p + blocks)), priority=priority)


@st.composite
def reuse_workloads(draw, max_len: int, min_count: int = 6, max_count: int = 14,
                    min_prompt: int = 17, max_prompt: int | None = None,
                    spread_out: bool = False) -> list[Request]:
    """``min_count``-``max_count`` requests of ``min_prompt``-``max_prompt`` (default
    ``max_len // 2``) prompt tokens and 1-24 output tokens. ``spread_out`` lists the long
    gaps and long shares first (hypothesis draws early entries most often), so a prefix
    mostly comes back after its stores have ended."""
    order = (lambda xs: list(reversed(xs))) if spread_out else list
    requests, t = [], 0.0
    for i in range(draw(st.integers(min_count, max_count))):
        t += draw(st.sampled_from(order(GAPS_S)))
        prompt = draw(st.integers(min_prompt, max_len // 2 if max_prompt is None else max_prompt))
        output = draw(st.integers(1, 24))
        p = draw(st.integers(0, PREFIXES - 1))
        by_id = draw(st.booleans())
        shared = draw(st.sampled_from(order([*SHARED_TOKENS, prompt]))) if by_id else None
        requests.append(reuse_request(i, t, prompt, output, p, shared))
    return requests


def seeded_reuse_requests(rng: random.Random, min_count: int, max_count: int,
                          min_prompt: int) -> list[Request]:
    """``reuse_workloads``' shape from ``rng`` (prompts up to 128 tokens, priorities 0-2); the
    draws' order is fixed, so the same seed gives the same requests in every run."""
    requests, t = [], 0.0
    for i in range(rng.randint(min_count, max_count)):
        t += rng.choice(GAPS_S)
        prompt, output = rng.randint(min_prompt, 128), rng.randint(1, 24)
        p = rng.randint(0, PREFIXES - 1)
        shared = rng.choice([*SHARED_TOKENS, prompt]) if rng.random() < 0.5 else None
        requests.append(reuse_request(i, t, prompt, output, p, shared, priority=rng.randint(0, 2)))
    return requests
