"""The eviction orders (``policies.indexes.eviction_order``) against the plain model
(``policies.reference.eviction``) on random streams, and one hand-worked case per policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES, EvictionOrder
from kvsim.policies.reference.eviction import PlainEvictionOrder

# Weighted so that several entries are usually filed when an eviction comes.
OP_NAMES = ["insert"] * 4 + ["offer"] * 4 + ["hit"] * 3 + ["touch"] * 2 + ["evict"] * 2 + [
    "withdraw", "block", "remove"]
OPS = st.lists(st.tuples(st.sampled_from(OP_NAMES), st.integers(0, 11), st.integers(0, 3)),
               min_size=20, max_size=150)


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
@settings(max_examples=150, deadline=None)
@given(ops=OPS, capacity=st.integers(1, 6), ghosts_by_eviction=st.booleans())
def test_fast_order_evicts_what_the_plain_model_evicts(policy, ops, capacity, ghosts_by_eviction):
    """Random insert / hit / touch / offer / withdraw / lazy block / remove / evict streams:
    the fast order's every victim is the plain scan's, and its books stay exact. Ghosts are
    the keys, or computed at eviction (``ghost_of``, as the radix tree does; ``k % 5``: keys
    share ghosts, so a ghost hit can come from another key)."""
    ghost_of = (lambda k: k % 5) if ghosts_by_eviction else None
    fast, plain = EvictionOrder(policy, capacity, ghost_of), PlainEvictionOrder(policy, capacity, ghost_of)
    offered: set[int] = set()
    blocked: set[int] = set()  # offered, then not evictable without a withdraw (the radix tree's way)
    now = 0
    for op, k, prio in ops:
        now += 1
        present = k in plain.facts
        if op == "insert" and not present:
            ghost = k % 5 if ghosts_by_eviction else None
            fast.insert(k, now, prio, ghost)
            plain.insert(k, now, prio, ghost)
        elif op == "hit" and present:
            fast.hit(k, now, prio)
            plain.hit(k, now, prio)
        elif op == "touch" and present:
            fast.touch(k, now, prio)
            plain.touch(k, now, prio)
        elif op == "offer" and present:
            fast.offer(k)
            offered.add(k)
            blocked.discard(k)
        elif op == "withdraw" and present:
            fast.withdraw(k)
            offered.discard(k)
            blocked.discard(k)
        elif op == "block" and k in offered:
            blocked.add(k)
        elif op == "remove" and present:
            fast.remove(k)
            plain.remove(k)
            offered.discard(k)
            blocked.discard(k)
        elif op == "evict":
            got = fast.evict(lambda key: key not in blocked)
            want = plain.victim(sorted(offered - blocked))
            assert got == want
            offered.discard(got)
        fast.check()
        assert set(fast.entries) == set(plain.facts)
        if policy == "arc":
            assert fast.p == plain.p
            assert list(fast.ghosts[1]) == plain.b1 and list(fast.ghosts[2]) == plain.b2


def _order(policy: str, capacity: int = 8) -> EvictionOrder:
    return EvictionOrder(policy, capacity)


# a cached at t1 and b at t2, then the uses listed (method, key, time); both offered: the victim.
TWO_ENTRY_CASES = {
    # a reused at t3, b passed (touched) at t4. LRU: a was last used at 3, b at 4, so a goes.
    "lru-recency": ("lru", [("hit", "a", 3), ("touch", "b", 4)], "a"),
    # The same uses under LFU: a has 2 uses, b 1 (a touch is no use), so b goes.
    "lfu-uses": ("lfu", [("hit", "a", 3), ("touch", "b", 4)], "b"),
    # LFU ties go by recency: both used twice, a last at 4, b at 3, so b goes.
    "lfu-tie": ("lfu", [("hit", "b", 3), ("hit", "a", 4)], "b"),
    # FIFO ignores use: a was inserted first; reusing it at t3 does not save it (LRU: b).
    "fifo": ("fifo", [("hit", "a", 3)], "a"),
}


@pytest.mark.parametrize(("policy", "uses", "victim"), TWO_ENTRY_CASES.values(), ids=TWO_ENTRY_CASES)
def test_each_policy_picks_its_victim_of_two(policy, uses, victim):
    """One hand-worked case per rule (see ``TWO_ENTRY_CASES``)."""
    o = _order(policy)
    o.insert("a", 1)
    o.insert("b", 2)
    for method, key, now in uses:
        getattr(o, method)(key, now)
    o.offer("a")
    o.offer("b")
    assert o.evict() == victim


def test_priority_goes_before_recency():
    """a (priority 0) was used last, at t3, b (priority 5) at t2: priority evicts a, LRU b.
    Among equal priorities the least recently used goes (c at t4 vs a at t3: a)."""
    o = _order("priority")
    o.insert("b", 1, priority=5)
    o.touch("b", 2)
    o.insert("a", 3, priority=0)
    o.insert("c", 4, priority=0)
    for k in "abc":
        o.offer(k)
    assert [o.evict(), o.evict(), o.evict()] == ["a", "c", "b"]


def test_arc_protects_reused_entries_and_adapts():
    """a cached at t1 and reused at t2 (so in T2); b, c cached at t3, t4 (T1); p = 0.
    LRU would evict a (last used at 2). ARC: |T1| = 2 > p = 0, so T1's least recent, b,
    goes (ghost B1 = [b]). b is cached again at t5: a B1 ghost hit, so p grows by
    max(1, |B2| // |B1|) = max(1, 0 // 1) = 1 and b starts in T2. Now |T1| = 1 (c) is not
    > p = 1, so T2's least recent goes: a (last 2; b's last is 5), and B2 = [a]."""
    lru = _order("lru")
    for k, t in (("a", 1), ("b", 3), ("c", 4)):
        lru.insert(k, t)
    lru.hit("a", 2)
    for k in "abc":
        lru.offer(k)
    assert lru.evict() == "a"

    o = _order("arc")
    o.insert("a", 1)
    o.hit("a", 2)
    o.insert("b", 3)
    o.insert("c", 4)
    for k in "abc":
        o.offer(k)
    assert o.evict() == "b"
    assert list(o.ghosts[1]) == ["b"] and o.p == 0
    o.insert("b", 5)
    o.offer("b")
    assert o.p == 1 and o.entries["b"].arc_list == 2
    assert o.evict() == "a"
    assert list(o.ghosts[2]) == ["a"]
    o.check()


def test_arc_b2_ghost_hit_shrinks_the_target():
    """p = 1 after a B1 ghost hit; then a B2 ghost hit lowers it by max(1, |B1| // |B2|)."""
    o = _order("arc", capacity=4)
    o.insert("x", 1)
    o.offer("x")
    assert o.evict() == "x"  # T1 -> B1
    o.insert("x", 2)  # B1 hit: p = 1, x in T2
    o.offer("x")
    assert o.p == 1 and o.evict() == "x"  # only T2 has an entry -> B2
    o.insert("x", 3)  # B2 hit: p = max(0, 1 - max(1, 0 // 1)) = 0
    assert o.p == 0 and o.entries["x"].arc_list == 2


def test_ghost_lists_are_bounded_by_the_capacity():
    o = _order("arc", capacity=2)
    for t, k in enumerate("abcd"):
        o.insert(k, t)
        o.offer(k)
        assert o.evict() == k
    assert list(o.ghosts[1]) == ["c", "d"]


def test_withdrawn_and_unfit_entries_are_not_victims():
    o = _order("lru")
    o.insert("a", 1)
    o.insert("b", 2)
    o.offer("a")
    o.offer("b")
    o.withdraw("a")
    assert o.evict(lambda k: k != "b") is None  # b is skipped (and unfiled), a was withdrawn
    assert o.num_filed == 0 and len(o) == 2
    o.offer("a")
    assert o.evict() == "a"


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="lru, lfu, fifo, arc, priority"):
        EvictionOrder("mru")
    with pytest.raises(ValueError, match="lru, lfu, fifo, arc, priority"):
        PlainEvictionOrder("mru", 1)


