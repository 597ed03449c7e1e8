"""Radix-cache rules the brute-force model in tests/policies/indexes/test_radix_cache.py leaves open
(policies/indexes/radix_cache.py), each worked out by hand.

1. A lookup's ``limit`` holds below the first node too: a match never runs past it.
2. Eviction frees a node once: an older heap entry of an evicted node stays stale, and the
   node count follows the tree.
3. Eviction takes only what the allocation lacks.
4. A request's priority (default 0) reaches the nodes it inserts; a step that adds no whole
   page inserts nothing (it would refresh the path's access time and hits).
5. The allocator's counters (lookups, hits, duplicates), its capacity in whole pages and its
   ``usage()`` (``unshared``: every running request's tokens rounded up to whole pages).
6. ``request_tokens`` tags each kind of token so kinds never collide.
7. ``check()`` fires on the corruption each assertion names (the tests lean on it).
"""

from __future__ import annotations

import re

import pytest

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator, RadixTree, request_tokens
from kvsim.traces import Request


def test_a_match_below_the_first_node_stops_at_the_limit():
    """Cached: (1..4) then (1..8): nodes [1 2 3 4] and [5 6 7 8]. Matching (1..8) up to 6
    tokens takes the first node (4) and 2 tokens of the second: 6, splitting it at 6."""
    tree = RadixTree()
    tree.insert((1, 2, 3, 4))
    tree.insert((1, 2, 3, 4, 5, 6, 7, 8))
    hit, node = tree.match((1, 2, 3, 4, 5, 6, 7, 8), limit=6)
    assert hit == 6 and node.end == 6 and node.key == (5, 6)
    assert tree.sequences() == {(1, 2, 3, 4), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7, 8)}
    tree.check()


def test_an_evicted_node_is_freed_once_and_leaves_the_node_count():
    """(1, 2) inserted (heap entry stamp 1), then matched (re-filed, stamp 2): two entries.
    Evicting pops the stale one first (its key is older) and skips it, then the current one:
    2 tokens freed, the heap empty, the node count 1 -> 0. Asking for more frees nothing."""
    tree = RadixTree()
    tree.insert((1, 2))
    tree.match((1, 2))
    assert tree.num_nodes == 1 and len(tree._heap) == 2
    assert tree.evict(1) == 2
    assert tree.num_nodes == 0 and tree.total == 0 and tree._heap == []
    assert tree.evict(5) == 0
    assert tree.evicted_tokens == 2 and tree.root.children == {}
    tree.insert((1, 3))  # the same first token again: a new node, not touched by the stale entry
    assert tree.evict(0) == 0 and tree.sequences() == {(1, 3)}
    assert tree.num_nodes == 1 == len(tree.nodes())
    tree.check()


def test_an_allocation_evicts_only_what_it_lacks():
    """Capacity 7. Requests 0, 1, 2 finish with 2 tokens each (no hit, no duplicates):
    three evictable leaves, 1 free slot. A request computing 3 tokens lacks 2 slots: it
    evicts the oldest leaf only (2 tokens), not the 3 + 1 it would free by asking for the
    free slot too, and no slot is free afterwards."""
    a = RadixCacheAllocator(7)
    for rid in range(3):
        toks = (10 * rid, 10 * rid + 1)
        assert a.open(rid, toks, 2, 2) == 0
        assert a.extend(rid, 2)
        a.finish(rid)
    assert a.free_slots == 1 and a.tree.evictable == 6
    assert a.open(9, (7, 8, 9), 3, 3) == 0
    assert a.extend(9, 3)
    assert a.evictions == 2 and a.free_slots == 0
    assert a.tree.sequences() == {(10, 11), (20, 21)}
    a.check()


@pytest.mark.parametrize("priority, expected", [(None, 0), (5, 5)])
def test_a_requests_priority_reaches_the_nodes_it_inserts(priority, expected):
    a = RadixCacheAllocator(16, eviction="priority")
    kwargs = {} if priority is None else {"priority": priority}
    a.open(0, (1, 2, 3), 3, 3, **kwargs)
    a.extend(0, 3)
    a.finish(0)
    (node,) = a.tree.nodes()
    assert node.priority == expected
    # A later request with a higher priority that computes the same tokens raises it.
    a.open(1, (1, 2, 3, 4), 4, 4, priority=7)  # hits 3
    a.extend(1, 1)
    a.finish(1)
    assert {n.key: n.priority for n in a.tree.nodes()} == {(1, 2, 3): 7, (4,): 7}
    a.check()


