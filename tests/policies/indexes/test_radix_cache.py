"""SGLang's radix cache (policies/indexes/radix_cache.py) against a brute-force model, plus
hand-worked cases: splits, access refresh, each eviction policy's order, duplicates
freed, and exact memory classes of the allocator on top.

The model knows no tree: the cache is the set of cached page-aligned token prefixes
(tuples), each with its own access time, hit count, creation time, priority and lock
count; node boundaries are the prefixes at which some operation ended or stopped (where
the tree splits). Eviction picks, among unlocked prefixes with no cached extension, the
one with the smallest policy key, and frees the tokens back to the previous boundary.
"""

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.radix_cache import (
    RadixCacheAllocator,
    RadixTree,
    packed_tokens,
    request_tokens,
)
from kvsim.traces import Request


class Model:
    """Every cached sequence as a set of token tuples (page-aligned prefixes)."""

    def __init__(self, page: int, policy: str):
        self.P, self.policy, self.time = page, policy, 0
        self.cached: set[tuple] = set()
        self.bound: set[tuple] = set()
        self.access: dict[tuple, int] = {}
        self.hits: dict[tuple, int] = {}
        self.created: dict[tuple, int] = {}
        self.prio: dict[tuple, int] = {}
        self.lock: dict[tuple, int] = {}

    def _prefixes(self, q, upto):
        return [q[:j] for j in range(self.P, upto + 1, self.P)]

    def _walk(self, q, prio):
        self.time += 1
        n = len(q) // self.P * self.P
        k = 0
        while k + self.P <= n and q[:k + self.P] in self.cached:
            k += self.P
        for p in self._prefixes(q, k):
            self.access[p] = self.time
            self.hits[p] += 1
            if prio is not None:
                self.prio[p] = max(self.prio[p], prio)
        if k:
            self.bound.add(q[:k])
        return n, k

    def match(self, q):
        return self._walk(q, None)[1]

    def insert(self, q, prio=0):
        n, k = self._walk(q, prio)
        for p in self._prefixes(q, n)[k // self.P:]:
            self.cached.add(p)
            self.access[p] = self.created[p] = self.time
            self.hits[p], self.prio[p], self.lock[p] = 1, prio, 0
        if n:
            self.bound.add(q[:n])
        return k

    def set_lock(self, seq, d):
        for p in self._prefixes(seq, len(seq)):
            self.lock[p] += d

    def _key(self, p):
        return {"lru": (self.access[p],), "lfu": (self.hits[p], self.access[p]), "fifo": (self.created[p],),
                "priority": (self.prio[p], self.access[p])}[self.policy]

    def evict(self, num):
        freed = 0
        while freed < num:
            leaves = [b for b in self.bound if not self.lock[b]
                      and not any(c[:len(b)] == b and len(c) > len(b) for c in self.cached)]
            if not leaves:
                break
            keys = sorted(self._key(b) for b in leaves)
            assert len(keys) < 2 or keys[0] != keys[1], "the model cannot tell two leaves apart"
            b = min(leaves, key=self._key)
            up = max((len(a) for a in self.bound if len(a) < len(b) and b[:len(a)] == a), default=0)
            for p in self._prefixes(b, len(b))[up // self.P:]:
                self.cached.discard(p)
            self.bound.discard(b)
            freed += len(b) - up
        return freed


OPS = st.lists(st.tuples(st.sampled_from(["insert", "insert", "match", "lock", "unlock", "evict", "evict"]),
                         st.lists(st.integers(0, 2), max_size=6), st.integers(0, 3)), min_size=20, max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, page=st.sampled_from([1, 2, 16]), policy=st.sampled_from(["lru", "lfu", "fifo", "priority"]))
def test_tree_equals_the_brute_force_model(ops, page, policy):
    tree, model = RadixTree(page, policy), Model(page, policy)
    locks: list[tuple] = []  # (node, sequence it ends)
    for op, raw, x in ops:
        q = tuple(t for t in raw for _ in range(page))  # whole pages, some sequences odd-length below
        q = q + (9,) if x == 3 else q
        if op == "insert":
            assert tree.insert(q, priority=x)[0] == model.insert(q, x)
        elif op == "match":
            assert tree.match(q)[0] == model.match(q)
        elif op == "lock":
            k, node = tree.match(q)
            assert k == model.match(q)
            tree.lock(node)
            model.set_lock(q[:k], +1)
            locks.append((node, q[:k]))
        elif op == "unlock" and locks:
            node, seq = locks.pop(x % len(locks))
            tree.unlock(node)
            model.set_lock(seq, -1)
        elif op == "evict":
            before = tree.evicted_tokens
            freed = tree.evict(x * page + 1)
            assert freed == model.evict(x * page + 1) == tree.evicted_tokens - before
        tree.check()
        assert tree.sequences() == model.bound
        assert tree.total == len(model.cached) * page
        assert tree.evictable == page * sum(1 for p in model.cached if not model.lock[p])
        for n in tree.nodes():  # lock counts exact: each node's equals the model's on its tokens
            assert n.lock_ref == model.lock[_ends(tree, n)]


def _ends(tree, node):
    keys = []
    while node is not tree.root:
        keys.append(node.key)
        node = node.parent
    return tuple(t for k in reversed(keys) for t in k)


# --- hand-worked cases -----------------------------------------------------------------

def test_a_partial_match_splits_the_node_and_refreshes_only_the_matched_part():
    t = RadixTree()
    t.insert((1, 2, 3, 4))  # time 1
    k, node = t.match((1, 2, 9))  # time 2: stops inside [1 2 3 4]
    assert k == 2 and node.key == (1, 2) and node.last_access == 2
    (lower,) = node.children.values()
    assert lower.key == (3, 4) and lower.last_access == 1 and t.num_nodes == 2
    assert t.sequences() == {(1, 2), (1, 2, 3, 4)}
    t.check()


def test_insert_reports_what_was_cached_and_adds_only_the_rest():
    t = RadixTree()
    assert t.insert((1, 2, 3))[0] == 0
    assert t.insert((1, 2, 3, 4, 5))[0] == 3
    assert t.insert((1, 2, 7))[0] == 2 and t.total == 6  # 1 2 3 | 4 5 | 7 after the split
    assert t.sequences() == {(1, 2), (1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 7)}


def test_pages_cover_whole_pages_only():
    t = RadixTree(page_size=4)
    assert t.insert(tuple(range(10)))[1].end == 8 and t.total == 8  # the unaligned tail is not cached
    assert t.match(tuple(range(7)))[0] == 4  # a page-aligned hit
    assert t.match((0, 1, 2, 3, 4, 5, 6, 99))[0] == 4  # a mismatch inside a page loses the page


def _three_leaves(policy):
    """Leaves A=(1,), B=(2,), C=(3,) inserted at times 1, 2, 3 (priorities 5, 1, 3);
    A is matched again at time 4 and 5, C at time 6."""
    t = RadixTree(eviction=policy)
    t.insert((1,), priority=5)
    t.insert((2,), priority=1)
    t.insert((3,), priority=3)
    t.match((1,))
    t.match((1,))
    t.match((3,))
    return t


@pytest.mark.parametrize("policy,order", [
    ("lru", [(2,), (1,), (3,)]),  # last access 2 < 5 < 6
    ("lfu", [(2,), (3,), (1,)]),  # hits 1 < 2 (C: 1 + 1) < 3 (A)
    ("fifo", [(1,), (2,), (3,)]),  # created 1 < 2 < 3, whatever the accesses
    ("priority", [(2,), (3,), (1,)]),  # priority 1 < 3 < 5
])
def test_each_eviction_policy_evicts_in_its_order(policy, order):
    t = _three_leaves(policy)
    seen = []
    for _ in range(3):
        before = t.sequences()
        assert t.evict(1) == 1
        seen += list(before - t.sequences())
    assert seen == order and t.total == 0


def test_arc_evicts_once_used_leaves_first_and_adapts_on_a_ghost_hit():
    """Leaf A=(1,) inserted at time 1 and matched at 2 (a second use: T2); B=(2,), C=(3,)
    inserted at 3 and 4 (T1). LRU would evict A first (last access 2). ARC (p = 0, |T1| = 2
    > p) evicts T1's least recent, B, and remembers it by (end 1, tokens (2,)) in B1.
    B inserted again at 5 is a ghost hit: p = max(1, |B2| // |B1|) = 1 and B starts in T2.
    Then |T1| = 1 (C) is not > p, so T2's least recent goes: A (2 < 5); then B (T2, 5; T1
    still not above p), then C."""
    lru = RadixTree(eviction="lru")
    t = RadixTree(eviction="arc", capacity_pages=8)
    for tree in (lru, t):
        tree.insert((1,))
        tree.match((1,))
        tree.insert((2,))
        tree.insert((3,))
    before = lru.sequences()
    lru.evict(1)
    assert before - lru.sequences() == {(1,)}
    seen = []

    def evict_one() -> None:
        before = t.sequences()
        assert t.evict(1) == 1
        seen.extend(before - t.sequences())
        t.check()

    evict_one()
    assert seen == [(2,)] and t._arc.p == 0 and list(t._arc.ghosts[1]) == [(1, (2,))]
    t.insert((2,))
    assert t._arc.p == 1 and t._arc.entries[t.root.children[2]].arc_list == 2
    for _ in range(3):
        evict_one()
    assert seen == [(2,), (1,), (2,), (3,)] and t.total == 0


def test_locked_paths_stay_and_a_parent_joins_the_heap_when_its_last_child_goes():
    t = RadixTree()
    _, ab = t.insert((1, 2))
    t.insert((1, 2, 3))
    t.lock(ab)  # locks (1 2): only (3) is evictable
    assert t.evictable == 1 and t.evict(10) == 1 and t.total == 2
    t.unlock(ab)  # now childless and unlocked: evictable
    assert t.evict(10) == 2 and t.total == 0
    t.check()


def test_allocator_frees_duplicates_and_classes_sum_to_capacity():
    """A and B both compute prompt (1 2 3 4) privately (neither was cached when they opened).
    A inserts it after its prefill; B then finds all 4 already there: its 4 slots are freed."""
    a = RadixCacheAllocator(32)
    for rid in (0, 1):
        assert a.open(rid, (1, 2, 3, 4, 5, 6), 4, 5) == 0
        assert a.extend(rid, 4)
    assert a.free_slots == 24
    a.cache_unfinished(0)
    a.cache_unfinished(1)
    assert a.duplicate_tokens == 4 and a.free_slots == 28 and a.tree.total == 4
    c = a.classes()
    assert (c.locked, c.private, c.evictable, c.free) == (4, 0, 0, 28)
    a.extend(0, 1)  # a decode token of A: private
    a.finish(0)  # (1..5) into the tree; B still locks (1..4)
    a.retract(1)
    c = a.classes()
    assert (c.locked, c.private, c.evictable, c.free) == (0, 0, 5, 27)
    a.check()


def test_allocator_page_slack_and_unaligned_tail():
    """Page 4: a 6-token prompt takes 2 pages; at finish 4 tokens stay cached, 2 freed."""
    a = RadixCacheAllocator(16, page_size=4)
    a.open(0, tuple(range(10)), 6, 7)
    assert a.extend(0, 6) and a.free_slots == 8
    u = a.usage()
    assert (u.token_states, u.reserved, u.internal_frag) == (6, 1, 1)  # final length 7 of 8 slots
    a.finish(0)
    assert a.tree.total == 4 and a.free_slots == 12
    a.check()


def test_extend_evicts_unlocked_cache_and_fails_without_side_effects():
    a = RadixCacheAllocator(8)
    a.open(0, (1, 2, 3, 4, 5, 6), 6, 6)
    a.extend(0, 6)
    a.finish(0)  # 6 cached, unlocked
    a.open(1, (7, 8, 9, 10), 4, 4)
    assert a.extend(1, 4)  # needs 2 more slots than free: evicts the whole (1..6) node
    assert a.tree.total == 0 and a.evictions == 6 and a.free_slots == 4
    assert not a.extend(1, 5) and a.kv_len(1) == 4  # 5 > 4 available: nothing changes
    a.check()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["open", "extend", "chunk", "finish", "retract"]),
                          st.integers(0, 3), st.integers(1, 6)), max_size=40),
       page=st.sampled_from([1, 4]))
