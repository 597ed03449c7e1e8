"""Cache tiers (``allocator.tiers``) under ``scheduler.policy: vllm-v0`` (the paper's scheduler,
with an offloading connector such as LMCache below its prefix cache) in the fast engine equal
the reference engine (``simulator.reference.vllm.ReferenceReplica.load_head`` over
``policies.reference.paged`` and ``ReferenceTiers``): every request's times, hits, loaded
tokens and load wait, the step totals, and every tier's counters.

The cases are v0 configs of every setting the v0 differential tests draw (watermark, swap
space and preemption modes, request-level batching, parallel samples and beams, replicas,
windows, macro steps) with a paged prefix cache of 1-, 4- or 16-token blocks under each GPU
eviction policy v0 models, and one or two tiers of 0-256 tokens of each eviction and write
policy behind links slow enough that loads and stores queue; the requests reuse three
prefixes with priorities 0-2. ``test_the_v0_cases_load_and_evict`` measures on seeded cases
of the same shape that they load, store, evict and contend, so the comparison is not vacuous."""

from __future__ import annotations

from hypothesis import strategies as st
from ref_cases import configs, workloads
from ref_tiers import (
    assert_agree,
    seeded_tier_case,
    tier_differential_test,
    tier_lists,
    tier_reach,
)
from reuse_cases import reuse_workloads, with_priorities

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES

#: GPU eviction policies v0 models (its allocator is not told priorities)
V0_POLICIES = [p for p in EVICTION_POLICIES if p != "priority"]


@st.composite
def v0_tier_cases(draw, top_write: str) -> tuple[dict, list]:
    cfg = draw(configs())
    max_len = cfg["model"]["context_len_tokens"]
    B = draw(st.sampled_from([1, 4, 16]))
    cfg["allocator"] = {"kind": "paged", "block_size": B, "prefix_caching": True,
                        "eviction_policy": draw(st.sampled_from(V0_POLICIES)),
                        "watermark": cfg["allocator"]["watermark"]}
    blocks = st.sampled_from([0, 1, 2, 4, 8, 16]).map(lambda n: n * 16 // B)  # 0-256 tokens
    cfg["allocator"]["tiers"] = draw(tier_lists(B, top_write, blocks, [0.25, 1.0, 4.0, 25.6],
                                                [0.0, 1e-3, 1e-2]))
    requests = draw(st.one_of(reuse_workloads(max_len), workloads(max_len, prefix_caching=True, max_count=14)))
    return cfg, with_priorities(draw, requests)


test_v0_fast_engine_equals_reference_with_cache_tiers = tier_differential_test(
    "test_v0_fast_engine_equals_reference_with_cache_tiers", v0_tier_cases)


# --- the cases are not vacuous ------------------------------------------------------------------
def seeded_case(seed: int) -> tuple[dict, list]:
    """A case of the strategy's shape from ``random.Random(seed)``: vllm-v0 with prefix
    caching under any GPU eviction policy v0 models, a watermark and drawn batch limits."""
    return seeded_tier_case(seed, [4, 16], lambda rng, B: (
        {"kind": "paged", "block_size": B, "prefix_caching": True, "eviction_policy": rng.choice(V0_POLICIES),
         "watermark": rng.choice([0.0, 0.01, 0.1])},
        {"policy": "vllm-v0", "max_num_seqs": rng.choice([2, 4, 256]),
         "max_num_batched_tokens": rng.choice([384, 512, 2048])}))


def test_the_v0_cases_load_and_evict():
    """Over 30 seeded cases (10 per top-tier write policy) the engines agree, and the cases
    reach what the differential test is for: requests load from a tier (some from the lower
    tier of two) and wait for their loads, tiers evict, and transfers queue for a link.
    Measured (cases): loading 22, from the second tier 3, waiting (a load before the first
    token) 22, tiers evicting 18, a transfer waiting for its link 22; loading per top-tier
    write policy: write-through 6, after hits 6, write-back 10."""
    r = tier_reach(seeded_case, 30)
    assert_agree(r)
    assert (r.loading >= 18 and r.second >= 2 and r.waiting >= 18 and r.evicting >= 15
            and r.contended >= 18), r
    assert min(r.per_write.values()) >= 1 and sum(r.per_write.values()) == r.loading, r.per_write
