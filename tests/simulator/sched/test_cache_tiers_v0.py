"""Cache tiers under ``scheduler.policy: vllm-v0`` (the paper's scheduler over its paged prefix
cache, with an offloading connector below it): each write policy and a load worked out by
hand through the scheduler, a load that does not fit waiting for room, the books under
random workloads (hypothesis: allocator and tiers checked after every step, with swap and
recompute preemption, a watermark and parallel samples), and a multi-turn run from a config
whose TTFT drops with a CPU tier."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_cases import multi_turn_config, run_steps, tier_stack

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.config import ConfigError, load_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.traces import Request

B = 4  # tokens per block


def stack(*levels: tuple[int, str, int, str]) -> TierStack:
    """Tiers of (capacity blocks, write policy, after-hits N, eviction); links of 1000 B/s and
    1 s per transfer, blocks of 1000 bytes: k blocks take 1 + k seconds."""
    return tier_stack(*levels, block_tokens=B, block_bytes=1000.0)


def v0(capacity_blocks: int, tiers: TierStack, *, swap_blocks: int = 0, eviction: str = "lru",
       **limits) -> tuple[Scheduler, list]:
    ended: list = []
    alloc = PagedAllocator(capacity_blocks, B, swap_blocks, prefix_caching=True, eviction=eviction)
    knobs = {"max_seq_len": 1024, "watermark": 0.0, **limits}
    return Scheduler(alloc, SchedulerSettings(**knobs), ended.append, tiers), ended


def by_id(ended: list) -> dict:
    return {g.request.request_id: g for g in ended}


def p0_p1_p0(third_at: float, second_output: int = 1) -> list[Request]:
    """Request 0 computes prefix p0 (16 tokens: 4 blocks) at 0; request 1 (prefix p1, at 5)
    needs the whole 5-block GPU, so the cache evicts p0; request 2 (prefix p0, 13 tokens: 3
    named blocks) arrives at ``third_at`` and finds p0 only in a tier."""
    return [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 5.0, 17, second_output, prefix_id="p1", prefix_tokens=16),
            Request(2, third_at, 13, 1, prefix_id="p0", prefix_tokens=12)]


# --- loads and stores through the scheduler -------------------------------------------------------
def test_write_through_an_evicted_prefix_comes_back_from_the_cpu_tier():
    """p0's 4 blocks are written through when request 0's prefill ends at 1 (ready at 6),
    p1's at 6 (the link is busy until 11). Request 2 (at 10) loads 3 blocks, queued behind
    p1's store: from 11 to 15. Back at the front of the queue it is admitted at 15 with a
    12-token GPU hit that counts no lookup or hit again."""
    tiers = stack((100, "write-through", 0, "lru"))
    s, ended = v0(5, tiers)
    run_steps(s, p0_p1_p0(10.0))
    g = by_id(ended)[2]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled, g.cached_tokens) == (12, 5.0, 15.0, 12)
    assert g.first_token == 16.0
    cpu = tiers.stats()["t0"]
    assert (cpu["hit_blocks"], cpu["stored_blocks"], cpu["store_bytes"]) == (3, 8, 8000.0)
    assert (s.alloc.prefix_lookups, s.alloc.prefix_hits) == (4 + 4 + 3, 0)  # request 2: at its load


def test_write_back_stores_what_the_gpu_evicts_after_the_loads_of_that_scheduling():
    """Admitting request 1 at 5 evicts p0's 4 blocks: stored at the end of that scheduling
    (5 to 10). Request 2 loads 3 blocks at 10 (10 to 14); taking blocks for them evicts
    two of p1's (released first to last: p1's head goes first), stored after the load, on
    the same link (14 to 17); admitting request 2 at 14 takes one more block and evicts a
    third (17 to 19)."""
    tiers = stack((100, "write-back", 0, "lru"))
    s, ended = v0(5, tiers)
    run_steps(s, p0_p1_p0(10.0))
    g = by_id(ended)[2]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled) == (12, 4.0, 14.0)
    cpu = tiers.levels[0].tier
    assert cpu.stored_blocks == 4 + 2 + 1 and cpu.hit_blocks == 3
    assert tiers.levels[0].link.busy_s == pytest.approx(5 + 4 + 3 + 2) and tiers.levels[0].link.free_at == 19.0


def test_write_through_after_hits_stores_the_blocks_a_request_hit():
    """With N = 1 a block is stored at its first GPU hit: request 1 (p0 again, at 2) hits
    p0's 4 blocks, stored at the end of that scheduling (ready at 7); request 2 (p1, at 5)
    evicts them from the GPU; request 3 (p0, at 10) loads 3 blocks from the tier (10 to 14).
    p1's blocks are never hit: never stored."""
    tiers = stack((100, "write-through-after-hits", 1, "lru"))
    s, ended = v0(5, tiers)
    reqs = [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 2.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(2, 5.0, 17, 1, prefix_id="p1", prefix_tokens=16),
            Request(3, 10.0, 13, 1, prefix_id="p0", prefix_tokens=12)]
    run_steps(s, reqs)
    g = by_id(ended)[3]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled) == (12, 4.0, 14.0)
    assert tiers.levels[0].tier.stored_blocks == 4 and by_id(ended)[1].cached_tokens == 16


def test_a_load_that_does_not_fit_waits_for_room():
    """Request 1 (p1, 3 output tokens) holds the whole GPU from 5 to 8: at 6 and 7 request
    2's load of 3 blocks does not fit, and admission stops. At 8 it loads, behind p1's store
    on the link (6 to 11): from 11 to 15."""
    tiers = stack((100, "write-through", 0, "lru"))
    s, ended = v0(5, tiers)
    run_steps(s, p0_p1_p0(6.0, second_output=3))
    g = by_id(ended)[2]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled, g.cached_tokens) == (12, 7.0, 15.0, 12)