def test_allocator_classes_stay_exact(ops, page):
    """Random request lives over a small cache: every slot is in exactly one class, lock
    counts are exact, capacity is never exceeded (``check`` after every operation)."""
    a = RadixCacheAllocator(24, page_size=page)
    prompts = {i: tuple([0] * 3 + [i] * 9) for i in range(4)}  # a shared 3-token start
    for op, rid, n in ops:
        if op == "open" and rid not in a.held:
            a.open(rid, prompts[rid], 1 + n, 12)
        elif rid in a.held:
            h = a.held[rid]
            if op == "extend" and h.computed + n <= 12:
                before, need = a.available(), a.slots_to_extend(rid, n)
                ok = a.extend(rid, n)
                assert ok == (need <= before)  # fails only when even eviction cannot make room
                assert ok or (a.available() == before and a.kv_len(rid) == h.computed)
            elif op == "chunk":
                a.cache_unfinished(rid)
            elif op == "finish":
                a.finish(rid)
            elif op == "retract":
                a.retract(rid)
        a.check()
        assert a.free_slots >= 0 and a.tree.total <= a.capacity


def test_packed_tokens_are_request_tokens_in_an_int64_array():
    """The SGLang scheduler's compact copy of a request's tokens holds the same values, or is
    None where one is not a 64-bit int (the scheduler then keeps tuples)."""
    packable = [Request(1, 0.0, 700, 3, hash_ids=(5, 6), hash_block_tokens=512),
                Request(2, 0.0, 3, 2, token_ids=(4, 5, 6), output_token_ids=(7, 8)),
                Request(3, 0.0, 10, 4), Request(2**21 - 1, 0.0, 10, 5)]
    for r in packable:
        for out in range(r.output_tokens + 1):
            packed = packed_tokens(r, out)
            assert isinstance(packed, array) and packed.typecode == "q" and tuple(packed) == request_tokens(r, out)
    for r in (Request(4, 0.0, 10, 2, prefix_id="sys", prefix_tokens=7), Request(2**21, 0.0, 10, 5),
              Request(5, 0.0, 3, 1, token_ids=(4, 5, 2**62))):
        assert packed_tokens(r, r.output_tokens) is None


def test_request_tokens_share_exactly_what_the_trace_shares():
    r1 = Request(1, 0.0, 700, 3, hash_ids=(5, 6), hash_block_tokens=512)
    r2 = Request(2, 0.0, 600, 3, hash_ids=(5, 7), hash_block_tokens=512)
    t1, t2 = request_tokens(r1, 3), request_tokens(r2, 3)
    assert len(t1) == 703 and len(t2) == 603
    common = next(i for i, (x, y) in enumerate(zip(t1, t2)) if x != y)
    assert common == 512  # the first hash block, to the token
    p1 = request_tokens(Request(3, 0.0, 10, 2, prefix_id="sys", prefix_tokens=7), 2)
    p2 = request_tokens(Request(4, 0.0, 9, 2, prefix_id="sys", prefix_tokens=7), 2)
    assert p1[:7] == p2[:7] and p1[7] != p2[7] and len(set(p1) & set(p2)) == 7
    k1 = request_tokens(Request(5, 0.0, 3, 1, token_ids=(4, 5, 6)), 1)
    k2 = request_tokens(Request(6, 0.0, 3, 1, token_ids=(4, 5, 7)), 1)
    assert k1[:2] == k2[:2] and k1[2] != k2[2]
