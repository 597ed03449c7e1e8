"""The rules of ``policies.indexes.eviction_order`` one at a time: what its defaults and errors say,
what ``check`` reports when its books are corrupted, what ``copy`` (a radix split) carries
over, how ties and default priorities fall, how far ARC's target ``p`` moves on a ghost hit
(worked by hand in each docstring), and when the heap sweeps its stale items.

``test_eviction_order.py`` compares whole random streams with the plain model; these tests
pin the details such streams rarely reach (a ratio of ghost lists that is not a whole
number, a ghost evicted twice, a copy that ties with its source, an exact sweep point).
"""

from __future__ import annotations

import heapq
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES, EvictionOrder
from kvsim.policies.reference.eviction import PlainEvictionOrder


def _raises(exc: type[Exception], message: str):
    """Expect ``exc`` with exactly ``message`` (the whole one-line text, nothing more)."""
    return pytest.raises(exc, match=f"^{re.escape(message)}$")


# --- construction and input errors ------------------------------------------------------------
def test_the_default_order_is_lru_with_no_capacity():
    """``EvictionOrder()`` is the plain LRU order of a cache with no ARC capacity: capacity 0
    is allowed (only ARC reads it), so it must not be refused."""
    o = EvictionOrder()
    assert o.policy == "lru" and o.capacity == 0
    assert EvictionOrder("arc", 0).capacity == 0


def test_bad_arguments_are_refused_in_one_line():
    with _raises(ValueError, "capacity must be >= 0, got -1"):
        EvictionOrder("lru", -1)
    with _raises(ValueError, "eviction policy must be one of lru, lfu, fifo, arc, priority, "
                             "got 'mru'"):
        EvictionOrder("mru", 4)
    o = EvictionOrder("lru", 4)
    o.insert("a", 1)
    with _raises(ValueError, "'a' is already in the eviction order"):
        o.insert("a", 2)


# --- check(): each invariant's own message ------------------------------------------------------
def _filed_lru() -> EvictionOrder:
    o = EvictionOrder("lru", 4)
    o.insert("a", 1)
    o.offer("a")
    o.check()
    return o


def _filed_arc(capacity: int = 2) -> EvictionOrder:
    o = EvictionOrder("arc", capacity)
    o.insert("a", 1)
    o.offer("a")
    o.check()
    return o


def test_check_names_a_drifted_filed_count():
    o = _filed_lru()
    o._filed += 1
    with _raises(AssertionError, "filed count drifted"):
        o.check()


def test_check_names_an_entry_filed_twice():
    o = _filed_lru()
    heapq.heappush(o._heaps[0], o._heaps[0][0])  # the live item again
    with _raises(AssertionError, "'a' filed twice"):
        o.check()


def test_check_names_an_entry_filed_under_a_stale_key():
    """Changing a filed entry's recency without filing it again leaves its heap item under
    the old key: the heap would evict it out of order."""
    o = _filed_lru()
    o.entries["a"].last = 99
    with _raises(AssertionError, "'a' filed under a stale key"):
        o.check()


def test_check_names_an_entry_in_the_wrong_arc_heap():
    o = _filed_arc()
    o.entries["a"].arc_list = 2  # in T2's books, filed in T1's heap
    with _raises(AssertionError, "'a' in the wrong heap"):
        o.check()


def test_check_names_a_filed_entry_missing_from_the_heaps():
    o = _filed_lru()
    o._heaps[0].clear()
    with _raises(AssertionError, "a filed entry is missing from the heaps"):
        o.check()


def test_check_names_drifted_arc_list_sizes():
    o = _filed_arc()
    o.t_sizes[1] += 1
    with _raises(AssertionError, "ARC list sizes drifted"):
        o.check()
    o.t_sizes[1] -= 1
    o.t_sizes[2] -= 1
    with _raises(AssertionError, "ARC list sizes drifted"):
        o.check()


@pytest.mark.parametrize("p", [-1, 3])
def test_check_names_an_arc_target_out_of_range(p):
    """``p`` lives in [0, capacity] (capacity 2 here)."""
    o = _filed_arc(capacity=2)
    o.p = p
    with _raises(AssertionError, "ARC target out of range"):
        o.check()


def test_check_names_a_ghost_list_over_capacity():
    o = _filed_arc(capacity=2)
    o.ghosts[2].update(dict.fromkeys("xyz"))
    with _raises(AssertionError, "a ghost list outgrew the capacity"):
        o.check()