@pytest.mark.parametrize("step", ["cache_unfinished", "finish"])
def test_a_step_without_a_new_whole_page_inserts_nothing(step):
    """Page size 4: request 0 caches (1..4) and finishes. Request 1 (1..4, 9, 9) hits 4 and
    computes 1 more token: no new whole page, so nothing is inserted and the cached node is
    not refreshed again (one hit from the insertion, one from request 1's lookup)."""
    a = RadixCacheAllocator(16, page_size=4)
    a.open(0, (1, 2, 3, 4), 4, 4)
    a.extend(0, 4)
    a.finish(0)
    toks = (1, 2, 3, 4, 9, 9)
    assert a.open(1, toks, 6, 6) == 4
    a.extend(1, 1)
    time = a.tree.time
    getattr(a, step)(1)
    (node,) = a.tree.nodes()
    assert a.tree.time == time and node.hits == 2
    a.check()


def test_the_allocator_counts_lookups_hits_and_duplicates():
    """Requests 0 and 1 both compute (5, 6, 7) from scratch (1 opened before 0 inserted):
    1's three tokens are duplicates when it finishes. Request 2 hits 2 (its lookup is capped
    below its 3 tokens) and computes token 7 again: 1 more. Request 3 hits 1 and computes
    (6, 7): 2 more, 6 in all."""
    a = RadixCacheAllocator(32)
    assert (a.prefix_lookups, a.prefix_hits) == (0, 0)
    a.count_lookup(10, 4)
    a.count_lookup(3, 0)
    assert (a.prefix_lookups, a.prefix_hits) == (13, 4)
    for rid in (0, 1):
        a.open(rid, (5, 6, 7), 3, 3)
        a.extend(rid, 3)
    a.finish(0)
    a.finish(1)
    assert a.duplicate_tokens == 3
    a.open(2, (5, 6, 7, 8), 3, 4)  # a lookup capped at 2 (one token is always computed)
    a.extend(2, 1)
    a.finish(2)
    assert a.duplicate_tokens == 3 + 1 and a.tree.sequences() == {(5, 6), (5, 6, 7)}  # split at the hit
    assert a.open(3, (5, 6, 7), 2, 3) == 1
    a.extend(3, 2)
    a.finish(3)
    assert a.duplicate_tokens == 3 + 1 + 2
    a.check()


def test_match_reports_the_cached_prefix_under_the_limit():
    a = RadixCacheAllocator(32)
    a.open(0, (1, 2, 3, 4, 5), 5, 5)
    a.extend(0, 5)
    a.finish(0)
    assert a.match((1, 2, 3, 4, 5, 6)) == 5
    assert a.match((1, 2, 3, 4, 5, 6), 3) == 3
    assert a.match((1, 2, 9)) == 2


def test_capacity_is_whole_pages_and_at_least_one_page():
    assert RadixCacheAllocator(4, page_size=4).capacity == 4
    a = RadixCacheAllocator(10, page_size=4, eviction="fifo")
    assert a.capacity == 8 and isinstance(a.capacity, int) and a.tree.eviction == "fifo"
    assert a.classes().capacity == 8 and a.usage().capacity == 8
    with pytest.raises(ValueError) as err:
        RadixCacheAllocator(3, page_size=4)
    assert str(err.value) == "capacity 3 holds less than one page of 4"


def test_slots_to_extend_is_zero_while_the_last_page_has_room():
    """Page size 4: 5 computed tokens hold 2 pages (8 slots): 3 more tokens need none,
    a 4th one page."""
    a = RadixCacheAllocator(16, page_size=4)
    a.open(0, tuple(range(12)), 12, 12)
    a.extend(0, 5)
    assert a.slots_to_extend(0, 3) == 0 and a.slots_to_extend(0, 4) == 4


