"""The reference radix cache: SGLang's token tree of cached KV, written to be read.

This is the oracle the fast ``RadixCacheAllocator`` is tested against (DESIGN.md,
"Performance principle, and the reference"), and the place to learn the rules. It keeps
no heap, no stamps and no running counts: which tokens are locked, evictable or free is
recomputed from the tree and the running requests whenever it is asked (slow, plain).

::

    root ─ [s y s t e m] ─┬─ [q 1 ...]        a node holds a run of tokens no cached
                          └─ [q 2] ─ [a n s]  sequence branches inside of

    request A  tokens (s y s t e m q 1 ...)   cached 7: it locks root..[q 1 ...]'s parent path
               computed 9, slots 2            its own 2 tokens live in 2 private slots

Rules (one place each):

- **Pages.** With ``page_size`` P every key is whole pages: a match or an insertion covers
  ``len // P * P`` tokens; a child is found by its first page (P = 1: its first token).
- **Split.** A match or insertion that stops inside a node splits it there: the upper
  part becomes a new node (the next creation number) with the same access time, hits,
  creation time and priority; the lower part keeps its identity.
- **Access.** Every match or insertion is one tick of a logical clock; each node it passes
  gets that tick as its last access and one more hit (an insertion also raises the node's
  priority to the request's). A new leaf is created, and last accessed, at that tick.
- **Locks.** A running request locks every node from the root to the last node of its
  cached prefix; a node is locked while any running request's path goes through it.
- **Eviction.** Repeatedly, the unlocked node with no children and the smallest policy key
  goes, whole: ``lru`` (last access), ``lfu`` (hits, then last access), ``fifo``
  (creation), ``priority`` (priority, then last access); ties: the older creation number.
  ``arc`` (kvsim's, not SGLang's): Adaptive Replacement Cache over the nodes, plainly in
  ``policies.reference.eviction``: a node starts in T1 when created (in T2 if a ghost
  list remembers its (end, tokens)), every later match or insertion through it moves it to
  T2; a split's upper part copies its node's lists and times; ARC's ``c`` is the capacity
  in pages.
- **Duplicates.** A request that inserts tokens already cached frees its own copies of them.
- A request computes into private slots (whole pages); after each prefill chunk its computed
  whole pages join the tree, and at its end its prompt and output do (the unaligned tail
  is freed); a retracted request's private slots are freed and nothing is inserted.

Cache tiers (``allocator.tiers``) name a page by the tuple of its sequence's tokens from the
first up to the page's end (two sequences share a page exactly when those agree; the fast
cache interns the same thing as a chain of (parent page, page tokens)). With
``log_evictions`` every evicted node's pages are appended to ``evicted`` as (name, parent
page's name or None, the node's priority), first to last (write-back).

Memory classes (slots, summing to ``capacity``): ``token_states`` = tree tokens on a running
request's path plus the running requests' private tokens; ``reserved`` = private slack up to
a request's final length; ``internal_frag`` = private slack past it; ``free`` = free slots and
every unlocked tree token (they can be taken at once).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvsim.policies.reference.eviction import PlainEvictionOrder
from kvsim.policies.reference.paged import Memory

EVICTION_KEYS = {
    "lru": lambda n: (n.last_access,),
    "lfu": lambda n: (n.hits, n.last_access),
    "fifo": lambda n: (n.created,),
    "priority": lambda n: (n.priority, n.last_access),
}


@dataclass(eq=False)
class RadixNode:
    """A run of cached tokens below ``parent``; ``number`` is its creation order."""

    tokens: tuple
    parent: RadixNode | None
    number: int
    created: int = 0  # clock tick of the insertion that created its tokens
    last_access: int = 0  # clock tick of the last match or insertion through it
    hits: int = 0  # matches and insertions through it
    priority: int = 0  # the highest priority of a request that inserted through it
    children: dict[Hashable, RadixNode] = field(default_factory=dict)  # by first token (page)

    def path(self) -> list[RadixNode]:
        """The nodes from below the root down to this one."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def end(self) -> int:
        """Tokens from the root through this node."""
        return sum(len(n.tokens) for n in self.path())


@dataclass
class Holding:
    """A running request's KV: its first ``cached`` tokens are tree tokens (through ``node``),
    tokens ``cached``..``computed`` sit in ``slots`` private slots (whole pages)."""

    tokens: Sequence[Hashable]
    node: RadixNode
    cached: int
    computed: int
    slots: int
    final_len: int  # tokens it holds at its last step (prompt + output - 1)
    priority: int = 0  # its request's (raises the priority of the nodes it inserts through)


