"""Cache tiers (``allocator.tiers``) in the fast engine equal the reference engine, which
keeps them plainly (``simulator.reference.vllm.ReferenceTiers`` over ``policies.reference.tier``:
SimPy links, one process per transfer): every request's times, hits, loaded tokens and load
wait, the step totals, and every tier's counters.

The cases are vllm-v1 with prefix caching, a small GPU cache (two to four prompts) and one
or two tiers of 0-12 blocks (so tiers evict, and drop under ``priority``), each eviction
and write policy, and links slow enough (0.25-25.6 GB/s, up to 10 ms per transfer) that
loads and stores queue behind each other; the requests reuse three prefixes with
priorities 0-2. ``test_the_cases_load_and_evict`` measures on seeded cases of the same
shape that they load, store, evict and contend, so the comparison is not vacuous."""

from __future__ import annotations

import random

import pytest
from hypothesis import strategies as st
from ref_cases import SLOTS_PER_GIB, v1_configs, v1_workloads
from ref_compare import differences
from ref_tiers import (
    BYTES_PER_TOKEN,
    assert_agree,
    seeded_tier_case,
    tier,
    tier_differential_test,
    tier_lists,
    tier_reach,
)
from reuse_cases import reuse_workloads, with_priorities

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES as POLICIES
from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference.simulation import ReferenceSimulation


@st.composite
def tier_cases(draw, top_write: str) -> tuple[dict, list]:
    cfg = draw(v1_configs(prefix_caching=True))
    max_len = cfg["model"]["context_len_tokens"]
    cfg["hardware"]["kv_cache_gib"] = draw(st.integers(max_len, 3 * max_len)) / SLOTS_PER_GIB
    B = cfg["allocator"]["block_size"] = draw(st.sampled_from([1, 4, 16]))
    cfg["allocator"]["eviction_policy"] = draw(st.sampled_from(POLICIES))
    blocks = st.sampled_from([0, 1, 2, 4, 8, 16]).map(lambda n: n * 16 // B)  # 0-256 tokens
    cfg["allocator"]["tiers"] = draw(tier_lists(B, top_write, blocks, [0.25, 1.0, 4.0, 25.6],
                                                [0.0, 1e-3, 1e-2]))
    requests = draw(st.one_of(reuse_workloads(max_len), v1_workloads(max_len, max_count=14)))
    return cfg, with_priorities(draw, requests)


test_fast_engine_equals_reference_with_cache_tiers = tier_differential_test(
    "test_fast_engine_equals_reference_with_cache_tiers", tier_cases)


# --- the cases are not vacuous ------------------------------------------------------------------
def v1_settings(rng: random.Random, B: int) -> tuple[dict, dict]:
    """vllm-v1 with prefix caching, any eviction policy, drawn batch limits."""
    allocator = {"kind": "paged", "block_size": B, "prefix_caching": True,
                 "eviction_policy": rng.choice(POLICIES)}
    return allocator, {"policy": "vllm-v1", "max_num_seqs": rng.choice([2, 4, 256]),
                       "max_num_batched_tokens": rng.choice([256, 512, 2048])}


def seeded_case(seed: int) -> tuple[dict, list]:
    """A case of the strategies' shape from ``random.Random(seed)``."""
    return seeded_tier_case(seed, [4, 16], v1_settings)


def test_the_cases_load_and_evict():
    """Over 30 seeded cases (10 per top-tier write policy) the engines agree, and the cases
    reach what the differential test is for: requests load from a tier (some from the lower
    tier of two) and wait for their loads, tiers evict, and transfers queue for a link
    (loads and stores contend). Measured (cases): loading 17, from the second tier 2, waiting
    (a load before the first token) 16, tiers evicting 26, a transfer waiting for its link
    23; loading per top-tier write policy: write-through 7, after hits 2, write-back 8."""
    r = tier_reach(seeded_case, 30)
    assert (r.loading >= 14 and r.second >= 1 and r.waiting >= 12 and r.evicting >= 20
            and r.contended >= 10), (r.loading, r.second, r.waiting, r.evicting, r.contended)
    assert min(r.per_write.values()) >= 1 and sum(r.per_write.values()) == r.loading, r.per_write
    assert_agree(r)


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


def test_a_load_refused_for_room_waits_for_an_event_as_in_the_reference():
    """Found by hypothesis: at 3.524 s requests 4 and 7 start loads and 6 is refused for room
    (its 64 tier blocks do not fit); the step is empty. The fast engine used to schedule again
    at the same instant, after that scheduling's write-back batch had evicted part of 6's
    blocks from the CPU tier, so its smaller load (42 blocks) now fit and began at 3.524 s;
    the reference sleeps until an event, and 6 starts at 3.554 s, when 4's load ends (load
    wait 0.200 s against the fast engine's former 0.231 s)."""
    from kvsim.traces import Request

    config = {'model': {'name': 'llama-2-7b', 'context_len_tokens': 256}, 'hardware': {'gpu': 'a100-80gb', 'kv_cache_gib': 0.14306640625, 'swap_space_gib': 0.0, 'num_replicas': 1}, 'workload': {'arrivals': {'kind': 'poisson', 'rate': 1.0}, 'num_requests': 1, 'lengths': {'kind': 'fixed', 'prompt_tokens': 1, 'output_tokens': 1}}, 'allocator': {'kind': 'paged', 'block_size': 1, 'prefix_caching': True, 'eviction_policy': 'lfu', 'tiers': [{'name': 'cpu', 'capacity_gib': 0.125, 'link': {'bandwidth_gb_s': 1.0, 'latency_s': 0.0}, 'eviction_policy': 'fifo', 'write_policy': 'write-back'}, {'name': 'disk', 'capacity_gib': 0.0, 'link': {'bandwidth_gb_s': 0.25, 'latency_s': 0.0}, 'eviction_policy': 'lru', 'write_policy': 'write-through'}]}, 'scheduler': {'policy': 'vllm-v1', 'max_num_seqs': 2, 'max_num_batched_tokens': 128, 'long_prefill_token_threshold': 5, 'max_num_partial_prefills': None, 'reserve_full_isl': True, 'router': 'round_robin'}, 'engine': {'macro_steps': True}, 'metrics': {'window': 'busy', 'step_table': False}, 'seed': 0}
    # (id, arrival s, prompt tokens, output tokens, prefix, prefix tokens, priority)
    rows = [
        (0, 0.0, 7, 102, "p0", 16, 1), (1, 0.0, 111, 5, "p1", 64, 2), (2, 0.0, 66, 128, "p0", 66, 2),
        (3, 0.0, 107, 98, "p2", 16, 0), (4, 0.0, 66, 119, "p1", 256, 0), (5, 0.31, 119, 95, "p1", 16, 1),
        (6, 0.31, 101, 68, "p0", 64, 1), (7, 0.321, 125, 6, "p0", 100, 2), (8, 0.332, 88, 20, "p0", 64, 1),
        (9, 0.343, 55, 66, "p1", 256, 0), (10, 0.343, 68, 13, "p2", 68, 0), (11, 0.413, 110, 41, "p0", 256, 1),
    ]
    requests = [Request(r, t, p, o, prefix_id=x, prefix_tokens=k, priority=q) for r, t, p, o, x, k, q in rows]
    assert differences(config, requests) == []