def test_unshared_counts_each_running_requests_tokens_in_whole_pages():
    """Page size 4: request 0 computed 5 tokens (2 pages: 8 slots); request 1 holds a
    cached prefix of 4 (left by request 9) and computed 2 of its own: 6 tokens, 2 pages, 8.
    ``unshared`` = 16, whatever the tree shares."""
    a = RadixCacheAllocator(64, page_size=4)
    a.open(9, (1, 2, 3, 4, 5), 5, 5)
    a.extend(9, 5)
    a.finish(9)  # caches (1..4); the 5th token's page is freed
    a.open(0, (7,) * 5, 5, 6)
    a.extend(0, 5)
    assert a.open(1, (1, 2, 3, 4, 6, 6), 6, 6) == 4
    a.extend(1, 2)
    u = a.usage()
    assert u.unshared == 8 + 8
    assert u.token_states == 4 + 5 + 2  # the shared page once, each request's own tokens
    a.check()


def test_request_tokens_tag_each_kind_apart():
    """Kinds: real ids x4 (+0), Mooncake hash-block tokens (h * block + j) x4 + 1, named
    prefixes ("p", id, j), request-unique ((rid << 40) + position) x4 + 3."""
    u = (3 << 40) * 4 + 3  # request 3's first unique token, at position 0
    real = Request(3, 0.0, 3, 2, token_ids=(1, 2, 5))
    assert request_tokens(real, 2) == (4, 8, 20, u + 3 * 4, u + 4 * 4)
    # Blocks of 2 tokens; the prompt (5) ends inside the third block; the fourth is not reached.
    hashed = Request(3, 0.0, 5, 1, hash_ids=(5, 6, 7, 8), hash_block_tokens=2)
    assert request_tokens(hashed, 1) == (41, 45, 49, 53, 57, u + 5 * 4)
    named = Request(3, 0.0, 4, 1, prefix_id="sys", prefix_tokens=2)
    assert request_tokens(named, 1) == (("p", "sys", 0), ("p", "sys", 1), u + 2 * 4, u + 3 * 4, u + 4 * 4)
    plain = Request(3, 0.0, 2, 0, prefix_tokens=2)  # a length without a name shares nothing
    assert request_tokens(plain, 0) == (u, u + 4)


# --- check() --------------------------------------------------------------------------------

def two_leaves(page: int = 1) -> RadixTree:
    tree = RadixTree(page)
    tree.insert((1,) * page)
    tree.insert((2,) * page)
    return tree


def test_tree_check_rejects_a_key_that_is_not_whole_pages():
    tree = two_leaves(page=2)
    node = tree.root.children[(1, 1)]
    node.key = (1, 1, 1)
    node.end = 3
    tree.total += 1
    tree.evictable += 1
    with pytest.raises(AssertionError, match=re.escape(f"node {node.uid}: key not whole pages")):
        tree.check()


def test_tree_check_rejects_a_leaf_missing_from_the_heap():
    """Both leaves' entries carry stamp 1; dropping leaf 1's must be noticed although
    another entry has the same stamp."""
    tree = two_leaves()
    leaf = tree.root.children[1]
    tree._heap = [e for e in tree._heap if e[3] is not leaf]
    with pytest.raises(AssertionError, match=re.escape(f"leaf {leaf.uid} not in the heap")):
        tree.check()


@pytest.mark.parametrize("count", ["total", "evictable"])
def test_tree_check_rejects_a_drifted_size(count):
    tree = two_leaves()
    setattr(tree, count, getattr(tree, count) + 1)
    with pytest.raises(AssertionError, match="^tree sizes drifted$"):
        tree.check()


def running(page: int = 1) -> RadixCacheAllocator:
    """Request 0 cached (1, 2, 3, 4) and finished; request 1 hit 4 of (1..4, 5, 6) and
    computed 1 more."""
    a = RadixCacheAllocator(32, page_size=page)
    a.open(0, (1, 2, 3, 4), 4, 4)
    a.extend(0, 4)
    a.finish(0)
    a.open(1, (1, 2, 3, 4, 5, 6), 6, 6)
    a.extend(1, 1)
    a.check()
    return a


