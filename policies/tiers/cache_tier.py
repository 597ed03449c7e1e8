"""One cache tier below the GPU pool: a bounded set of block contents (DESIGN.md "Cache tiers").

A tier (CPU memory, a local disk) keeps copies of prefix blocks the GPU computed, so a
request whose prefix the GPU has evicted can load it instead of computing it again. This
module is the tier's bookkeeping only: which contents it holds, since when they are
readable, and which one goes when room is needed. When to store and load, and what a
transfer costs, is the tier stack's business (``policies.tiers.tier_stack``).

- An entry is a block's content identity (the key the GPU prefix cache names it by) with
  ``ready_s``: when the transfer that stores it ends (s). A lookup at ``now`` sees only
  entries ready by then; an entry whose store is still in flight takes room already.
- ``store`` takes a run of keys (a request's consecutive blocks, each with its parent) and
  inserts those not present, first to last: a full tier first evicts one entry by its
  eviction order (``policies.indexes.eviction_order``: LRU, LFU, FIFO, ARC, priority). Under
  ``priority`` only leaves may go (an entry none of whose children is in the tier), as
  TensorRT-LLM's host cache does, so a stored chain never loses its middle. If nothing
  may go (or the capacity is 0) that key's store is dropped and counted. The evicted
  entries come back with their parent and priority (a lower tier may store them).
- ``use`` is a load reading entries: one more use each (LFU, ARC's T2, priority raised).

Times are the tier's own logical clock (one tick per stored or used key), so two engines
that make the same calls get the same victims. ``policies.reference.tier`` is the same
rules kept plainly: the oracle this module is tested against.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvsim.policies.indexes.eviction_order import EvictionOrder

Evicted = tuple[Hashable, Hashable | None, int]
"""An evicted entry: (key, its parent, its priority)."""


class QueueOrder:
    """LRU or FIFO as one ordered dict, O(1) per operation: the same victims as
    ``EvictionOrder`` with that policy (every entry evictable, ticks all distinct, so the
    smallest key is the queue's head). A tier stores and evicts a block at a time, so this
    is its hot path; LFU, ARC and priority keep the general order."""

    def __init__(self, policy: str):
        self.recency = policy == "lru"  # fifo: a use does not move an entry
        self.entries: OrderedDict[Hashable, None] = OrderedDict()

    @property
    def num_filed(self) -> int:
        return len(self.entries)

    def insert(self, key: Hashable, now: int, priority: int = 0) -> None:
        self.entries[key] = None

    def offer(self, key: Hashable) -> None:
        """(Every entry is evictable from insertion on.)"""

    def hit(self, key: Hashable, now: int, priority: int = 0) -> None:
        if self.recency:
            self.entries.move_to_end(key)

    def evict(self, can_go: object = None) -> Hashable | None:
        return self.entries.popitem(last=False)[0] if self.entries else None

    def check(self) -> None:
        """(Nothing can drift: the dict is the order.)"""


class CacheTier:
    """``capacity_blocks`` block contents under one eviction policy (module docstring)."""

    def __init__(self, name: str, capacity_blocks: int, eviction: str = "lru"):
        if capacity_blocks < 0:
            raise ValueError(f"tier {name!r}: capacity must be >= 0 blocks, got {capacity_blocks}")
        self.name = name
        self.capacity = capacity_blocks
        self.eviction = eviction
        self.order: EvictionOrder | QueueOrder = (
            QueueOrder(eviction) if eviction in ("lru", "fifo") else EvictionOrder(eviction, capacity_blocks))
        self.ready_s: dict[Hashable, float] = {}  # key -> when its store ends (s)
        self.leaf_only = eviction == "priority"
        self.meta: dict[Hashable, tuple[Hashable | None, int]] = {}  # key -> (its parent, priority)
        self.children: dict[Hashable, int] = {}  # key -> its children in the tier, held or not (leaf-only)
        self._now = 0
        # counters (blocks)
        self.stored_blocks = 0
        self.dropped_blocks = 0
        self.evictions = 0
        self.hit_blocks = 0

    def __len__(self) -> int:
        return len(self.ready_s)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.ready_s

    def ready(self, key: Hashable, now: float) -> bool:
        """Is ``key`` held and its store finished by ``now`` (s)?"""
        t = self.ready_s.get(key)
        return t is not None and t <= now

    def ready_run(self, keys: Sequence[Hashable], now: float) -> int:
        """How many of ``keys``, from the first, are ready by ``now``."""
        get, n = self.ready_s.get, 0
        for key in keys:
            t = get(key)
            if t is None or t > now:
                break
            n += 1
        return n

    # --- what happens to entries -------------------------------------------------------------
    def store(self, keys: Sequence[Hashable], parents: Sequence[Hashable | None], ready_s: float,
              priorities: Sequence[int]) -> tuple[list[Hashable], list[Evicted]]:
        """Store the ``keys`` not held yet, first to last, readable from ``ready_s`` (s);
        ``parents[i]``: the parent of ``keys[i]`` (None: a chain's first block), stored by a
        request of priority ``priorities[i]``. Returns the keys stored and the entries
        evicted to make room, as (key, parent, priority)."""
        stored: list[Hashable] = []
        evicted: list[Evicted] = []
        held, order, meta = self.ready_s, self.order, self.meta
        for key, parent, priority in zip(keys, parents, priorities):
            if key in held:
                continue
            if len(held) >= self.capacity:
                victim = order.evict(self._is_leaf if self.leaf_only else None)
                if victim is None:
                    self.dropped_blocks += 1
                    continue
                evicted.append((victim, *self._forget(victim)))
            self._now += 1
            order.insert(key, self._now, priority)
            order.offer(key)
            held[key] = ready_s
            meta[key] = (parent, priority)
            if self.leaf_only:
                if parent is not None:
                    self.children[parent] = self.children.get(parent, 0) + 1
            stored.append(key)
        self.stored_blocks += len(stored)
        self.evictions += len(evicted)
        return stored, evicted

    def use(self, keys: Sequence[Hashable], priority: int = 0) -> None:
        """A load read ``keys`` (each held): one more use of each."""
        order, meta = self.order, self.meta
        for key in keys:
            self._now += 1
            order.hit(key, self._now, priority)
            parent, p = meta[key]
            if priority > p:
                meta[key] = (parent, priority)
        self.hit_blocks += len(keys)

    def _is_leaf(self, key: Hashable) -> bool:
        return key not in self.children

    def _forget(self, key: Hashable) -> tuple[Hashable | None, int]:
        """``key`` was evicted (the order has dropped it already): its (parent, priority)."""
        del self.ready_s[key]
        parent, priority = self.meta.pop(key)
        if self.leaf_only:
            if parent is not None:
                left = self.children[parent] - 1
                if left:
                    self.children[parent] = left
                else:
                    del self.children[parent]
                    if parent in self.ready_s:
                        self.order.offer(parent)  # a leaf again: it may go
        return parent, priority

    # --- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the tier's books disagree (tests call this)."""
        assert len(self.ready_s) <= self.capacity, f"tier {self.name}: over capacity"
        assert set(self.order.entries) == set(self.ready_s) == set(self.meta), f"tier {self.name}: books differ"
        self.order.check()
        if self.leaf_only:
            counts: dict[Hashable, int] = {}
            for parent, _ in self.meta.values():
                if parent is not None:
                    counts[parent] = counts.get(parent, 0) + 1
            assert counts == self.children, f"tier {self.name}: child counts are not exact"
            for key, e in self.order.entries.items():
                if key not in self.children:
                    assert e.filed, f"tier {self.name}: leaf {key!r} is not evictable"
        else:
            assert self.order.num_filed == len(self.ready_s), f"tier {self.name}: an entry is not evictable"