def test_check_accepts_a_target_at_the_capacity():
    """Capacity 1: x is evicted from T1 (B1 = [x]) and cached again, a B1 ghost hit:
    p = min(1, 0 + max(1, |B2| // |B1|)) = min(1, 0 + max(1, 0 // 1)) = 1, the capacity itself,
    which is in range. A second round stays at the cap: x evicted from T2 (the only list with
    an entry) into B2, then a B2 hit: p = max(0, 1 - max(1, 0 // 1)) = 0."""
    o = EvictionOrder("arc", 1)
    o.insert("x", 1)
    o.offer("x")
    assert o.evict() == "x"
    o.insert("x", 2)
    assert o.p == 1 == o.capacity
    o.check()
    o.offer("x")
    assert o.evict() == "x" and list(o.ghosts[2]) == ["x"]
    o.insert("x", 3)
    assert o.p == 0
    o.check()


# --- ties and default priorities ----------------------------------------------------------------
# Ties between a copy (a radix split) and the other entries: (policy, (key, time) inserted in
# order, (copy, source), offer order, victims in order).
COPY_TIES = {
    # b, a and then c (a copy of b) all last used at t=1: LRU keys tie, so the insertion order
    # decides (b, a, c), not the order the cache offered them in (c, a, b).
    "lru-insertion-order": ("lru", [("b", 1), ("a", 1)], ("c", "b"), "cab", ["b", "a", "c"]),
    # a created at t1, b at t2; c is split from a, so it was created at t1 as well (it holds
    # tokens cached then): FIFO evicts a, c, b (a and c tie at 1; a was inserted first).
    "fifo-source-creation": ("fifo", [("a", 1), ("b", 2)], ("c", "a"), "bca", ["a", "c", "b"]),
}


@pytest.mark.parametrize(("policy", "inserts", "copy", "offers", "victims"), COPY_TIES.values(),
                         ids=COPY_TIES)
def test_ties_with_a_copy_go_by_its_facts_then_the_insertion_order(policy, inserts, copy, offers,
                                                                   victims):
    """See ``COPY_TIES``: whatever order the cache offers them in."""
    o = EvictionOrder(policy, 4)
    for key, now in inserts:
        o.insert(key, now)
    o.copy(*copy)
    for k in offers:
        o.offer(k)
    assert [o.evict() for _ in victims] == victims


@pytest.mark.parametrize("calls", [
    [("insert", "a", 1), ("insert", "b", 2, 0)],  # (0, last 1) before (0, last 2)
    [("insert", "a", 1, 0), ("insert", "b", 2, 0), ("hit", "a", 3), ("touch", "b", 4, 0)],
    [("insert", "a", 1, 0), ("insert", "b", 2, 0), ("touch", "a", 3), ("touch", "b", 4, 0)],
], ids=["insert", "hit", "touch"])
def test_insert_hit_and_touch_default_to_priority_zero(calls):
    """Priority policy, every entry at priority 0 whether given or defaulted, so LRU decides
    (a, last used first, goes). Each call that leaves ``priority`` out (the one call named
    in the id: ``calls`` are (method, key, time[, priority])) must not raise the entry above
    an explicit 0."""
    o = EvictionOrder("priority", 4)
    for method, *args in calls:
        getattr(o, method)(*args)
    o.offer("a")
    o.offer("b")
    assert o.evict() == "a"
    assert o.entries["b"].priority == 0


def test_a_hit_counts_one_use_and_raises_the_priority_only_upward():
    o = EvictionOrder("lfu", 4)
    o.insert("a", 1, priority=3)
    assert o.entries["a"].uses == 1
    o.hit("a", 2, priority=1)
    o.hit("a", 3, priority=5)
    e = o.entries["a"]
    assert (e.uses, e.last, e.priority, e.created) == (3, 3, 5, 1)
    o.touch("a", 4, priority=2)
    assert (e.uses, e.last, e.priority) == (3, 4, 5)


def test_withdraw_of_an_unfiled_entry_changes_nothing():
    o = EvictionOrder("lru", 4)
    o.insert("a", 1)
    o.withdraw("a")
    assert o.num_filed == 0
    o.offer("a")
    o.offer("a")  # offered twice: filed once
    assert o.num_filed == 1
    o.withdraw("a")
    o.withdraw("a")
    assert o.num_filed == 0 and o.evict() is None
    o.check()


