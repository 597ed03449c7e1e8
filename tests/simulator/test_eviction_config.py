"""``allocator.eviction_policy``: one key for every engine's prefix cache, one-line errors
where it cannot act, the old ``scheduler.eviction_policy`` named with its new name, and the
factory handing the policy to each engine's allocator."""

from __future__ import annotations

import pytest
from scheduler_cases import assert_round_trips, config, config_error

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
from kvsim.simulator.config import load_config
from kvsim.simulator.engine.runner import make_allocator_factory


@pytest.mark.parametrize(("extra", "says"), [
    ("allocator: {eviction_policy: arc}", "allocator.eviction_policy 'arc' needs a prefix cache"),
    ("scheduler: {policy: vllm-v1}\nallocator: {eviction_policy: lfu}",
     "allocator.eviction_policy 'lfu' needs a prefix cache"),
    ("allocator: {prefix_caching: true, eviction_policy: priority}",
     "'priority' is not modelled with scheduler.policy vllm-v0"),
    ("allocator: {prefix_caching: true, eviction_policy: mru}", "allocator.eviction_policy"),
    ("scheduler: {policy: sglang, eviction_policy: lfu}",
     "scheduler.eviction_policy was renamed allocator.eviction_policy"),
    ("allocator: {kind: contiguous, eviction_policy: lfu}", "eviction_policy"),
])
def test_an_eviction_policy_where_it_cannot_act_is_a_one_line_error(tmp_path, extra, says):
    assert says in config_error(tmp_path, extra)


@pytest.mark.parametrize(("extra", "cls", "policy"), [
    ("scheduler: {policy: vllm-v1}\nallocator: {prefix_caching: true, eviction_policy: arc}",
     V1PrefixCacheAllocator, "arc"),
    ("scheduler: {policy: sglang}\nallocator: {eviction_policy: priority}", RadixCacheAllocator, "priority"),
    ("allocator: {prefix_caching: true, eviction_policy: lfu}", PagedAllocator, "lfu"),
    ("scheduler: {policy: vllm-v1}\nallocator: {prefix_caching: true}", V1PrefixCacheAllocator, "lru"),
])
def test_each_engine_gets_the_policy_and_the_config_round_trips(tmp_path, extra, cls, policy):
    cfg, _ = load_config(config(tmp_path, extra))
    assert cfg.allocator.eviction_policy == policy
    alloc = make_allocator_factory(cfg)()
    assert type(alloc) is cls
    if cls is V1PrefixCacheAllocator:
        assert alloc.eviction == policy and (alloc._order is None) == (policy == "lru")
    elif cls is RadixCacheAllocator:
        assert alloc.tree.eviction == policy
    else:
        assert alloc._cache_order is not None and alloc._cache_order.policy == policy
    assert_round_trips(cfg, tmp_path)
