"""The plain cache tier (``policies.reference.tier``), by hand-worked cases: which entry each
eviction policy evicts, leaf-only eviction under ``priority``, dropped stores, ready times.

Notation: keys are letters; a tier's clock ticks once per stored key and per used key, so
``store a, b`` then ``use b`` gives a (stored 1), b (stored 2, used 3)."""

from __future__ import annotations

import math

import pytest

from kvsim.policies.reference.tier import PlainTier


def stored(tier: PlainTier, *keys: str, parents=None, ready_s: float = 0.0, priority: int = 0):
    """Store ``keys`` (independent chains unless ``parents`` is given) at one ``priority``;
    return (stored keys, evicted keys)."""
    got, evicted = tier.store(list(keys), parents or [None] * len(keys), ready_s, [priority] * len(keys))
    return got, [key for key, _, _ in evicted]


def uses_then_victim(policy: str) -> str:
    """Capacity 2: store a, b (ticks 1, 2); use b (3), b (4), a (5); then store c: the victim.
    lru: b was last used at 4, a at 5 -> b. lfu: a has 2 uses, b 3 -> a. fifo: a was
    stored first -> a. arc: both are in T2 (used again), |T1| = 0 <= p, T2's least recent -> b."""
    tier = PlainTier("cpu", 2, policy)
    stored(tier, "a", "b")
    tier.use(["b"])
    tier.use(["b"])
    tier.use(["a"])
    got, evicted = stored(tier, "c")
    assert got == ["c"] and len(evicted) == 1
    tier.check()
    return evicted[0]


@pytest.mark.parametrize(("policy", "victim"), [("lru", "b"), ("lfu", "a"), ("fifo", "a"), ("arc", "b")])
def test_each_policy_evicts_its_own_victim(policy, victim):
    assert uses_then_victim(policy) == victim


def test_priority_evicts_the_lowest_priority_leaf_only():
    """Capacity 3: a chain a -> b (priority 0) and c (priority 1). Storing d (priority 2) may
    evict only the leaves b and c: b has the lowest priority. Then e: a is a leaf now
    (priority 0) and goes, although under lru a (stored first, never used) would have gone
    first already."""
    tier = PlainTier("cpu", 3, "priority")
    stored(tier, "a", "b", parents=[None, "a"])
    stored(tier, "c", priority=1)
    assert tier.children("a") == 1 and not tier.may_go("a") and tier.may_go("b")
    assert stored(tier, "d", priority=2) == (["d"], ["b"])
    assert stored(tier, "e", priority=2) == (["e"], ["a"])
    tier.check()
    lru = PlainTier("cpu", 3, "lru")
    stored(lru, "a", "b", parents=[None, "a"])
    stored(lru, "c", priority=1)
    assert stored(lru, "d", priority=2) == (["d"], ["a"])  # lru evicts a chain's middle


def test_priority_keeps_a_used_high_priority_leaf_and_evictions_carry_parent_and_priority():
    """A use raises an entry's priority to the loading request's: b (stored at 0, used at 2)
    outlives c (stored at 1); each evicted entry comes back as (key, parent, priority), b's
    priority being the highest that touched it."""
    tier = PlainTier("cpu", 2, "priority")
    stored(tier, "b", parents=["a"])
    stored(tier, "c", priority=1)
    tier.use(["b"], priority=2)
    tier.use(["b"], priority=1)
    assert tier.meta == {"b": ("a", 2), "c": (None, 1)}
    assert tier.store(["d"], [None], 0.0, [3]) == (["d"], [("c", None, 1)])
    assert tier.store(["e"], ["d"], 0.0, [3]) == (["e"], [("b", "a", 2)])


def test_a_tier_of_capacity_zero_drops_every_store():
    tier = PlainTier("cpu", 0)
    assert stored(tier, "a", "b") == ([], [])
    assert (len(tier), tier.dropped_blocks, tier.stored_blocks, tier.evictions) == (0, 2, 0, 0)
    tier.check()


def test_a_store_is_dropped_when_no_leaf_may_go():
    """Under ``priority`` only leaves may go. Real chains always have one; two entries that
    name each other as parent have none, so the store of c is dropped and nothing moves."""
    tier = PlainTier("cpu", 2, "priority")
    stored(tier, "x", "y", parents=["y", "x"])
    assert stored(tier, "c") == ([], [])
    assert tier.dropped_blocks == 1 and set(tier.entries) == {"x", "y"}
    lru = PlainTier("cpu", 2, "lru")  # any entry may go under the other policies
    stored(lru, "x", "y", parents=["y", "x"])
    assert stored(lru, "c") == (["c"], ["x"])


def test_a_run_evicts_then_inserts_one_key_at_a_time():
    """Capacity 2 holding a, b; storing the run c, d evicts a for c, then b for d (lru), and a
    key of the run already held is skipped."""
    tier = PlainTier("cpu", 2)
    stored(tier, "a", "b")
    assert stored(tier, "b", "c", "d") == (["c", "d"], ["a", "b"])
    assert tier.store(["e", "f"], [None, "e"], 0.0, [0, 2]) == (["e", "f"], [("c", None, 0), ("d", None, 0)])
    assert tier.meta == {"e": (None, 0), "f": ("e", 2)}  # one priority per key
    assert (tier.stored_blocks, tier.evictions) == (6, 4)


def test_entries_are_ready_when_their_store_ends_and_a_present_key_is_not_refreshed():
    tier = PlainTier("cpu", 4)
    stored(tier, "a", "b", ready_s=1.0)
    assert "a" in tier and not tier.ready("a", 0.5) and tier.ready("a", 1.0)
    assert tier.ready_run(["a", "b", "c"], 0.5) == 0
    assert tier.ready_run(["a", "b", "c"], 1.0) == 2
    assert tier.ready_run(["c", "a"], 2.0) == 0  # leading keys only
    assert stored(tier, "a", ready_s=5.0) == ([], [])  # held: nothing happens
    assert tier.entries["a"].ready_s == 1.0 and tier.stored_blocks == 2 and tier.clock == 2
    stored(tier, "c", ready_s=math.inf)  # in flight, time unknown yet: takes room, not ready
    assert len(tier) == 3 and not tier.ready("c", 1e9)


def test_use_counts_hits_and_ticks_the_clock():
    tier = PlainTier("cpu", 4, "lfu")
    stored(tier, "a", "b")
    tier.use(["a", "b"])
    tier.use(["a"])
    assert tier.hit_blocks == 3 and tier.clock == 5
    assert tier.order.facts["a"].uses == 3 and tier.order.facts["b"].last == 4


def test_check_sees_an_overfull_tier_and_a_forgotten_order():
    tier = PlainTier("cpu", 1)
    stored(tier, "a")
    tier.capacity = 0
    with pytest.raises(AssertionError, match="over capacity"):
        tier.check()
    tier = PlainTier("cpu", 2)
    stored(tier, "a")
    del tier.order.facts["a"]
    with pytest.raises(AssertionError, match="differ"):
        tier.check()


def test_a_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="tier 'cpu': capacity must be >= 0 blocks, got -1"):
        PlainTier("cpu", -1)