# --- copy: a radix split ------------------------------------------------------------------------
def test_copy_carries_the_facts_of_the_entry_it_splits_from():
    """a: cached at t1 with priority 2, reused at t3 (so 2 uses, in T2). A split makes b and
    c like a: same creation, recency, uses, priority and ARC list; b is remembered by its own
    key, c by the ghost given; each is a new insertion (numbers 2 and 3)."""
    o = EvictionOrder("arc", 8)
    o.insert("a", 1, priority=2)
    o.hit("a", 3, priority=1)
    o.copy("b", "a")
    o.copy("c", "a", ghost="g")
    for k, seq, ghost in (("b", 2, "b"), ("c", 3, "g")):
        e = o.entries[k]
        assert (e.seq, e.created, e.last, e.uses, e.priority, e.arc_list, e.ghost) == (
            seq, 1, 3, 2, 2, 2, ghost), k
    assert o.t_sizes[1:] == [0, 3]
    o.check()
    # All three tie on recency 3 in T2: inserted first goes first, each remembered in B2.
    for k in "cba":
        o.offer(k)
    assert [o.evict(), o.evict(), o.evict()] == ["a", "b", "c"]
    assert list(o.ghosts[2]) == ["a", "b", "g"]
    o.check()


def test_copy_of_a_t1_entry_stays_in_t1():
    o = EvictionOrder("arc", 8)
    o.insert("a", 1)
    o.copy("b", "a")
    assert o.entries["b"].arc_list == 1 and o.t_sizes[1:] == [2, 0]
    o.check()


# --- ARC ghosts and the target p -----------------------------------------------------------------
def test_ghosts_computed_at_eviction_override_the_inserted_ghost():
    """``ghost_of`` (the radix tree's: a node's tokens when it goes) is what B1 keeps, not the
    ghost the entry was inserted with."""
    o = EvictionOrder("arc", 4, ghost_of=lambda k: ("evicted", k))
    o.insert("a", 1, ghost="inserted")
    o.offer("a")
    assert o.evict() == "a"
    assert list(o.ghosts[1]) == [("evicted", "a")]


def test_a_ghost_evicted_again_becomes_the_newest():
    """a and b share the ghost g (two nodes for the same tokens, cached before either was
    evicted); c has ghost h. All in T1, p = 0, evicted by recency a (t1), c (t2), b (t3):
    B1 = [g], then [g, h], then g again: it moves to the newest end, [h, g], so a full B1
    forgets h before g."""
    o = EvictionOrder("arc", 3)
    o.insert("a", 1, ghost="g")
    o.insert("c", 2, ghost="h")
    o.insert("b", 3, ghost="g")
    for k in "abc":
        o.offer(k)
    assert [o.evict(), o.evict(), o.evict()] == ["a", "c", "b"]
    assert list(o.ghosts[1]) == ["h", "g"]
    o.check()


def _to_ghosts(o: EvictionOrder, keys: str, now: int, reused: bool) -> int:
    """Cache ``keys`` (reused: hit once, so in T2), then evict them all into B1 (T1 entries)
    or B2 (T2 entries, evicted from T2 because T1 has nothing evictable); returns the clock."""
    for k in keys:
        now += 1
        o.insert(k, now)
        if reused:
            now += 1
            o.hit(k, now)
    for k in keys:
        o.offer(k)
    assert [o.evict() for _ in keys] == list(keys)
    return now


def test_a_b1_hit_grows_p_by_the_whole_ratio_of_the_ghost_lists():
    """Capacity 10. a, b, c are reused and evicted from T2: B2 = [a, b, c]; d, e are used
    once and evicted from T1: B1 = [d, e]; p = 0 throughout (no ghost hit yet). d is cached
    again: a B1 hit, p = min(10, 0 + max(1, |B2| // |B1|)) = max(1, 3 // 2) = 1, a whole
    number (3 / 2 would make it 1.5), and d starts in T2."""
    o = EvictionOrder("arc", 10)
    now = _to_ghosts(o, "abc", 0, reused=True)
    now = _to_ghosts(o, "de", now, reused=False)
    assert (list(o.ghosts[1]), list(o.ghosts[2]), o.p) == (["d", "e"], ["a", "b", "c"], 0)
    o.insert("d", now + 1)
    assert o.p == 1 and type(o.p) is int
    assert o.entries["d"].arc_list == 2 and list(o.ghosts[1]) == ["e"]
    o.check()