def test_the_heap_stays_bounded_under_churn():
    """Touching a filed entry files it again; stale items are swept, so the heap stays
    O(entries) (else a long run's heap grows with every touch)."""
    o = _order("lru")
    o.insert("a", 0)
    o.offer("a")
    for t in range(1, 1000):
        o.touch("a", t)
    assert len(o._heaps[0]) <= 2 * len(o) + 65
    o.check()


def test_uncached_first_queue_takes_uncached_blocks_before_the_policys_victims():
    """Blocks 0-3 free and uncached; blocks 4 and 5 hold cached keys "x" (2 uses) and "y"
    (1 use) and are freed: the queue gives 0-3 in order, then LFU's victim y (block 5), then
    x; a hit on a free cached block takes it out of the middle."""
    from kvsim.policies.indexes.free_block_queue import UncachedFirstQueue

    order = EvictionOrder("lfu", 8)
    key_of, block_of = {4: "x", 5: "y"}, {"x": 4, "y": 5}
    q = UncachedFirstQueue(range(4), order, key_of, block_of)
    order.insert("x", 1)
    order.hit("x", 2)
    order.insert("y", 3)
    q.extend([4, 5])
    assert len(q) == 6 and 5 in q and list(q)[:4] == [0, 1, 2, 3]
    assert list(q.popleft_many(5)) == [0, 1, 2, 3, 5]
    q.append(0)  # uncached again: before x
    assert q.popleft() == 0
    q.remove(4)  # a hit on the free cached block x
    assert len(q) == 0 and 4 not in q
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(4)
