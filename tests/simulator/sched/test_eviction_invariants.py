"""The prefix caches' books under every eviction policy, step by step (hypothesis): each
block or slot in exactly one place, refcounts exact, the eviction order's evictable entries
exactly the cache's evictable blocks or leaves (``check`` after every step)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_cases import step

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.simulator.sched.sglang import SchedulerSGLang, SGLangSettings
from kvsim.simulator.sched.vllm_v1 import SchedulerV1
from kvsim.traces import Request

B = 4  # slots per block (page)


def make(engine: str, policy: str, capacity_blocks: int):
    ended: list = []
    if engine == "vllm-v1":
        alloc = V1PrefixCacheAllocator(capacity_blocks, B, policy)
        return SchedulerV1(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                    max_num_batched_tokens=64), ended.append)
    if engine == "sglang":
        alloc = RadixCacheAllocator(capacity_blocks * B, B, policy)
        return SchedulerSGLang(alloc, SGLangSettings(watermark=0, max_num_batched_tokens=64, max_seq_len=1024,
                                                     chunked_prefill_size=32), ended.append)
    alloc = PagedAllocator(capacity_blocks, B, 0, prefix_caching=True, eviction=policy)
    return Scheduler(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, max_num_batched_tokens=1024,
                                              preemption="recompute"), ended.append)


REQUESTS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2), st.integers(0, 4)),
    min_size=1, max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(engine=st.sampled_from(["vllm-v0", "vllm-v1", "sglang"]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "arc", "priority"]),
       capacity=st.integers(12, 30), reqs=REQUESTS)
def test_books_balance_after_every_step_under_every_policy(engine, policy, capacity, reqs):
    """Requests share one of four prefixes (16-token prefix ids) and arrive over the first
    steps; a cache of 12-30 blocks of 4 keeps evicting."""
    if engine == "vllm-v0" and policy == "priority":
        policy = "lru"  # (not modelled under v0: a config error)
    s = make(engine, policy, capacity)
    pending = [Request(i, float(t), 16 + own, out, prefix_id=f"p{p}", prefix_tokens=16, priority=prio)
               for i, (p, own, out, prio, t) in enumerate(reqs)]
    for t in range(400):
        for r in [r for r in pending if r.arrival_time <= t]:
            s.add(r, float(t))
            pending.remove(r)
        step(s, t)
        if not pending and not s.has_work:
            break
    assert not pending and not s.has_work