def test_allocator_check_rejects_a_held_prefix_that_is_not_cached():
    a = running()
    a.held[1].tokens = (9, 9, 9, 9, 5, 6)
    with pytest.raises(AssertionError, match="^held prefix not cached$"):
        a.check()


def test_allocator_check_rejects_a_node_that_is_not_the_cached_prefix():
    a = running()
    h = a.held[1]
    h.cached, h.computed = 0, 1  # no cached prefix (so nothing to find in the tree), one own token; the node ends at 4
    with pytest.raises(AssertionError, match="^request's node is not its cached prefix$"):
        a.check()


def test_allocator_check_rejects_wrong_private_slots():
    a = running()
    a.held[1].slots += 1
    a.free_slots -= 1
    with pytest.raises(AssertionError, match="^private slots$"):
        a.check()


def test_fifo_evicts_by_creation_even_after_a_split():
    """FIFO: (1, 2, 3) created at t=1, (7,) at t=2; inserting (1, 2) at t=3 splits the first
    node into (1, 2) and (3), both created at t=1 (the upper half is a new node, numbered
    after (7,)). Evicting (3) leaves (1, 2) a leaf: created before (7,), it goes next."""
    tree = RadixTree(eviction="fifo")
    tree.insert((1, 2, 3))
    tree.insert((7,))
    assert tree.insert((1, 2)) == (2, tree.root.children[1])
    assert tree.num_nodes == 3 == len(tree.nodes())
    assert tree.evict(1) == 1 and tree.sequences() == {(1, 2), (7,)}
    assert tree.evict(1) == 2 and tree.sequences() == {(7,)}
    tree.check()


def test_pages_are_told_apart_by_every_token_of_their_first_page():
    """Page size 2: (1, 2) cached; (1, 3) shares its first token but not its first page."""
    tree = RadixTree(page_size=2)
    tree.insert((1, 2))
    assert tree.match((1, 3))[0] == 0
    assert tree.insert((1, 3, 5, 6)) == (0, tree.root.children[(1, 3)])
    assert tree.match((1, 2, 5, 6))[0] == 2


def test_a_tree_insert_has_priority_0_unless_given():
    tree = RadixTree(eviction="priority")
    _, node = tree.insert((1, 2))
    assert node.priority == 0 and node.hits == 1


def test_bad_tree_settings_say_what_is_allowed():
    with pytest.raises(ValueError) as err:
        RadixTree(page_size=0)
    assert str(err.value) == "page_size must be >= 1, got 0"
    with pytest.raises(ValueError) as err:
        RadixTree(eviction="mru")
    assert str(err.value) == "eviction policy must be one of lru, lfu, fifo, arc, priority, got 'mru'"


def test_unlocking_more_often_than_locking_is_an_error():
    tree = RadixTree()
    _, node = tree.insert((1,))
    tree.lock(node)
    tree.unlock(node)
    with pytest.raises(AssertionError, match="^unlocked more often than locked$"):
        tree.unlock(node)


def test_allocator_check_rejects_a_negative_private_count():
    """Request 1 said to have computed fewer tokens than it has cached (3 < 4), its slots
    and the free count adjusted so that everything else still adds up."""
    a = running()
    h = a.held[1]
    h.computed, h.slots = 3, -1  # private -1 (was 1), page slack 0
    a.free_slots += 2
    with pytest.raises(AssertionError, match=r"^RadixClasses\(.*private=-1"):
        a.check()


def test_allocator_check_rejects_negative_free_slots():
    """Free slots below 0 with the capacity lowered to match: only the sign is wrong (an
    evictable leaf of 2 keeps ``usage()``'s free count, which includes it, at 1)."""
    a = running()
    a.open(2, (8, 9), 2, 2)
    a.extend(2, 2)
    a.finish(2)
    a.check()
    drop = a.free_slots + 1
    a.free_slots -= drop
    a.capacity -= drop
    with pytest.raises(AssertionError, match=r"^RadixClasses\(.*free=-1\)"):
        a.check()
