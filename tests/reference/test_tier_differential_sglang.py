"""Cache tiers (``allocator.tiers``) under ``scheduler.policy: sglang`` (SGLang's HiCache) in
the fast engine equal the reference engine, which keeps them plainly (pages named by their
tokens up to the page's end, ``simulator.reference.vllm.ReferenceTiers`` over
``policies.reference.tier``: SimPy links, one process per transfer): every request's times,
hits, loaded tokens and load wait, the step totals, and every tier's counters.

The cases are sglang configs of every queue order and eviction policy with a small radix
cache (two to eight prompts), pages of 1, 4 or 16 tokens, and one or two tiers of 0-4
times the cache (so tiers evict, and drop under ``priority``) of each eviction and write
policy, behind links slow enough that loads and stores queue behind each other; the
requests mostly reuse three prefixes, spread out in time, with priorities 0-2. ``test_the_cases_load_and_evict``
measures on seeded cases of the same shape that they load, store, evict and contend, so the
comparison is not vacuous."""

from __future__ import annotations

import random

from hypothesis import strategies as st
from ref_cases import SLOTS_PER_GIB, sglang_configs, v1_workloads
from ref_tiers import (
    assert_agree,
    seeded_tier_case,
    tier_differential_test,
    tier_lists,
    tier_reach,
)
from reuse_cases import reuse_workloads, with_priorities

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES as POLICIES
from kvsim.traces import Request


def sglang_tier_lists(P: int, kv_slots: int, top_write: str) -> st.SearchStrategy[list[dict]]:
    """One or two tiers of 0-4 times the radix cache's tokens (a tier smaller than the tree
    keeps little the tree has lost), the top one with ``top_write`` (choices listed most
    useful first: hypothesis draws early entries most often)."""
    times = st.sampled_from([2.0, 4.0, 1.0, 0.5, 0.0])  # the tree's tokens
    blocks = times.map(lambda x: int(x * kv_slots) // P)
    return tier_lists(P, top_write, blocks, [4.0, 25.6, 1.0, 0.25], [1e-3, 0.0, 1e-2])


def returning_prefixes(max_len: int) -> st.SearchStrategy[list[Request]]:
    """10-16 requests, mostly spread out, each reusing one of three prefixes with a prompt
    of a quarter to half the context, so a prefix comes back after the others pushed it out
    of the tree, and its stores have ended."""
    return reuse_workloads(max_len, min_count=10, max_count=16, min_prompt=max_len // 4,
                           spread_out=True)


@st.composite
def sglang_tier_cases(draw, top_write: str) -> tuple[dict, list[Request]]:
    cfg = draw(sglang_configs())
    max_len = cfg["model"]["context_len_tokens"]
    kv_slots = draw(st.integers(max_len, 2 * max_len))
    cfg["hardware"]["kv_cache_gib"] = kv_slots / SLOTS_PER_GIB
    P = cfg["allocator"]["block_size"] = draw(st.sampled_from([1, 4, 16]))
    chunk = cfg["scheduler"]["chunked_prefill_size"]
    if chunk is not None and chunk < P:
        cfg["scheduler"]["chunked_prefill_size"] = None
    cfg["allocator"]["tiers"] = draw(sglang_tier_lists(P, kv_slots, top_write))
    requests = draw(returning_prefixes(max_len) if draw(st.integers(0, 3)) else
                    st.one_of(reuse_workloads(max_len), v1_workloads(max_len, max_count=14)))
    return cfg, with_priorities(draw, requests)


test_sglang_fast_engine_equals_reference_with_cache_tiers = tier_differential_test(
    "test_sglang_fast_engine_equals_reference_with_cache_tiers", sglang_tier_cases)


# --- the cases are not vacuous ------------------------------------------------------------------
def sglang_settings(rng: random.Random, P: int) -> tuple[dict, dict]:
    """sglang with any eviction policy, queue order and drawn batch limits."""
    allocator = {"kind": "paged", "block_size": P, "eviction_policy": rng.choice(POLICIES)}
    return allocator, {"policy": "sglang",
                       "schedule_policy": rng.choice(["lpm", "fcfs", "dfs-weight"]),
                       "max_num_seqs": rng.choice([2, 4, 256]),
                       "max_num_batched_tokens": rng.choice([256, 512, 2048]),
                       "chunked_prefill_size": rng.choice([None, 64, 8192])}


def seeded_case(seed: int) -> tuple[dict, list[Request]]:
    """A case of the strategy's shape from ``random.Random(seed)``."""
    return seeded_tier_case(seed, [1, 4, 16], sglang_settings)


def test_the_sglang_cases_load_and_evict():
    """Over 18 seeded cases (6 per top-tier write policy) the engines agree, and the cases
    reach what the differential test is for: requests load from a tier (some from the lower
    tier of two) and wait for their loads, tiers evict, and transfers queue for a link.
    Measured (cases): loading 11, from the second tier 4, waiting (a load before the first
    token) 11, tiers evicting 13, a transfer waiting for its link 11; loading per top-tier
    write policy: write-through 3, after hits 2, write-back 6. (The hypothesis cases,
    measured over 100 per write policy: 24, 21 and 41 load.)"""
    r = tier_reach(seeded_case, 18)
    assert_agree(r)
    assert (r.loading >= 10 and r.second >= 3 and r.waiting >= 10 and r.evicting >= 12
            and r.contended >= 10), r
    assert min(r.per_write.values()) >= 1 and sum(r.per_write.values()) == r.loading, r.per_write