def test_a_b2_hit_shrinks_p_by_the_whole_ratio_of_the_ghost_lists():
    """Capacity 10. a, b reused and evicted from T2: B2 = [a, b]; d, e, f, g, h used once and
    evicted from T1: B1 = [d, e, f, g, h]. d cached again (B1 hit): p = 0 + max(1, 2 // 5) = 1;
    e cached again: p = 1 + max(1, 2 // 4) = 2; now B1 = [f, g, h]. a cached again, a B2
    hit: p = max(0, 2 - max(1, |B1| // |B2|)) = 2 - max(1, 3 // 2) = 1 (not 2 - 1.5, and
    not 2 - 2: the step is at least 1, not at least 2), and a starts in T2."""
    o = EvictionOrder("arc", 10)
    now = _to_ghosts(o, "ab", 0, reused=True)
    now = _to_ghosts(o, "defgh", now, reused=False)
    o.insert("d", now + 1)
    assert o.p == 1
    o.insert("e", now + 2)
    assert o.p == 2 and list(o.ghosts[1]) == ["f", "g", "h"]
    o.insert("a", now + 3)
    assert o.p == 1 and type(o.p) is int
    assert o.entries["a"].arc_list == 2 and list(o.ghosts[2]) == ["b"]
    o.check()


# --- the heap sweep -----------------------------------------------------------------------------
def test_the_heap_is_swept_exactly_when_it_outgrows_two_items_per_entry_plus_64():
    """Two entries filed (2 heap items); each touch of a files it again (one more item, the
    old one stale). The sweep runs when the heap holds more than 2 * 2 + 64 = 68 items: after
    66 touches it holds 68 (not swept: sweeping is a pass over the heap, so sweeping earlier
    costs time for nothing), after the 67th it would hold 69 and is swept down to the 2 live
    items. The order still evicts the right entries afterwards."""
    o = EvictionOrder("lru", 4)
    o.insert("a", 0)
    o.insert("b", 0)
    o.offer("a")
    o.offer("b")
    sizes = []
    for t in range(1, 68):
        o.touch("a", t)
        sizes.append(len(o._heaps[0]))
    assert sizes == list(range(3, 69)) + [2]
    o.check()
    assert [o.evict(), o.evict()] == ["b", "a"]


# --- every entry's books against the plain model ----------------------------------------------
OP = st.tuples(st.sampled_from(["insert", "copy", "hit", "touch", "offer", "evict", "remove"]),
               st.integers(0, 7), st.integers(0, 7), st.one_of(st.none(), st.integers(0, 3)),
               st.one_of(st.none(), st.integers(0, 2)))


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(OP, min_size=5, max_size=60))
def test_each_entrys_facts_are_the_plain_models(policy, ops):
    """Random streams with splits (``copy``), defaulted priorities and ghosts: every entry's
    insertion number, creation, recency, uses, priority and ghost equal the plain model's
    facts (and under ARC its list), not merely the victims. Everything offered is evictable
    here, so the plain model's victim is taken among the offered keys."""
    fast, plain = EvictionOrder(policy, 3), PlainEvictionOrder(policy, 3)
    offered: set[int] = set()
    for now, (op, k, like, prio, ghost) in enumerate(ops, start=1):
        present = k in plain.facts
        pr = {} if prio is None else {"priority": prio}
        if op == "insert" and not present:
            fast.insert(k, now, ghost=ghost, **pr)
            plain.insert(k, now, ghost=ghost, **pr)
        elif op == "copy" and not present and like in plain.facts:
            fast.copy(k, like, ghost)
            plain.copy(k, like, ghost)
        elif op == "hit" and present:
            fast.hit(k, now, **pr)
            plain.hit(k, now, **pr)
        elif op == "touch" and present:
            fast.touch(k, now, **pr)
            plain.touch(k, now, **pr)
        elif op == "offer" and present:
            fast.offer(k)
            offered.add(k)
        elif op == "remove" and present:
            fast.remove(k)
            plain.remove(k)
            offered.discard(k)
        elif op == "evict":
            got = fast.evict()
            assert got == plain.victim(sorted(offered))
            offered.discard(got)
        fast.check()
        assert set(fast.entries) == set(plain.facts)
        for key, e in fast.entries.items():
            f = plain.facts[key]
            assert (e.seq, e.created, e.last, e.uses, e.priority, e.ghost) == (
                f.number, f.created, f.last, f.uses, f.priority, f.ghost), key
            if policy == "arc":
                assert e.arc_list == f.arc_list, key
        if policy == "arc":
            assert fast.p == plain.p
            assert list(fast.ghosts[1]) == plain.b1 and list(fast.ghosts[2]) == plain.b2