class ReferenceRadixCache:
    """``capacity`` token slots in pages of ``page_size``; a radix tree of cached tokens;
    the running requests' holdings. Driven by ``simulator.reference.sglang``."""

    def __init__(self, capacity: int, page_size: int = 1, eviction: str = "lru"):
        if eviction not in EVICTION_KEYS and eviction != "arc":
            raise ValueError(f"eviction policy must be one of {', '.join(EVICTION_KEYS)}, arc, got {eviction!r}")
        self.page_size = self.block_size = page_size
        self.capacity = capacity // page_size * page_size
        self.eviction = eviction
        self.root = RadixNode((), None, 0)
        self.clock = 0
        self.created_nodes = 0  # the last creation number given
        self.free_slots = self.capacity  # neither in the tree nor private to a request
        self.held: dict[int, Holding] = {}
        self.prefix_lookups = 0  # tokens looked up by admitted requests
        self.prefix_hits = 0  # ... of which were cached
        self.evictions = 0  # tokens evicted
        # arc: T1/T2, ghosts and the target p, kept plainly (ghost: where a node ends, its tokens)
        self.arc = PlainEvictionOrder("arc", self.capacity // page_size, lambda n: (n.end(), n.tokens))
        self.log_evictions = False  # cache tiers with write-back: note evicted pages
        self.evicted: list[tuple[tuple, tuple | None, int]] = []  # (page name, parent's, priority)

    # --- what the tree holds (recomputed on every question) -----------------------------
    def nodes(self) -> list[RadixNode]:
        out, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(node.children.values())
        return out

    def locked(self) -> set[int]:
        """ids of the nodes some running request's path goes through."""
        return {id(n) for h in self.held.values() for n in h.node.path()}

    def tree_tokens(self) -> int:
        return sum(len(n.tokens) for n in self.nodes())

    def evictable_tokens(self) -> int:
        locked = self.locked()
        return sum(len(n.tokens) for n in self.nodes() if id(n) not in locked)

    def available(self) -> int:
        """Slots a request may take: the free ones and every unlocked cached token."""
        return self.free_slots + self.evictable_tokens()

    # --- the tree -----------------------------------------------------------------------
    def edge(self, tokens: Sequence[Hashable], pos: int) -> Hashable:
        P = self.page_size
        return tokens[pos] if P == 1 else tuple(tokens[pos:pos + P])

    def common(self, key: tuple, tokens: Sequence[Hashable], pos: int, n: int) -> int:
        """Whole pages ``key`` shares with ``tokens[pos:n]``."""
        P, k = self.page_size, 0
        longest = min(len(key), n - pos)
        if key[:longest] == tuple(tokens[pos:pos + longest]):
            return longest
        while k + P <= longest and key[k:k + P] == tuple(tokens[pos + k:pos + k + P]):
            k += P
        return k

    def new_node(self, tokens: tuple, parent: RadixNode, **times) -> RadixNode:
        self.created_nodes += 1
        node = RadixNode(tokens, parent, self.created_nodes, **times)
        parent.children[self.edge(tokens, 0)] = node
        return node

    def split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut ``node`` after ``k`` tokens; the upper part is a new node, same times."""
        upper = self.new_node(node.tokens[:k], node.parent, created=node.created,
                              last_access=node.last_access, hits=node.hits, priority=node.priority)
        if self.eviction == "arc":
            self.arc.copy(upper, node)
        node.tokens = node.tokens[k:]
        node.parent = upper
        upper.children[self.edge(node.tokens, 0)] = node
        return upper

    def walk(self, tokens: Sequence[Hashable], n: int, priority: int | None) -> tuple[int, RadixNode]:
        """Follow ``tokens[:n]`` down, splitting where it stops inside a node, touching every
        node passed: (tokens matched, the last node)."""
        node, pos = self.root, 0
        while pos < n and self.edge(tokens, pos) in node.children:
            child = node.children[self.edge(tokens, pos)]
            k = self.common(child.tokens, tokens, pos, n)
            if k < len(child.tokens):
                child = self.split(child, k)
            child.last_access = self.clock
            child.hits += 1
            if priority is not None:
                child.priority = max(child.priority, priority)
            if self.eviction == "arc":
                self.arc.hit(child, self.clock)
            node, pos = child, pos + k
        return pos, node

    def match(self, tokens: Sequence[Hashable], limit: int) -> tuple[int, RadixNode]:
        """Longest cached whole-page prefix of ``tokens[:limit]``."""
        self.clock += 1
        n = min(limit, len(tokens)) // self.page_size * self.page_size
        return self.walk(tokens, n, None)

    def insert(self, tokens: Sequence[Hashable], upto: int, priority: int = 0) -> tuple[int, RadixNode]:
        """Cache ``tokens[:upto]`` (whole pages): (tokens that were cached already, last node)."""
        self.clock += 1
        n = upto // self.page_size * self.page_size
        pos, node = self.walk(tokens, n, priority)
        if pos < n:
            node = self.new_node(tuple(tokens[pos:n]), node, created=self.clock, last_access=self.clock,
                                 hits=1, priority=priority)
            if self.eviction == "arc":
                self.arc.insert(node, self.clock, priority, (node.end(), node.tokens))
        return pos, node

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked childless nodes, smallest policy key first, until ``num_tokens``
        are freed or none is left; returns the tokens freed (whole nodes)."""
        freed = 0
        while freed < num_tokens:
            locked = self.locked()
            leaves = [n for n in self.nodes() if not n.children and id(n) not in locked]
            if not leaves:
                break
            if self.eviction == "arc":
                victim = self.arc.victim(leaves)
            else:
                key = EVICTION_KEYS[self.eviction]
                victim = min(leaves, key=lambda n: (key(n), n.number))
            if self.log_evictions:
                self.log_pages(victim)
            del victim.parent.children[self.edge(victim.tokens, 0)]
            freed += len(victim.tokens)
        self.evictions += freed
        return freed

    def log_pages(self, node: RadixNode) -> None:
        """Note ``node``'s pages, first to last, as evicted (write-back into a cache tier)."""
        path = tuple(t for n in node.path() for t in n.tokens)
        P, end = self.page_size, len(path)
        for stop in range(end - len(node.tokens) + P, end + 1, P):
            self.evicted.append((path[:stop], path[:stop - P] if stop > P else None, node.priority))

    # --- a request's life ---------------------------------------------------------------
    def open(self, rid: int, tokens: Sequence[Hashable], num_tokens: int, final_len: int,
             priority: int = 0) -> int:
        """A request (of ``priority``) starts computing ``tokens[:num_tokens]``: it locks its
        longest cached prefix, at most ``num_tokens - 1`` tokens (it computes one at least).
        Returns the hit."""
        hit, node = self.match(tokens, num_tokens - 1)
        self.held[rid] = Holding(tokens, node, hit, hit, 0, final_len, priority)
        return hit

    def count_lookup(self, num_tokens: int, hit: int) -> None:
        self.prefix_lookups += num_tokens
        self.prefix_hits += hit

    def slots_to_extend(self, rid: int, n: int) -> int:
        """Free slots ``n`` more tokens of a request would take (its private pages grow)."""
        h, P = self.held[rid], self.page_size
        pages = -(-(h.computed + n - h.cached) // P)
        return max(0, pages * P - h.slots)

    def extend(self, rid: int, n: int) -> bool:
        """Slots for ``n`` more tokens, evicting when the free ones run short; False (and
        nothing changes) if even evicting every unlocked token would not do."""
        need = self.slots_to_extend(rid, n)
        if need > self.available():
            return False
        if need > self.free_slots:
            self.free_slots += self.evict(need - self.free_slots)
        self.free_slots -= need
        h = self.held[rid]
        h.slots += need
        h.computed += n
        return True

    def cache(self, rid: int) -> None:
        """The request's computed whole pages join the tree; the ones it finds there already
        are duplicates and its own slots for them are freed; its lock moves down."""
        h = self.held[rid]
        upto = h.computed // self.page_size * self.page_size
        if upto <= h.cached:
            return
        present, node = self.insert(h.tokens, upto, h.priority)
        self.free_slots += present - h.cached  # duplicates
        h.slots -= upto - h.cached  # the rest are tree tokens now
        h.node, h.cached = node, upto

    def finish(self, rid: int) -> None:
        """The request ended: its tokens join the tree, its private remainder is freed."""
        self.cache(rid)
        self.release(rid)

    def release(self, rid: int) -> None:
        """Free the request's private slots and unlock its path (nothing inserted)."""
        self.free_slots += self.held.pop(rid).slots

    def kv_len(self, rid: int) -> int:
        return self.held[rid].computed

    # --- memory -------------------------------------------------------------------------
    def memory(self) -> Memory:
        locked = self.locked()
        locked_tokens = sum(len(n.tokens) for n in self.nodes() if id(n) in locked)
        private = reserved = frag = unshared = 0
        P = self.page_size
        for h in self.held.values():
            private += h.computed - h.cached
            end = h.cached + h.slots  # one past its last slot's position
            last = max(h.final_len, h.computed)
            reserved += min(end, last) - h.computed
            frag += max(0, end - last)
            unshared += -(-h.computed // P) * P
        free = self.free_slots + self.evictable_tokens()
        return Memory(self.capacity, locked_tokens + private, reserved, frag, free, unshared)

    def check(self) -> None:
        """Raise AssertionError unless every slot is in exactly one place."""
        P = self.page_size
        for n in self.nodes():
            assert n.tokens and len(n.tokens) % P == 0, "a node is not whole pages"
            assert n.parent.children[self.edge(n.tokens, 0)] is n, "a broken parent link"
        private = 0
        for h in self.held.values():
            assert h.node is self.root or h.node in self.nodes(), "a request holds an evicted node"
            assert h.node.end() == h.cached, "a request's node does not end its cached prefix"
            assert h.slots == -(-(h.computed - h.cached) // P) * P, "private slots are not whole pages"
            private += h.slots
        assert self.free_slots >= 0
        assert self.tree_tokens() + private + self.free_slots == self.capacity, "slots not conserved"
        m = self.memory()
        assert m.token_states + m.reserved + m.internal_frag + m.free == self.capacity
