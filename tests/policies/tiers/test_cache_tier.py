"""The fast cache tier (``policies.tiers.cache_tier.CacheTier``) equals the plain one
(``policies.reference.tier.PlainTier``) on random sequences of stores, uses and lookups,
under every eviction policy; after each operation both keep their invariants (size within
capacity, every key held once with a consistent eviction order, exact child counts).

Keys are chain positions ``(chain, position)`` whose parent is ``(chain, position - 1)``, as
the prefix cache names a request's consecutive blocks; a store is a run of one chain's
positions (not always from its start: write-back and later chunks store a chain's middle,
children before their parents)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from kvsim.policies.reference.tier import PlainTier
from kvsim.policies.tiers.cache_tier import CacheTier

POLICIES = ("lru", "lfu", "fifo", "arc", "priority")
EXAMPLES = {"default": 60, "long": 2000}[os.environ.get("KVSIM_HYPOTHESIS_PROFILE", "default")]


def parent(key: tuple[int, int]) -> tuple[int, int] | None:
    chain, pos = key
    return (chain, pos - 1) if pos else None


@st.composite
def runs(draw) -> list[tuple[int, int]]:
    """One chain's consecutive positions, in order or (write-back's order) reversed."""
    chain, start = draw(st.integers(0, 2)), draw(st.integers(0, 5))
    keys = [(chain, p) for p in range(start, start + draw(st.integers(1, 4)))]
    return keys[::-1] if draw(st.booleans()) else keys


ops = st.lists(
    st.tuples(st.sampled_from(["store", "store", "use", "ready"]), runs(), st.integers(0, 2),
              st.sampled_from([0.0, 1.0, 2.0])),
    min_size=1, max_size=40,
)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(capacity=st.integers(0, 6), operations=ops)
def test_fast_tier_equals_plain_tier(policy, capacity, operations):
    fast, plain = CacheTier("cpu", capacity, policy), PlainTier("cpu", capacity, policy)
    for kind, keys, priority, t in operations:
        note(f"{kind} {keys} priority {priority} t {t}")
        if kind == "store":
            parents = [parent(k) for k in keys]
            priorities = [priority + (i % 2) for i in range(len(keys))]
            assert fast.store(keys, parents, t, priorities) == plain.store(keys, parents, t, priorities)
        elif kind == "use":
            held = [k for k in keys if k in plain]
            fast.use(held, priority)
            plain.use(held, priority)
        else:
            assert fast.ready_run(keys, t) == plain.ready_run(keys, t)
            assert [fast.ready(k, t) for k in keys] == [plain.ready(k, t) for k in keys]
        fast.check()
        plain.check()
        assert len(fast) == len(plain) <= capacity
        assert all(k in fast for k in plain.entries) and all((c, p) in plain for c, p in fast.ready_s)
        assert fast.meta == plain.meta
        for name in ("stored_blocks", "dropped_blocks", "evictions", "hit_blocks"):
            assert getattr(fast, name) == getattr(plain, name), name
        if policy == "priority":
            assert {k: fast.children.get(k, 0) for k in plain.entries} == {
                k: plain.children(k) for k in plain.entries
            }, "child counts are not exact"


def test_the_comparison_sees_a_wrong_victim():
    """The differential test above fails when the fast tier evicts another key: plant a
    different policy on one side and the same operations disagree."""
    fast, plain = CacheTier("cpu", 2, "fifo"), PlainTier("cpu", 2, "lru")
    for t in (fast, plain):
        t.store([(0, 0), (1, 0)], [None, None], 0.0, [0, 0])
        t.use([(0, 0)])
    assert fast.store([(2, 0)], [None], 0.0, [0]) != plain.store([(2, 0)], [None], 0.0, [0])


def test_a_parent_stored_after_its_child_is_not_a_leaf():
    """Write-back stores a request's tail first (its last blocks are evicted first), so a
    child can enter the tier before its parent. Under ``priority`` the parent is then no leaf:
    capacity 3 holding (0,1) then (0,0) and (1,0); storing (2,0) may evict only the leaves
    (0,1) and (1,0): (0,1), the least recent at equal priority."""
    for tier in (CacheTier("cpu", 3, "priority"), PlainTier("cpu", 3, "priority")):
        tier.store([(0, 1)], [(0, 0)], 0.0, [0])
        tier.store([(0, 0)], [None], 0.0, [0])
        tier.store([(1, 0)], [None], 0.0, [0])
        assert tier.store([(2, 0)], [None], 0.0, [0]) == ([(2, 0)], [((0, 1), (0, 0), 0)]), type(tier).__name__
