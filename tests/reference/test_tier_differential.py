"""Cache tiers (``allocator.tiers``) in the fast engine equal the reference engine, which
keeps them plainly (``simulator.reference.ReferenceTiers`` over ``policies.reference_tier``:
SimPy links, one process per transfer): every request's times, hits, loaded tokens and load
wait, the step totals, and every tier's counters.

The cases are vllm-v1 with prefix caching, a small GPU cache (two to four prompts) and one
or two tiers of 0-12 blocks (so tiers evict, and drop under ``priority``), each eviction
and write policy, and links slow enough (0.25-25.6 GB/s, up to 10 ms per transfer) that
loads and stores queue behind each other; the requests reuse three prefixes with
priorities 0-2. ``test_the_cases_load_and_evict`` measures on seeded cases of the same
shape that they load, store, evict and contend, so the comparison is not vacuous."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from ref_cases import SLOTS_PER_GIB, base_config, v1_configs, v1_workloads
from ref_compare import assert_same, case_source, differences
from test_eviction_differential import reuse_workloads, with_priorities

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference import ReferenceSimulation

POLICIES = ("lru", "lfu", "fifo", "arc", "priority")
WRITES = ("write-through", "write-through-after-hits", "write-back")
EXAMPLES = {"default": 8, "long": 400}[os.environ.get("KVSIM_HYPOTHESIS_PROFILE", "default")]
BYTES_PER_TOKEN = 2**30 // SLOTS_PER_GIB  # Llama-2-7B: 0.5 MiB of KV per token


def tier(name: str, blocks: int, B: int, eviction: str, write: str, hits: int,
         gb_s: float, latency_s: float) -> dict:
    """A tier of exactly ``blocks`` blocks of ``B`` tokens (a dyadic GiB count: no rounding)."""
    t = {"name": name, "capacity_gib": blocks * B * BYTES_PER_TOKEN / 2**30,
         "link": {"bandwidth_gb_s": gb_s, "latency_s": latency_s},
         "eviction_policy": eviction, "write_policy": write}
    if write == "write-through-after-hits":
        t["write_after_hits"] = hits
    return t


@st.composite
def tier_lists(draw, B: int, top_write: str) -> list[dict]:
    """One or two tiers; the top one with ``top_write``."""
    tiers = []
    for i, name in enumerate(["cpu", "disk"][: draw(st.integers(1, 2))]):
        tiers.append(tier(
            name, draw(st.sampled_from([0, 1, 2, 4, 8, 16])) * 16 // B, B, draw(st.sampled_from(POLICIES)),
            top_write if i == 0 else draw(st.sampled_from(WRITES)), draw(st.integers(1, 3)),
            draw(st.sampled_from([0.25, 1.0, 4.0, 25.6])), draw(st.sampled_from([0.0, 1e-3, 1e-2])),
        ))
    return tiers


@st.composite
def tier_cases(draw, top_write: str) -> tuple[dict, list]:
    cfg = draw(v1_configs(prefix_caching=True))
    max_len = cfg["model"]["context_len_tokens"]
    cfg["hardware"]["kv_cache_gib"] = draw(st.integers(max_len, 3 * max_len)) / SLOTS_PER_GIB
    B = cfg["allocator"]["block_size"] = draw(st.sampled_from([1, 4, 16]))
    cfg["allocator"]["eviction_policy"] = draw(st.sampled_from(POLICIES))
    cfg["allocator"]["tiers"] = draw(tier_lists(B, top_write))
    requests = draw(st.one_of(reuse_workloads(max_len), v1_workloads(max_len, max_count=14)))
    return cfg, with_priorities(draw, requests)


@pytest.mark.parametrize("write", WRITES)
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fast_engine_equals_reference_with_cache_tiers(write, data):
    config, requests = data.draw(tier_cases(write))
    note(case_source(config, requests))
    assert_same(config, requests)


# --- the cases are not vacuous ------------------------------------------------------------------
def seeded_case(seed: int) -> tuple[dict, list]:
    """A case of the strategies' shape from ``random.Random(seed)`` (the same cases in every
    run: a measured count must not move)."""
    from kvsim.traces import Request

    rng = random.Random(seed)
    B = rng.choice([4, 16])
    cfg = base_config(256, rng.randint(256, 384), 0)  # one or two prompts: the GPU evicts
    cfg["allocator"] = {"kind": "paged", "block_size": B, "prefix_caching": True,
                        "eviction_policy": rng.choice(POLICIES)}
    cfg["scheduler"] = {"policy": "vllm-v1", "max_num_seqs": rng.choice([2, 4, 256]),
                        "max_num_batched_tokens": rng.choice([256, 512, 2048])}
    tiers = []
    for i, name in enumerate(["cpu", "disk"][: rng.randint(1, 2)]):
        tiers.append(tier(name, rng.choice([4, 8, 16, 32]) * 16 // B, B, rng.choice(POLICIES),
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


def test_the_cases_load_and_evict():
    """Over 30 seeded cases (10 per top-tier write policy) the engines agree, and the cases
    reach what the differential test is for: requests load from a tier (some from the lower
    tier of two) and wait for their loads, tiers evict, and transfers queue for a link
    (loads and stores contend). Measured (cases): loading 17, from the second tier 2, waiting
    (a load before the first token) 16, tiers evicting 26, a transfer waiting for its link
    23; loading per top-tier write policy: write-through 7, after hits 2, write-back 8."""
    loading = second = waiting = evicting = contended = 0
    per_write = dict.fromkeys(WRITES, 0)
    disagree = {}
    for seed in range(30):
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
    assert (loading >= 14 and second >= 1 and waiting >= 12 and evicting >= 20 and contended >= 10), (
        loading, second, waiting, evicting, contended)
    assert min(per_write.values()) >= 1 and sum(per_write.values()) == loading, per_write
    first = next(iter(disagree.values()), None)
    assert not disagree, f"the engines disagree on seeds {sorted(disagree)}: {first}"


# --- hand-worked cases: the reference's own rules -----------------------------------------------
MIB8 = 16 * BYTES_PER_TOKEN  # one 16-token block of Llama-2-7B: 8 MiB
LOAD2 = 1e-3 + 2 * MIB8 / 1e9  # two blocks over a 1 GB/s link with 1 ms per transfer (s)


def _three_requests(tiers: list[dict]) -> tuple[dict, list]:
    """A GPU of 4 blocks of 16 and three one-output requests a second apart: A (prefix "A":
    two blocks, then its own partial block), B (prefix "B": three blocks and its own), A
    again. B takes all 4 blocks, evicting A's two cached blocks from the GPU (the free queue
    is 3, then A's released blocks last to first), so the second A finds nothing on the GPU."""
    from kvsim.traces import Request

    config = {
        "model": {"name": "llama-2-7b", "context_len_tokens": 64},
        "hardware": {"gpu": "a100-80gb", "kv_cache_gib": 64 / SLOTS_PER_GIB},
        "workload": {"arrivals": {"kind": "poisson", "rate": 1.0}, "num_requests": 1,
                     "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1}},
        "allocator": {"kind": "paged", "block_size": 16, "prefix_caching": True, "tiers": tiers},
        "scheduler": {"policy": "vllm-v1"},
    }
    return config, [Request(0, 0.0, 33, 1, prefix_id="A", prefix_tokens=32),
                    Request(1, 1.0, 49, 1, prefix_id="B", prefix_tokens=48),
                    Request(2, 2.0, 33, 1, prefix_id="A", prefix_tokens=32)]


@pytest.mark.parametrize(("write", "loaded", "stored"), [
    ("write-through", 32, 5),  # every prompt block: A's 2, B's 3
    ("write-back", 32, 4),  # what the GPU evicts: A's 2 (for B), B2 (the load), B1 (the admission)
    ("write-through-after-hits", 0, 0),  # no block is ever hit on the GPU
])
def test_the_second_a_loads_its_prefix_from_the_cpu_tier(write, loaded, stored):
    """The second A finds A's two blocks in the CPU tier (8 blocks, 1 GB/s, 1 ms a transfer)
    unless they were never stored: it loads them (2 x 8 MiB: 1 ms + 16.78 ms), waits outside
    the queues, then is admitted at the load's end with a 32-token GPU hit that the GPU's
    counters do not count again (lookups: A 2, B 3, the load 2)."""
    config, requests = _three_requests([tier("cpu", 8, 16, "lru", write, 1, 1.0, 1e-3)])
    assert differences(config, requests) == []
    sim = ReferenceSimulation(ExperimentConfig.model_validate(config), requests)
    ref = sim.run()
    last = ref.requests.iloc[2]
    assert (last.loaded_tokens, last.cached_prompt_tokens) == (loaded, loaded)
    assert last.load_wait_s == pytest.approx(LOAD2 if loaded else 0.0, rel=1e-12)
    assert last.scheduled_s == pytest.approx(2.0 + (LOAD2 if loaded else 0.0), rel=1e-12)
    cpu = ref.tier_stats["cpu"]
    assert (cpu["hit_blocks"], cpu["stored_blocks"], cpu["evictions"]) == (loaded // 16, stored, 0)
    assert (cpu["load_bytes"], cpu["store_bytes"]) == (loaded // 16 * MIB8, stored * MIB8)
    one = 1e-3 + MIB8 / 1e9  # one block's transfer (s)
    stores = {"write-through": LOAD2 + one + 2 * MIB8 / 1e9,  # A's batch, B's batch
              "write-back": LOAD2 + 2 * one,  # one batch per scheduling that evicted
              "write-through-after-hits": 0.0}[write]
    assert cpu["link_busy_s"] == pytest.approx(stores + (LOAD2 if loaded else 0.0), rel=1e-12)
    alloc = ref.allocators[0]
    # the GPU evicts A0, A1 (for B), then B2 and B1 (for the second A: load or not)
    assert (alloc.prefix_lookups, alloc.prefix_hits, alloc.evictions) == (7, 0, 4)
    assert not sim.replicas[0].loading and not sim.replicas[0].waiting


def test_a_full_cpu_tier_writes_back_to_disk_and_the_load_comes_from_disk():
    """A CPU tier of one block (write-through) over a disk of 8 (write-back): storing A's two
    blocks evicts A0 to the disk, B's three push out A1, B0 and B1 too; the CPU keeps B2. The
    second A loads both blocks from the disk (its own link), none from the CPU."""
    config, requests = _three_requests([
        tier("cpu", 1, 16, "lru", "write-through", 1, 1.0, 1e-3),
        tier("disk", 8, 16, "lru", "write-back", 1, 1.0, 1e-3),
    ])
    assert differences(config, requests) == []
    ref = ReferenceSimulation(ExperimentConfig.model_validate(config), requests).run()
    cpu, disk = ref.tier_stats["cpu"], ref.tier_stats["disk"]
    assert (cpu["stored_blocks"], cpu["evictions"], cpu["hit_blocks"]) == (5, 4, 0)
    assert (disk["stored_blocks"], disk["evictions"], disk["hit_blocks"]) == (4, 0, 2)
    assert ref.requests["loaded_tokens"].tolist() == [0, 0, 32]
    assert ref.requests["load_wait_s"].iloc[2] == pytest.approx(LOAD2, rel=1e-12)
