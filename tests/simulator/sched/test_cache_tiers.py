"""Cache tiers below the GPU (policies.tiers.tier_stack): the link's arithmetic, each write
policy worked out by hand, a load's timing end to end, the books under random workloads
(hypothesis: allocator and tiers checked after every step) and macro steps unchanged."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_cases import multi_turn_config, run_steps, tier_stack

from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
from kvsim.policies.tiers.tier_stack import TierLink, TierStack, chain_parents
from kvsim.simulator.config import ConfigError, load_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.simulator.sched.vllm_v1 import SchedulerV1
from kvsim.traces import Request

B = 4


def stack(*levels: tuple[int, str, int, str], block_bytes: float = 100.0) -> TierStack:
    """Tiers of (capacity blocks, write policy, after-hits N, eviction), links of 1000 B/s and 1 s latency."""
    return tier_stack(*levels, block_tokens=B, block_bytes=block_bytes)


# --- the link ---------------------------------------------------------------------------------
def test_the_link_serves_transfers_one_at_a_time_in_order():
    link = TierLink(bandwidth=1000.0, latency=0.5)
    assert link.transfer(1000, at=2.0) == 3.5  # 0.5 + 1 s
    assert link.transfer(500, at=3.0) == 4.5  # queued behind the first: starts at 3.5
    assert link.transfer(0, at=10.0) == 10.5  # an idle link starts at once
    assert link.busy_s == pytest.approx(1.5 + 1.0 + 0.5)


# --- write policies ---------------------------------------------------------------------------
def test_write_through_stores_once_and_readable_after_the_transfer():
    s = stack((10, "write-through", 0, "lru"))
    s.write_through(["a", "b"], chain_parents(["a", "b"], None), [0, 0], now=1.0)
    t = s.levels[0].tier
    assert t.ready_s == {"a": 2.2, "b": 2.2}  # from 1 s: 1 s latency + 200 bytes at 1000 B/s
    assert s.lookup(["a", "b", "c"], now=2.1) == [] and s.lookup(["a", "b", "c"], now=2.2) == [0, 0]
    s.write_through(["a", "b"], chain_parents(["a", "b"], None), [0, 0], now=5.0)  # held: nothing sent
    assert s.levels[0].store_bytes == 200 and s.levels[0].link.busy_s == pytest.approx(1.2)


def test_write_through_after_hits_waits_for_the_nth_hit():
    s = stack((10, "write-through-after-hits", 2, "lru"))
    s.write_through(["a"], [None], [0], now=0.0)  # not write-through: ignored
    s.gpu_hits(["a", "b"], [None, "a"], 0)
    s.flush_scheduling(1.0)
    assert len(s.levels[0].tier) == 0
    s.gpu_hits(["a"], [None], 0)
    s.flush_scheduling(2.0)
    assert list(s.levels[0].tier.ready_s) == ["a"] and s.levels[0].tier.ready_s["a"] == pytest.approx(3.1)


def test_write_back_stores_gpu_evictions_and_cascades_tier_evictions():
    s = stack((2, "write-back", 0, "fifo"), (5, "write-back", 0, "lru"))
    s.gpu_evicted(["a", "b", "c"], [None, "a", "b"], [0, 0, 1])
    s.flush_scheduling(0.0)
    cpu, disk = s.levels[0].tier, s.levels[1].tier
    assert sorted(cpu.ready_s) == ["b", "c"] and list(disk.ready_s) == ["a"]  # fifo pushed "a" down
    assert disk.meta["a"] == (None, 0) and cpu.meta["c"] == ("b", 1)
    assert s.stats()["t0"]["evictions"] == 1 and s.stats()["t1"]["stored_blocks"] == 1


def test_a_lower_write_through_tier_stores_what_the_upper_stored():
    s = stack((1, "write-through", 0, "lru"), (5, "write-through", 0, "lru"))
    s.write_through(["a", "b"], [None, "a"], [0, 0], now=0.0)
    assert list(s.levels[0].tier.ready_s) == ["b"] and sorted(s.levels[1].tier.ready_s) == ["a", "b"]


def test_a_lookup_takes_each_block_from_the_top_tier_that_has_it():
    s = stack((5, "write-through", 0, "lru"), (5, "write-back", 0, "lru"))
    s.levels[1].tier.store(["a", "b"], [None, "a"], 0.0, [0, 0])
    s.levels[0].tier.store(["b"], ["a"], 0.0, [0])
    assert s.lookup(["a", "b", "c"], now=1.0) == [1, 0]
    done = s.start_load(["a", "b"], [1, 0], now=2.0, priority=0)
    assert done == pytest.approx(3.1)  # two links at once: each 1 s + 100 bytes
    assert s.stats()["t1"]["hit_blocks"] == 1 and s.stats()["t0"]["loaded_tokens"] == B


def test_stores_that_find_no_room_are_dropped():
    s = stack((0, "write-through", 0, "lru"))
    s.write_through(["a"], [None], [0], now=0.0)
    assert s.stats()["t0"]["dropped_blocks"] == 1 and s.levels[0].store_bytes == 0


# --- loads through the v1 scheduler ------------------------------------------------------------
def v1(capacity_blocks: int, tiers: TierStack) -> tuple[SchedulerV1, list]:
    ended: list = []
    alloc = V1PrefixCacheAllocator(capacity_blocks, B)
    sched = SchedulerV1(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                 max_num_batched_tokens=64), ended.append, tiers)
    return sched, ended


def test_an_evicted_prefix_comes_back_from_the_cpu_tier():
    """Request 0 computes a 16-token prefix (4 blocks of 4), written through to the CPU (link:
    1 s + 1 s per block) from t=1 to 6; request 1 (another prefix) evicts all of it from a
    5-block GPU, and its own store holds the link from 6 to 11; request 2 (prefix 0, 13
    tokens: a hit is capped at 3 blocks) arrives at 10 and loads 3 blocks from 11 to 15."""
    tiers = stack((100, "write-through", 0, "lru"), block_bytes=1000.0)
    s, ended = v1(5, tiers)
    reqs = [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 5.0, 17, 1, prefix_id="p1", prefix_tokens=16),
            Request(2, 10.0, 13, 1, prefix_id="p0", prefix_tokens=12)]
    run_steps(s, reqs, 400)
    g = {g.request.request_id: g for g in ended}[2]
    assert g.loaded_tokens == 12 and g.load_wait == 5.0  # queued 1 s behind request 1's store
    assert g.first_scheduled == 15.0 and g.cached_tokens == 12  # back from the load: a GPU hit
    assert tiers.stats()["t0"]["hit_blocks"] == 3 and tiers.stats()["t0"]["stored_blocks"] == 8
    assert s.alloc.prefix_hits == 0  # loaded blocks are not GPU hits
    assert s.alloc.prefix_lookups == 4 + 4 + 3  # request 2 looked up once (at its load)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(write=st.sampled_from(["write-through", "write-through-after-hits", "write-back"]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "arc", "priority"]),
       capacity=st.integers(8, 24), cpu=st.integers(0, 12),
       reqs=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2),
                               st.integers(0, 30)), min_size=1, max_size=12))
def test_books_balance_after_every_step_with_tiers(write, policy, capacity, cpu, reqs):
    """Every request ends; after every step the GPU allocator's books and each tier's
    (size within capacity, eviction order and child counts exact) balance."""
    tiers = stack((cpu, write, 1, policy), (cpu // 2, "write-back", 0, "lru"))
    s, ended = v1(capacity, tiers)
    pending = [Request(i, float(t), 16 + own, out, prefix_id=f"p{p}", prefix_tokens=16, priority=prio)
               for i, (p, own, out, prio, t) in enumerate(reqs)]
    n = len(pending)
    run_steps(s, pending, 400)
    assert not pending and not s.has_work and len(ended) == n


# --- end to end ------------------------------------------------------------------------------
def config(tiers: str, macro: bool = True, policy: str = "vllm-v1") -> str:
    """40 conversations from 300 GPU blocks under ``policy`` with ``tiers`` (YAML flow text)."""
    return multi_turn_config(
        name="tiers", hardware="num_gpu_blocks: 300", conversations=40, max_turns=5,
        scheduler=f"{{policy: {policy}, max_num_seqs: 64, max_num_batched_tokens: 2048}}",
        tiers=tiers, prefix_caching=True, macro_steps=macro)


def run(tmp_path: Path, tiers: str, macro: bool = True):
    p = tmp_path / f"c{hash((tiers, macro)) & 0xffff}.yaml"
    p.write_text(config(tiers, macro))
    return run_experiment(*load_config(p))


def test_a_cpu_tier_loads_instead_of_recomputing_and_macro_steps_change_nothing(tmp_path):
    cpu = "[{name: cpu, capacity_gib: 2}]"
    fast, single, none = run(tmp_path, cpu), run(tmp_path, cpu, macro=False), run(tmp_path, "[]")
    assert fast.summary["tier_cpu_hit_blocks"] > 0
    assert fast.summary["tier_cpu_loaded_tokens"] == fast.requests["loaded_tokens"].sum()
    # one closed-form run or its steps one by one: the same, up to float rounding of the clock
    pd.testing.assert_frame_equal(fast.requests, single.requests, check_exact=False, rtol=1e-12)
    assert fast.summary.keys() == single.summary.keys()
    for k, v in fast.summary.items():
        if k.startswith("tier_"):
            assert v == pytest.approx(single.summary[k], rel=1e-12), k
    # the tier saves prefill work: fewer prompt tokens computed than without it
    assert fast.summary["tier_cpu_hit_ratio"] > 0 and "tier_cpu_hit_ratio" not in none.summary
    done = fast.requests[fast.requests.status == "finished"]
    ttft = (done.first_token_s - done.arrival_s).mean() * 1000
    split = sum(fast.summary[f"mean_ttft_{p}_ms"] for p in ("queue", "load", "prefill"))
    assert split == pytest.approx(ttft)
    assert fast.summary["mean_ttft_load_ms"] > 0


def test_tiers_need_the_prefix_cache_and_after_hits_needs_its_write_policy(tmp_path):
    """(vllm-v0 runs tiers too: ``test_cache_tiers_v0.py``.)"""
    p = tmp_path / "c.yaml"
    p.write_text(config("[{name: cpu, capacity_gib: 1}]").replace("  prefix_caching: true\n", ""))
    with pytest.raises(ConfigError, match="needs allocator.prefix_caching true"):
        load_config(p)
    p.write_text(config("[{name: cpu, capacity_gib: 1, write_after_hits: 2}]"))
    with pytest.raises(ConfigError, match="write_after_hits"):
        load_config(p)
