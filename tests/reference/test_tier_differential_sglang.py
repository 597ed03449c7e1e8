"""Cache tiers (``allocator.tiers``) under ``scheduler.policy: sglang`` (SGLang's HiCache) in
the fast engine equal the reference engine, which keeps them plainly (pages named by their
tokens up to the page's end, ``simulator.reference.ReferenceTiers`` over
``policies.reference_tier``: SimPy links, one process per transfer): every request's times,
hits, loaded tokens and load wait, the step totals, and every tier's counters.

The cases are sglang configs of every queue order and eviction policy with a small radix
cache (two to eight prompts), pages of 1, 4 or 16 tokens, and one or two tiers of 0-4
times the cache (so tiers evict, and drop under ``priority``) of each eviction and write
policy, behind links slow enough that loads and stores queue behind each other; the
requests mostly reuse three prefixes, spread out in time, with priorities 0-2. ``test_the_cases_load_and_evict``
measures on seeded cases of the same shape that they load, store, evict and contend, so the
comparison is not vacuous."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from ref_cases import SLOTS_PER_GIB, base_config, sglang_configs, v1_workloads
from ref_compare import assert_same, case_source, differences
from test_eviction_differential import reuse_workloads, with_priorities
from test_tier_differential import WRITES, tier

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference import ReferenceSimulation
from kvsim.traces import Request

POLICIES = ("lru", "lfu", "fifo", "arc", "priority")
EXAMPLES = {"default": 8, "long": 400}[os.environ.get("KVSIM_HYPOTHESIS_PROFILE", "default")]


@st.composite
def sglang_tier_lists(draw, P: int, kv_slots: int, top_write: str) -> list[dict]:
    """One or two tiers of 0-4 times the radix cache's tokens (a tier smaller than the tree
    keeps little the tree has lost), the top one with ``top_write`` (choices listed most
    useful first: hypothesis draws early entries most often)."""
    tiers = []
    for i, name in enumerate(["cpu", "disk"][: draw(st.integers(1, 2))]):
        times = draw(st.sampled_from([2.0, 4.0, 1.0, 0.5, 0.0]))
        tiers.append(tier(
            name, int(times * kv_slots) // P, P, draw(st.sampled_from(POLICIES)),
            top_write if i == 0 else draw(st.sampled_from(WRITES)), draw(st.integers(1, 3)),
            draw(st.sampled_from([4.0, 25.6, 1.0, 0.25])), draw(st.sampled_from([1e-3, 0.0, 1e-2])),
        ))
    return tiers


@st.composite
def returning_prefixes(draw, max_len: int) -> list[Request]:
    """10-16 requests, one every 0-0.3 s (mostly spread out), each reusing one of three
    prefixes (prefix ids or Mooncake hash ids) of 16 tokens to its whole prompt, so a prefix
    comes back after the others pushed it out of the tree, and its stores have ended."""
    requests, t = [], 0.0
    for i in range(draw(st.integers(10, 16))):
        t += draw(st.sampled_from([0.3, 0.07, 0.011, 0.0]))
        prompt = draw(st.integers(max_len // 4, max_len // 2))
        output = draw(st.integers(1, 24))
        p = draw(st.integers(0, 2))
        if draw(st.booleans()):
            shared = draw(st.sampled_from([prompt, 48, 32, 16]))
            requests.append(Request(i, round(t, 6), prompt, output, prefix_id=f"p{p}",
                                    prefix_tokens=min(shared, prompt)))
        else:
            blocks = -(-prompt // 16)
            requests.append(Request(i, round(t, 6), prompt, output, hash_block_tokens=16,
                                    hash_ids=tuple(range(10 * p, 10 * p + blocks))))
    return requests


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


@pytest.mark.parametrize("write", WRITES)
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_sglang_fast_engine_equals_reference_with_cache_tiers(write, data):
    config, requests = data.draw(sglang_tier_cases(write))
    note(case_source(config, requests))
    assert_same(config, requests)


# --- the cases are not vacuous ------------------------------------------------------------------
def seeded_case(seed: int) -> tuple[dict, list[Request]]:
    """A case of the strategy's shape from ``random.Random(seed)`` (the same cases in every
    run: a measured count must not move)."""
    rng = random.Random(seed)
    P = rng.choice([1, 4, 16])
    cfg = base_config(256, rng.randint(256, 384), 0)  # one or two prompts: the tree evicts
    cfg["allocator"] = {"kind": "paged", "block_size": P, "eviction_policy": rng.choice(POLICIES)}
    cfg["scheduler"] = {"policy": "sglang", "schedule_policy": rng.choice(["lpm", "fcfs", "dfs-weight"]),
                        "max_num_seqs": rng.choice([2, 4, 256]),
                        "max_num_batched_tokens": rng.choice([256, 512, 2048]),
                        "chunked_prefill_size": rng.choice([None, 64, 8192])}
    tiers = []
    for i, name in enumerate(["cpu", "disk"][: rng.randint(1, 2)]):
        tiers.append(tier(name, rng.choice([4, 8, 16, 32]) * 16 // P, P, rng.choice(POLICIES),
                          WRITES[seed % 3] if i == 0 else rng.choice(WRITES), rng.randint(1, 2),
                          rng.choice([0.25, 1.0, 4.0]), rng.choice([0.0, 1e-3])))
    cfg["allocator"]["tiers"] = tiers
    requests, t = [], 0.0
    for i in range(rng.randint(16, 24)):
        t += rng.choice([0.0, 0.011, 0.07, 0.3])
        prompt, output, p = rng.randint(33, 128), rng.randint(1, 24), rng.randint(0, 2)
        if rng.random() < 0.5:
            shared = min(rng.choice([16, 32, 48, prompt]), prompt)
            requests.append(Request(i, round(t, 6), prompt, output, prefix_id=f"p{p}",
                                    prefix_tokens=shared, priority=rng.randint(0, 2)))
        else:
            blocks = -(-prompt // 16)
            requests.append(Request(i, round(t, 6), prompt, output, hash_block_tokens=16,
                                    hash_ids=tuple(range(10 * p, 10 * p + blocks)),
                                    priority=rng.randint(0, 2)))
    return cfg, requests


def test_the_sglang_cases_load_and_evict():
    """Over 18 seeded cases (6 per top-tier write policy) the engines agree, and the cases
    reach what the differential test is for: requests load from a tier (some from the lower
    tier of two) and wait for their loads, tiers evict, and transfers queue for a link.
    Measured (cases): loading 11, from the second tier 4, waiting (a load before the first
    token) 11, tiers evicting 13, a transfer waiting for its link 11; loading per top-tier
    write policy: write-through 3, after hits 2, write-back 6. (The hypothesis cases,
    measured over 100 per write policy: 24, 21 and 41 load.)"""
    loading = second = waiting = evicting = contended = 0
    per_write = dict.fromkeys(WRITES, 0)
    disagree = {}
    for seed in range(18):
        config, requests = seeded_case(seed)
        if diffs := differences(config, requests):
            disagree[seed] = (diffs[:3], case_source(config, requests))
        cfg = ExperimentConfig.model_validate(config)
        sim = ReferenceSimulation(cfg, requests)
        ref = sim.run()
        stats = ref.tier_stats
        loads = sum(s["hit_blocks"] for s in stats.values())
        loading += loads > 0
        per_write[WRITES[seed % 3]] += loads > 0
        second += stats.get("disk", {}).get("hit_blocks", 0) > 0
        waiting += (ref.requests["load_wait_s"] > 0).any()
        evicting += sum(s["evictions"] for s in stats.values()) > 0
        contended += sum(sum(r.tiers.queued) for r in sim.replicas) > 0
        for replica in sim.replicas:  # the books balance at the end
            replica.alloc.check()
            for t in replica.tiers.tiers:
                t.check()
        assert ref.requests["loaded_tokens"].sum() == sum(s["loaded_tokens"] for s in stats.values())
    counts = (loading, second, waiting, evicting, contended, per_write)
    first = next(iter(disagree.values()), None)
    assert not disagree, f"the engines disagree on seeds {sorted(disagree)}: {first}"
    assert (loading >= 10 and second >= 3 and waiting >= 10 and evicting >= 12 and contended >= 10), counts
    assert min(per_write.values()) >= 1 and sum(per_write.values()) == loading, per_write
