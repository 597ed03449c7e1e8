"""Rules of the fast cache tier (``policies.tiers.cache_tier.CacheTier``) that the differential
test against the plain tier cannot see, because both sides agree on them or never reach
them: the refusal of a negative capacity, the defaults (LRU; a use that names no priority
raises none), and ``check`` accepting a legal tree (a parent with two children).

Written for the survivors of the tier's mutation campaign (mutation/README.md); each test
fails under the mutant named in its docstring."""

from __future__ import annotations

import pytest

from kvsim.policies.indexes.eviction_order import EvictionOrder
from kvsim.policies.tiers.cache_tier import CacheTier, QueueOrder


def test_a_negative_capacity_is_refused_with_the_tier_name_and_the_value():
    """One line naming the tier, what is allowed and what was given (``__init__`` mutant 5
    dropped the message)."""
    with pytest.raises(ValueError, match=r"^tier 'disk': capacity must be >= 0 blocks, got -1$"):
        CacheTier("disk", -1)


def test_the_default_eviction_policy_is_lru_and_the_tier_names_its_policy():
    """Capacity 2: store a, b (ticks 1, 2), use a (3), store c: LRU evicts b. The default
    spelled any other way ("LRU", "XXlruXX") is no policy name and is refused (``__init__``
    mutants 1, 2); the tier keeps the name it was given (mutant 8 forgot it)."""
    tier = CacheTier("cpu", 2)
    assert tier.eviction == "lru"
    tier.store(["a", "b"], [None, None], 0.0, [0, 0])
    tier.use(["a"])
    assert tier.store(["c"], [None], 0.0, [0]) == (["c"], [("b", None, 0)])
    assert CacheTier("cpu", 2, "lfu").eviction == "lfu"


def test_a_use_without_a_priority_leaves_the_stored_priority():
    """``use(keys)`` with no priority is a use at priority 0, which raises nothing: the entry
    keeps priority 0 in the tier's books, in the order, and in what its eviction reports
    (``use`` mutant 1 made the default 1). A use at priority 3 does raise it."""
    tier = CacheTier("cpu", 1, "priority")
    tier.store(["a"], [None], 0.0, [0])
    tier.use(["a"])
    assert tier.meta["a"] == (None, 0) and tier.order.entries["a"].priority == 0
    assert tier.store(["b"], [None], 0.0, [0]) == (["b"], [("a", None, 0)])
    tier.use(["b"], 3)
    assert tier.meta["b"] == (None, 3)
    assert tier.store(["c"], [None], 0.0, [0]) == (["c"], [("b", None, 3)])


def test_check_accepts_a_parent_with_two_children_in_the_tier():
    """Two requests that share block a and then differ store a -> b and a -> c: a has two
    children in the tier, and ``check`` must count both (``check`` mutant 11 counted one
    child per parent and called a legal tier corrupt). Neither child's eviction frees a."""
    tier = CacheTier("cpu", 3, "priority")
    tier.store(["a", "b"], [None, "a"], 0.0, [0, 0])
    tier.store(["c"], ["a"], 0.0, [0])
    assert tier.children == {"a": 2}
    tier.check()
    _, evicted = tier.store(["d"], [None], 0.0, [0])
    assert evicted == [("b", "a", 0)] and tier.children == {"a": 1}
    tier.check()
    tier.children["a"] = 2  # and a wrong count is still caught
    with pytest.raises(AssertionError, match="tier cpu: child counts are not exact"):
        tier.check()


@pytest.mark.parametrize(("policy", "fast"), [("lru", True), ("fifo", True), ("lfu", False), ("arc", False),
                                              ("priority", False)])
def test_lru_and_fifo_tiers_keep_the_constant_time_queue(policy, fast):
    """A tier stores and evicts a block at a time, so LRU and FIFO (every entry evictable,
    victims in insertion or use order) keep an ordered dict, O(1) per operation; the other
    policies need the general heap order. Both give the same victims (the differential test
    against the plain tier), so only the choice itself can show a slip back to the heap
    (``__init__`` mutants 10, 14 to 17)."""
    tier = CacheTier("cpu", 2, policy)
    assert isinstance(tier.order, QueueOrder if fast else EvictionOrder)
