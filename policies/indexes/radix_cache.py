"""SGLang's radix-tree KV cache (``scheduler.policy: sglang``), token-granular.

The tree stores every cached token sequence once; a node holds a run of tokens (its
``key``) that no other cached sequence branches inside of::

    root ─ [s y s t e m] ─┬─ [q 1 ...]        request A's prompt and output
                          └─ [q 2] ─ [a n s]  request B's, and its answer

What differs from vLLM's block cache (``policies.ledger.v1_prefix_cache``), after SGLang's
``python/sglang/srt/mem_cache/radix_cache.py`` (read, not copied):

- **Token granularity.** With ``page_size`` 1 any shared prefix hits, block-aligned or
  not. With page size P > 1 keys are whole pages: a match or insertion covers
  ``len // P * P`` tokens, and a request's unaligned tail is freed at its end.
- **Split on partial match.** A lookup or insertion that stops inside a node splits it
  there, so a node's tokens are always touched together.
- **Access refresh.** Every node a lookup or insertion passes gets the current logical
  time (``last_access``) and one more ``hits``: the eviction keys.
- **Duplicates are freed.** Two requests computing the same tokens insert them both; the
  second finds them present (``insert`` returns how many were), and its own copies are
  freed rather than kept (the block cache keeps the duplicate until the request ends).
- **Locks.** A running request locks the path to its last cached node
  (``lock_ref`` counts along the path); only unlocked childless nodes are evictable.
- **Eviction** by a heap of evictable leaves ordered by the policy's key: ``lru``
  (last access), ``lfu`` (hits, then last access), ``fifo`` (creation), ``priority``
  (the highest request priority that inserted it, then last access). Entries are deleted
  lazily (a stamp per node says whether an entry is current); a parent whose last child
  goes joins the heap. ``arc`` (not in SGLang; kvsim's, see ``policies.indexes.eviction_order``)
  keeps its lists in an :class:`~policies.indexes.eviction_order.EvictionOrder` instead, over
  nodes: a node enters T1 when created, every later match or insertion through it is a
  use (T2), a split's upper half copies its node's facts, and a ghost remembers an evicted
  leaf by (tokens from the root through it, its tokens), so re-inserting the same leaf
  under the same parent is a ghost hit. ARC's ``c`` is the capacity in pages.

Cost: every operation walks nodes, not tokens. Keys are tuples, or ``array('q')`` when
the tokens are (:func:`packed_tokens`: 8 bytes a token, no int objects; a tree holds one
kind or the other, :meth:`RadixTree.unpack` turns arrays into tuples); a node is compared
with the query by one slice comparison (C speed), and only when they differ does a binary
search of slice comparisons find the split point. Time is a logical counter (one tick per
operation), so runs are deterministic.

Cache tiers (``allocator.tiers``, ``policies.tiers.tier_stack``; SGLang's HiCache host tier)
hold *pages*, named by :class:`PageChain`: page j of a token sequence is interned from
(page j - 1's name, its ``page_size`` tokens), so two sequences share a page name exactly
when they agree on every token up to its end (the chained identity vLLM's blocks have,
``policies.indexes.key_chain``). :attr:`RadixCacheAllocator.on_evict` hears of every page the tree
evicts (write-back), a node's pages first to last with the node's priority.

Memory (token slots, :meth:`RadixCacheAllocator.classes`): every slot is in exactly one of
``locked`` (tree tokens on some running request's path), ``evictable`` (cached, no running
request refers to it: SGLang's evictable size), ``private`` (a running request's own
tokens not yet in the tree), ``page_slack`` (the rest of a running request's last page),
``free``. They sum to capacity.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES, EvictionOrder
from kvsim.policies.kv_allocator import MemoryUsage

Tokens = tuple[Hashable, ...] | array


@dataclass(eq=False, slots=True)
class Node:
    """A run of cached tokens. ``end``: tokens from the root through this node (fixed for
    life: a split gives the upper half a new node). ``stamp``: bumped whenever the node's
    eviction key changes, and -1 once evicted; a heap entry with another stamp is stale."""

    key: Tokens
    parent: Node | None
    end: int
    uid: int
    created: int = 0
    last_access: int = 0
    hits: int = 0
    priority: int = 0
    lock_ref: int = 0
    stamp: int = 0
    children: dict = field(default_factory=dict)


class RadixTree:
    """The tree alone: match, insert, lock, evict; counts the slots its nodes hold.

    ``total``: tokens in the tree; ``evictable``: tokens in nodes with ``lock_ref == 0``.
    """

    def __init__(self, page_size: int = 1, eviction: str = "lru", capacity_pages: int = 0):
        """``capacity_pages``: pages the cache can hold (ARC's ``c``; other policies ignore it)."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction policy must be one of {', '.join(EVICTION_POLICIES)}, got {eviction!r}")
        self.page_size = page_size
        self.eviction = eviction
        self.root = Node((), None, 0, 0, lock_ref=1)  # locked forever: never evicted
        self.time = 0  # logical clock: one tick per match or insert
        self.total = 0
        self.evictable = 0
        self.num_nodes = 0  # nodes besides the root
        self.evicted_tokens = 0
        self._uid = 0
        self._heap: list[tuple[tuple, int, int, Node]] = []  # (policy key, uid, stamp, node)
        # arc: the order of nodes (the heap stays empty)
        self._arc = EvictionOrder("arc", capacity_pages, _ghost) if eviction == "arc" else None
        self.on_evict: Callable[[Node], None] | None = None  # told of each node evicted (cache tiers)

    # --- keys ---------------------------------------------------------------------------
    def _edge(self, tokens: Sequence[Hashable], pos: int) -> Hashable:
        """The child-dict key of the run starting at ``pos``: its first token, or first page."""
        return tokens[pos] if self.page_size == 1 else tuple(tokens[pos:pos + self.page_size])

    def _common(self, key: Tokens, tokens: Tokens, pos: int, n: int) -> int:
        """Length of the common (page-aligned) prefix of ``key`` and ``tokens[pos:n]``, whose
        first page is known to agree: one slice comparison, or a binary search of them."""
        L = min(len(key), n - pos)
        if key[:L] == tokens[pos:pos + L]:
            return L
        P = self.page_size
        lo, hi = 1, L // P  # pages: lo agree, hi + 1 ... do not (hi itself unknown)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key[:mid * P] == tokens[pos:pos + mid * P]:
                lo = mid
            else:
                hi = mid - 1
        return lo * P

    def _key(self, node: Node) -> tuple:
        e = self.eviction
        if e == "lru":
            return (node.last_access,)
        if e == "lfu":
            return (node.hits, node.last_access)
        if e == "fifo":
            return (node.created,)
        return (node.priority, node.last_access)

    def _push(self, node: Node) -> None:
        """File an evictable leaf (or file it again: its key changed)."""
        if self._arc is not None:
            self._arc.offer(node)
            return
        node.stamp += 1
        heapq.heappush(self._heap, (self._key(node), node.uid, node.stamp, node))

    def _touch(self, node: Node, priority: int | None = None) -> None:
        node.last_access = self.time
        node.hits += 1
        if priority is not None and priority > node.priority:
            node.priority = priority
        if self._arc is not None:
            self._arc.hit(node, self.time, node.priority)
        if not node.lock_ref and not node.children:
            self._push(node)

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` tokens; return the new upper node (same
        lock count, access time, hits, creation and priority: its tokens were touched
        together with the rest until now)."""
        self._uid += 1
        parent = node.parent
        upper = Node(node.key[:k], parent, node.end - len(node.key) + k, self._uid, node.created,
                     node.last_access, node.hits, node.priority, node.lock_ref)
        parent.children[self._edge(node.key, 0)] = upper
        node.key = node.key[k:]
        node.parent = upper
        upper.children[self._edge(node.key, 0)] = node
        self.num_nodes += 1
        if self._arc is not None:
            self._arc.copy(upper, node)
        return upper

    def _walk(self, tokens: Tokens, n: int, priority: int | None) -> tuple[int, Node]:
        """Follow ``tokens[:n]`` down the tree, splitting where it stops inside a node and
        refreshing every node on the way; (tokens matched, last node)."""
        node, pos = self.root, 0
        children = node.children
        while pos < n:
            child = children.get(self._edge(tokens, pos))
            if child is None:
                break
            k = self._common(child.key, tokens, pos, n)
            if k < len(child.key):
                child = self._split(child, k)
            self._touch(child, priority)
            node, pos, children = child, pos + k, child.children
        return pos, node

    # --- the operations -----------------------------------------------------------------
    def match(self, tokens: Tokens, limit: int | None = None) -> tuple[int, Node]:
        """Longest cached (page-aligned) prefix of ``tokens[:limit]``: (its length, its last
        node). ``limit`` saves the caller a copy of a long prefix."""
        self.time += 1
        n = len(tokens) if limit is None else min(limit, len(tokens))
        return self._walk(tokens, n // self.page_size * self.page_size, None)

    def insert(self, tokens: Tokens, priority: int = 0, limit: int | None = None) -> tuple[int, Node]:
        """Cache ``tokens[:limit]`` (whole pages). Returns how many of them were cached
        already (the caller frees its own copies of those) and the node that ends the
        inserted sequence."""
        self.time += 1
        n = len(tokens) if limit is None else min(limit, len(tokens))
        n = n // self.page_size * self.page_size
        pos, node = self._walk(tokens, n, priority)
        if pos == n:
            return pos, node
        self._uid += 1
        key = tokens[pos:n] if isinstance(tokens, array) else tuple(tokens[pos:n])
        leaf = Node(key, node, n, self._uid, self.time, self.time, 1, priority)
        node.children[self._edge(tokens, pos)] = leaf
        self.total += n - pos
        self.evictable += n - pos
        self.num_nodes += 1
        if self._arc is not None:
            self._arc.insert(leaf, self.time, priority, _ghost(leaf))
        self._push(leaf)
        return pos, leaf

    def lock(self, node: Node) -> None:
        """One more running request holds the path root..node."""
        while node is not self.root:
            if not node.lock_ref:
                self.evictable -= len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """A running request lets go of the path root..node."""
        while node is not self.root:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "unlocked more often than locked"
            if not node.lock_ref:
                self.evictable += len(node.key)
                if not node.children:
                    self._push(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves in policy order until ``num_tokens`` are freed (or none is
        left); return the tokens freed (whole nodes: may exceed the ask)."""
        freed, heap, root, arc = 0, self._heap, self.root, self._arc
        while freed < num_tokens and (heap or arc is not None):
            if arc is not None:
                node = arc.evict(_evictable)
                if node is None:
                    break
            else:
                _, _, stamp, node = heapq.heappop(heap)
                if node.stamp != stamp or node.lock_ref or node.children:
                    continue  # stale: evicted, re-filed since, locked or not a leaf any more
            if self.on_evict is not None:
                self.on_evict(node)
            parent = node.parent
            del parent.children[self._edge(node.key, 0)]
            size = len(node.key)
            freed += size
            self.total -= size
            self.evictable -= size
            self.num_nodes -= 1
            node.stamp = -1
            if parent is not root and not parent.children and not parent.lock_ref:
                self._push(parent)
        self.evicted_tokens += freed
        if len(heap) > 4 * self.num_nodes + 64:  # stale entries pile up: keep the heap O(nodes)
            self._heap = [e for e in heap if e[3].stamp == e[2]]
            heapq.heapify(self._heap)
        return freed

    def unpack(self) -> None:
        """Turn every node's key into a tuple (its tokens are no longer all packed)."""
        for n in self.nodes():
            n.key = tuple(n.key)

    # --- inspection ---------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def sequences(self) -> set[Tokens]:
        """Every cached token sequence (each node's end), for tests."""
        out = set()
        for n in self.nodes():
            path, m = [], n
            while m is not self.root:
                path.append(m.key)
                m = m.parent
            out.add(tuple(t for k in reversed(path) for t in k))
        return out

    def check(self) -> None:
        """Raise AssertionError if a count or a link is wrong (tests call this)."""
        total = evictable = 0
        P = self.page_size
        for n in self.nodes():
            assert n.key and len(n.key) % P == 0, f"node {n.uid}: key not whole pages"
            assert n.parent.children.get(self._edge(n.key, 0)) is n, f"node {n.uid}: parent link"
            assert n.end == n.parent.end + len(n.key), f"node {n.uid}: end"
            assert n.lock_ref >= sum(c.lock_ref for c in n.children.values()), f"node {n.uid}: lock below parent's"
            total += len(n.key)
            evictable += 0 if n.lock_ref else len(n.key)
            if not n.lock_ref and not n.children:
                if self._arc is not None:
                    assert self._arc.entries[n].filed, f"leaf {n.uid} not filed in the ARC order"
                else:
                    assert any(e[3] is n and e[2] == n.stamp for e in self._heap), f"leaf {n.uid} not in the heap"
        assert total == self.total and evictable == self.evictable, "tree sizes drifted"
        if self._arc is not None:
            self._arc.check()
            assert set(self._arc.entries) == set(self.nodes()), "the ARC order's nodes are not the tree's"


def _ghost(node: Node) -> tuple:
    """What ARC's ghost lists remember an evicted node by: where it ends and its tokens."""
    return (node.end, node.key if isinstance(node.key, tuple) else tuple(node.key))


def _evictable(node: Node) -> bool:
    """Leaf-only eviction: an unlocked node without children."""
    return not node.lock_ref and not node.children


class PageChain:
    """Names of token pages for cache tiers: page j of a sequence is the interned pair
    (page j - 1's name, its tokens), the first page's parent being -1. Names are small ints
    in first-seen order; only equality matters (the reference names a page by the tuple of
    its sequence's tokens up to the page's end: the same equality, kept plainly)."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self._ids: dict[tuple[int, Tokens], int] = {}

    def extend(self, tokens: Sequence[Hashable], keys: list[int], stop: int) -> list[int]:
        """Grow ``keys`` (the names of ``tokens``' first pages, in place) to ``stop`` pages."""
        P, ids = self.page_size, self._ids
        parent = keys[-1] if keys else -1
        for j in range(len(keys), stop):
            pair = (parent, tuple(tokens[j * P:(j + 1) * P]))
            parent = ids.get(pair, -1)
            if parent < 0:
                parent = ids[pair] = len(ids)
            keys.append(parent)
        return keys


@dataclass(slots=True)
class _Held:
    """A running request's KV: ``cached`` leading tokens through the tree (``node``
    locked), ``computed - cached`` of its own in ``slots`` private slots (whole pages)."""

    tokens: Tokens
    node: Node
    cached: int
    computed: int
    slots: int
    final_len: int
    priority: int = 0


@dataclass(frozen=True, slots=True)
class RadixClasses:
    """Token slots by state; they sum to ``capacity``."""

    capacity: int
    locked: int  # tree tokens some running request's path holds (shared ones once)
    private: int  # running requests' computed tokens not (yet) in the tree
    page_slack: int  # the unfilled rest of running requests' last pages
    evictable: int  # cached tokens no running request refers to
    free: int


class RadixCacheAllocator:
    """``capacity`` token slots in pages of ``page_size``, a radix tree over them, and the
    running requests' holdings; driven by :class:`simulator.sched.sglang.SchedulerSGLang`.

    A request's life: :meth:`open` (lock its cached prefix), :meth:`extend` for every chunk
    and decode token (evicting when free slots run short), :meth:`cache_unfinished` after
    each prefill chunk (its computed tokens join the tree; duplicates are freed), then
    :meth:`finish` (prompt and output join the tree, the unaligned tail is freed) or
    :meth:`retract` (its own slots freed, nothing inserted, as SGLang's ``release_kv_cache``
    with ``is_insert=False``).
    """

    def __init__(self, capacity: int, page_size: int = 1, eviction: str = "lru"):
        if capacity < page_size:
            raise ValueError(f"capacity {capacity} holds less than one page of {page_size}")
        self.page_size = self.block_size = page_size
        self.capacity = capacity // page_size * page_size
        self.tree = RadixTree(page_size, eviction, self.capacity // page_size)
        self.free_slots = self.capacity  # neither in the tree nor held privately
        self.held: dict[int, _Held] = {}
        self.prefix_lookups = 0  # tokens looked up at admission
        self.prefix_hits = 0  # ... of which found cached
        self.duplicate_tokens = 0  # computed tokens freed because the tree already had them
        self.pages = PageChain(page_size)  # page names for cache tiers
        self.on_evict: Callable[[list, list, list], None] | None = None  # (keys, parents, priorities)

    def listen_evictions(self, on_evict: Callable[[list, list, list], None]) -> None:
        """Tell ``on_evict(keys, parents, priorities)`` of every page the tree evicts (write-back
        into a cache tier): a node's pages first to last, each with its chain parent (None for
        a sequence's first page) and the node's priority."""
        self.on_evict = on_evict
        self.tree.on_evict = self._evicted

    def _evicted(self, node: Node) -> None:
        path, m, root = [], node, self.tree.root
        while m is not root:
            path.append(m.key)
            m = m.parent
        tokens = tuple(t for key in reversed(path) for t in key)
        P = self.page_size
        keys = self.pages.extend(tokens, [], node.end // P)
        first = (node.end - len(node.key)) // P
        mine = keys[first:]
        self.on_evict(mine, [keys[j - 1] if j else None for j in range(first, len(keys))],
                      [node.priority] * len(mine))

    def unpack(self) -> None:
        """Hold every token sequence as a tuple from now on (see :meth:`RadixTree.unpack`)."""
        self.tree.unpack()
        for h in self.held.values():
            h.tokens = tuple(h.tokens)

    def cached_len(self, rid: int) -> int:
        """Tokens of a running request that are tree tokens (its locked prefix)."""
        return self.held[rid].cached

    @property
    def evictions(self) -> int:
        return self.tree.evicted_tokens

    def available(self) -> int:
        """Slots an allocation may take: free ones and every evictable cached one."""
        return self.free_slots + self.tree.evictable

    def match(self, tokens: Tokens, limit: int | None = None) -> int:
        """Cached prefix of ``tokens[:limit]`` (page-aligned), refreshing it (as SGLang's match)."""
        return self.tree.match(tokens, limit)[0]

    def _take(self, slots: int) -> bool:
        if slots > self.free_slots:
            if slots > self.available():
                return False
            self.free_slots += self.tree.evict(slots - self.free_slots)
        self.free_slots -= slots
        return True

    # --- a request's life -------------------------------------------------------------
    def open(self, rid: int, tokens: Tokens, num_tokens: int, final_len: int, priority: int = 0) -> int:
        """A request starts computing ``tokens[:num_tokens]``: lock its longest cached
        prefix, at most ``num_tokens - 1`` tokens (one is always computed). Returns the hit."""
        hit, node = self.tree.match(tokens, num_tokens - 1)
        self.tree.lock(node)
        self.held[rid] = _Held(tokens, node, hit, hit, 0, final_len, priority)
        return hit

    def count_lookup(self, num_tokens: int, hit: int) -> None:
        """An admission looked up ``num_tokens`` and found ``hit`` cached (for the hit
        ratio; a request opened and let go again at once is not counted)."""
        self.prefix_lookups += num_tokens
        self.prefix_hits += hit

    def extend(self, rid: int, n: int) -> bool:
        """Slots for ``n`` more tokens of a running request (whole pages); False if even
        evicting every unlocked cached token would not free enough (nothing changes then)."""
        h, P = self.held[rid], self.page_size
        need = -(-(h.computed + n - h.cached) // P) * P - h.slots
        if need > 0 and not self._take(need):
            return False
        h.slots += max(need, 0)
        h.computed += n
        return True

    def slots_to_extend(self, rid: int, n: int) -> int:
        """Slots ``extend(rid, n)`` would take."""
        h, P = self.held[rid], self.page_size
        return max(0, -(-(h.computed + n - h.cached) // P) * P - h.slots)

    def _insert(self, h: _Held, upto: int) -> None:
        """Move ``tokens[:upto]`` (page-aligned, past ``h.cached``) into the tree: the
        tokens it had already are duplicates and their slots are freed; the path lock
        moves to the new last node."""
        present, node = self.tree.insert(h.tokens, h.priority, upto)
        dup = present - h.cached
        self.duplicate_tokens += dup
        self.free_slots += dup
        h.slots -= upto - h.cached
        self.tree.lock(node)
        self.tree.unlock(h.node)
        h.node, h.cached = node, upto

    def cache_unfinished(self, rid: int) -> None:
        """After a prefill chunk: its computed tokens (whole pages) join the tree."""
        h = self.held[rid]
        upto = h.computed // self.page_size * self.page_size
        if upto > h.cached:
            self._insert(h, upto)

    def finish(self, rid: int) -> None:
        """The request ended: its KV (prompt and output) joins the tree, the unaligned
        tail and any page slack are freed, its path unlocked."""
        h = self.held[rid]
        upto = h.computed // self.page_size * self.page_size
        if upto > h.cached:
            self._insert(h, upto)
        self._release(rid)

    def retract(self, rid: int) -> None:
        """The request goes back to the queue: its own slots are freed, nothing inserted."""
        self._release(rid)

    def _release(self, rid: int) -> None:
        h = self.held.pop(rid)
        self.free_slots += h.slots
        self.tree.unlock(h.node)

    def kv_len(self, rid: int) -> int:
        return self.held[rid].computed

    # --- memory -------------------------------------------------------------------------
    def classes(self) -> RadixClasses:
        """Exact slot states now (O(running requests))."""
        private = sum(h.computed - h.cached for h in self.held.values())
        slots = sum(h.slots for h in self.held.values())
        t = self.tree
        return RadixClasses(self.capacity, t.total - t.evictable, private, slots - private, t.evictable,
                            self.free_slots)

    def usage(self) -> MemoryUsage:
        """DESIGN.md's classes: tokens of running requests (locked tree tokens once, private
        ones) are ``token_states``; page slack up to a request's final length is
        ``reserved``, past it ``internal_frag``; evictable cached tokens count as free
        (reusable at once), as in the block caches."""
        t, P = self.tree, self.page_size
        private = reserved = frag = unshared = 0
        for h in self.held.values():
            own = h.computed - h.cached
            private += own
            end = h.cached + h.slots  # the last allocated slot's position + 1
            reserved += min(end, max(h.final_len, h.computed)) - h.computed
            frag += max(0, end - max(h.final_len, h.computed))
            unshared += -(-h.computed // P) * P
        return MemoryUsage(self.capacity, t.total - t.evictable + private, reserved, frag,
                           self.free_slots + t.evictable, unshared)

    def check(self) -> None:
        """Raise AssertionError if any count drifted (tests call this)."""
        self.tree.check()
        locks: dict[int, int] = {}
        for h in self.held.values():
            assert tuple(h.tokens[:h.cached]) in self.tree.sequences() or h.cached == 0, "held prefix not cached"
            assert h.node.end == h.cached and h.node.stamp != -1, "request's node is not its cached prefix"
            assert h.slots == -(-(h.computed - h.cached) // self.page_size) * self.page_size, "private slots"
            m = h.node
            while m is not self.tree.root:
                locks[m.uid] = locks.get(m.uid, 0) + 1
                m = m.parent
        for n in self.tree.nodes():
            assert n.lock_ref == locks.get(n.uid, 0), f"node {n.uid}: lock count {n.lock_ref} is not exact"
        c = self.classes()
        assert min(c.locked, c.private, c.page_slack, c.evictable, c.free) >= 0, c
        assert c.locked + c.private + c.page_slack + c.evictable + c.free == self.capacity, c
        self.usage().check()


def request_tokens(request, output_tokens: int) -> Tokens:
    """A request's token sequence (prompt, then its outputs) for the radix cache.

    Real ``token_ids`` are used as they are, and so are the answer's ``output_token_ids``
    when the request knows them (a conversation's next turn resends them: it then shares the
    answer too). Otherwise the shared part is named by what the trace says is shared:
    Mooncake ``hash_ids`` (token j of 512-token block ``h`` is (h, j)) or a ``prefix_id``
    (token j of it is (id, j)); every other token, and every generated one without
    ``output_token_ids``, is unique to the request. Tokens are tagged ints so kinds never collide:
    ``value * 4 + kind`` (0 real, 1 hash block, 3 request-unique) and ``("p", id, j)`` for
    named prefixes. Built once per request, from ranges where it can (C speed).
    """
    P, rid = request.prompt_tokens, request.request_id
    parts: list = []
    shared = 0
    if request.token_ids is not None:
        parts.append(tuple(t * 4 for t in request.token_ids))
        shared = P
        answer = getattr(request, "output_token_ids", None)
        if answer is not None:
            parts.append(tuple(t * 4 for t in answer[:output_tokens]))
            shared += min(len(answer), output_tokens)
    elif request.hash_ids:
        hb = request.hash_block_tokens
        for h in request.hash_ids:
            n = min(hb, P - shared)
            if n <= 0:
                break
            base = h * hb
            parts.append(range(base * 4 + 1, (base + n) * 4 + 1, 4))
            shared += n
    elif request.prefix_id is not None and request.prefix_tokens:
        shared = min(request.prefix_tokens, P)
        parts.append(tuple(("p", request.prefix_id, j) for j in range(shared)))
    base = rid << 40
    parts.append(range((base + shared) * 4 + 3, (base + P + output_tokens) * 4 + 3, 4))
    out: list = []
    for p in parts:
        out.extend(p)
    return tuple(out)


_INT64_MAX = 2**63 - 1


def packed_tokens(request, output_tokens: int) -> array | None:
    """:func:`request_tokens`' values in an ``array('q')``: 8 bytes a token and no int object
    per token (a tuple of fresh ints costs 40), which is what the SGLang scheduler holds for
    every waiting and running request. None where a value is not a 64-bit int: a named
    prefix's tokens (tuples), ids from 2**61 on, request ids from 2**21 on."""
    P, rid = request.prompt_tokens, request.request_id
    parts: list[np.ndarray] = []
    shared = 0
    try:
        if request.token_ids is not None:
            parts.append(_times4(request.token_ids))
            shared = P
            answer = getattr(request, "output_token_ids", None)
            if answer is not None:
                parts.append(_times4(answer[:output_tokens]))
                shared += min(len(answer), output_tokens)
        elif request.hash_ids:
            hb = request.hash_block_tokens
            for h in request.hash_ids:
                n = min(hb, P - shared)
                if n <= 0:
                    break
                base = h * hb
                parts.append(_range4(base, base + n, 1))
                shared += n
        elif request.prefix_id is not None and request.prefix_tokens:
            return None
        base = rid << 40
        parts.append(_range4(base + shared, base + P + output_tokens, 3))
    except (OverflowError, TypeError, ValueError):
        return None
    out = array("q")
    out.frombytes(np.concatenate(parts).tobytes())
    return out


def _times4(ids) -> np.ndarray:
    """Real token ids, tagged (``id * 4``), as int64; TypeError unless they are ints,
    OverflowError if one does not fit."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64)
    a = np.asarray(ids)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise TypeError("token ids are not integers")
    if int(a.max()) > _INT64_MAX // 4 or int(a.min()) < -(_INT64_MAX // 4):
        raise OverflowError("token id past int64 / 4")
    return a.astype(np.int64) * 4


def _range4(start: int, stop: int, kind: int) -> np.ndarray:
    """``value * 4 + kind`` for value in start..stop - 1, as int64; OverflowError if one does not fit."""
    if stop > start and (start < 0 or (stop - 1) * 4 + kind > _INT64_MAX):
        raise OverflowError("token past int64")
    return np.arange(start, max(start, stop), dtype=np.int64) * 4 + kind