def test_a_load_keeps_the_watermark_free():
    """On an 8-block GPU request 1 takes the 4 never-used blocks and evicts p0's head, so
    request 2 (at 6) hits nothing on the GPU and needs 3 blocks for its load; 3 are free
    (p0's cached tail). Without a watermark it loads at 6, queued behind p1's store (6 to
    11): from 11 to 15, 9 s of waiting. With a 1-block watermark the load must leave one
    block free: it waits for request 1 to finish at 8, and loads from 11 to 15 all the same."""
    waited = {}
    for watermark in (0.0, 1 / 8):
        s, ended = v0(8, stack((100, "write-through", 0, "lru")), watermark=watermark)
        run_steps(s, p0_p1_p0(6.0, second_output=3))
        g = by_id(ended)[2]
        waited[watermark] = (g.loaded_tokens, g.load_wait, g.first_scheduled)
    assert waited == {0.0: (12, 9.0, 15.0), 1 / 8: (12, 7.0, 15.0)}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(write=st.sampled_from(["write-through", "write-through-after-hits", "write-back"]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "arc"]),
       tier_policy=st.sampled_from(["lru", "lfu", "fifo", "arc", "priority"]),
       preemption=st.sampled_from(["recompute", "swap"]), watermark=st.sampled_from([0.0, 0.1]),
       capacity=st.integers(8, 24), swap=st.sampled_from([0, 4, 32]), cpu=st.integers(0, 12),
       reqs=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2),
                               st.integers(0, 30), st.sampled_from([1, 1, 2])), min_size=1, max_size=12))
def test_books_balance_after_every_step_with_tiers(write, policy, tier_policy, preemption, watermark,
                                                   capacity, swap, cpu, reqs):
    """Every request ends (finished, or aborted when swap space runs out); after every step
    the GPU allocator's books (refcounts with the loading tables, the cache index and each
    cached key's parent and priority, memory classes) and each tier's (size within capacity,
    eviction order and child counts exact) balance."""
    tiers = stack((cpu, write, 1, tier_policy), (cpu // 2, "write-back", 0, "lru"))
    s, ended = v0(capacity, tiers, swap_blocks=swap, eviction=policy, preemption=preemption, watermark=watermark)
    pending = [Request(i, float(t), 16 + own, out, prefix_id=f"p{p}", prefix_tokens=16, priority=prio, n=n)
               for i, (p, own, out, prio, t, n) in enumerate(reqs)]
    count = len(pending)
    run_steps(s, pending, 600)
    assert not pending and not s.has_work and not s.loading and len(ended) == count
    assert not s.alloc._loading and s.alloc._loading_blocks == 0


# --- from a config ------------------------------------------------------------------------------
def config(tiers: str, macro: bool = True) -> str:
    """80 conversations of up to 8 turns from 300 GPU blocks under vllm-v0 with ``tiers``."""
    return multi_turn_config(
        name="tiers-v0", hardware="num_gpu_blocks: 300", conversations=80, max_turns=8,
        scheduler="{policy: vllm-v0, max_num_seqs: 64, max_num_batched_tokens: 8192}",
        tiers=tiers, prefix_caching=True, macro_steps=macro)


def run(tmp_path: Path, tiers: str, macro: bool = True):
    p = tmp_path / f"c{hash((tiers, macro)) & 0xffff}.yaml"
    p.write_text(config(tiers, macro))
    return run_experiment(*load_config(p))


def test_a_cpu_tier_under_v0_cuts_ttft_on_multi_turn_and_macro_steps_change_nothing(tmp_path: Path):
    """Multi-turn chat resends each conversation: prefixes the 300-block GPU cache evicted
    come back from a 2 GiB CPU tier instead of being computed again. Measured: mean TTFT
    48.2 ms without the tier, 43.7 ms with it; the tier serves 27% of the blocks looked up."""
    cpu = "[{name: cpu, capacity_gib: 2}]"
    fast, single, none = run(tmp_path, cpu), run(tmp_path, cpu, macro=False), run(tmp_path, "[]")
    assert fast.summary["tier_cpu_hit_ratio"] > 0.2 and fast.summary["mean_ttft_load_ms"] > 0
    assert fast.summary["tier_cpu_loaded_tokens"] == fast.requests["loaded_tokens"].sum()
    assert fast.summary["mean_ttft_ms"] < 0.95 * none.summary["mean_ttft_ms"]
    assert (fast.requests["status"] == "finished").all() and (none.requests["status"] == "finished").all()
    computed = (fast.requests.prompt_tokens - fast.requests.cached_prompt_tokens).sum()
    assert computed < (none.requests.prompt_tokens - none.requests.cached_prompt_tokens).sum()
    # one closed-form run or its steps one by one: the same, up to float rounding of the clock
    pd.testing.assert_frame_equal(fast.requests, single.requests, check_exact=False, rtol=1e-12)
    for k, v in fast.summary.items():
        if k.startswith("tier_") or k.startswith("mean_ttft"):
            assert v == pytest.approx(single.summary[k], rel=1e-12), k


def test_tiers_under_v0_need_the_prefix_cache(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text(config("[{name: cpu, capacity_gib: 1}]").replace("  prefix_caching: true\n", ""))
    with pytest.raises(ConfigError, match="prefix_caching"):
        load_config(p)
