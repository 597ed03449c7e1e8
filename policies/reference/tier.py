"""One cache tier written to be read: the oracle for ``policies.tiers.cache_tier.CacheTier``.

A tier below the GPU pool (CPU memory, a disk) keeps copies of prefix blocks, named by the
key the GPU prefix cache gives each block's content. The same rules as the fast module
(tierspec, "Contents of a tier"), kept plainly::

    entries   key -> TierEntry(ready_s, parent, priority)   in insertion order
    order     PlainEvictionOrder: each entry's facts (stored, last used, uses, priority)
    clock     +1 per stored key and per key a load uses (the tier's own logical time)

- An entry counts for a lookup at ``now`` only once its store transfer has ended
  (``ready_s <= now``); while in flight it already takes room.
- ``store`` walks a run of keys first to last; a key already held is skipped (no refresh).
  A new key into a full tier first evicts the eviction order's victim among the entries
  that may go: every entry, except under ``priority``, where only leaves may (no entry in
  the tier names it as its parent: TensorRT-LLM's host cache never loses a chain's middle).
  If none may go, or the capacity is 0, that key's store is dropped (counted).
- ``use`` is a load reading held entries: one more use each (eviction facts: a hit), and
  the entry's priority rises to the loading request's. An evicted entry leaves with its
  parent and priority (a lower tier that stores what this one evicts keeps them).

Children are counted by scanning the entries, never kept in a counter: the fast module's
counters are what this checks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvsim.policies.reference.eviction import PlainEvictionOrder

Evicted = tuple[Hashable, Hashable | None, int]
"""An evicted entry: (key, its parent, its priority)."""


@dataclass(eq=False)
class TierEntry:
    """One held block content: when its store transfer ends (s; ``inf`` while the engine
    does not know yet), its parent's key (None: the first block of a chain) and its priority
    (the highest of the request that stored it and the requests whose loads read it)."""

    ready_s: float
    parent: Hashable | None
    priority: int = 0


@dataclass(eq=False)
class PlainTier:
    """``capacity`` block contents under one ``eviction`` policy (module docstring); the
    counters are in blocks."""

    name: str
    capacity: int  # blocks
    eviction: str = "lru"
    entries: dict[Hashable, TierEntry] = field(default_factory=dict)
    clock: int = 0
    stored_blocks: int = 0  # keys stored
    dropped_blocks: int = 0  # keys that found no room
    evictions: int = 0  # entries evicted to make room
    hit_blocks: int = 0  # keys loads read

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(
                f"tier {self.name!r}: capacity must be >= 0 blocks, got {self.capacity}")
        self.order = PlainEvictionOrder(self.eviction, self.capacity)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: Hashable) -> bool:
        """Held: ready or still in flight."""
        return key in self.entries

    def ready(self, key: Hashable, now: float) -> bool:
        """Is ``key`` held and its store ended by ``now`` (s)?"""
        return key in self.entries and self.entries[key].ready_s <= now

    def ready_run(self, keys: Sequence[Hashable], now: float) -> int:
        """How many of ``keys``, from the first, are ready by ``now`` (s)."""
        n = 0
        while n < len(keys) and self.ready(keys[n], now):
            n += 1
        return n

    @property
    def meta(self) -> dict[Hashable, tuple[Hashable | None, int]]:
        """Every entry's (parent, priority)."""
        return {k: (e.parent, e.priority) for k, e in self.entries.items()}

    def children(self, key: Hashable) -> int:
        """Entries whose parent is ``key`` (a scan)."""
        return sum(1 for e in self.entries.values() if e.parent == key)

    def may_go(self, key: Hashable) -> bool:
        """May ``key`` be evicted? Always, but under ``priority`` only a leaf."""
        return self.eviction != "priority" or self.children(key) == 0

    # --- what happens to entries -------------------------------------------------------------
    def store(
        self,
        keys: Sequence[Hashable],
        parents: Sequence[Hashable | None],
        ready_s: float,
        priorities: Sequence[int],
    ) -> tuple[list[Hashable], list[Evicted]]:
        """Store the ``keys`` not held yet, first to last, readable from ``ready_s`` (s);
        ``parents[i]`` and ``priorities[i]`` are the parent and priority of ``keys[i]``.
        Returns (keys stored, entries evicted to make room as (key, parent, priority))."""
        stored: list[Hashable] = []
        evicted: list[Evicted] = []
        for key, parent, priority in zip(keys, parents, priorities):
            if key not in self.entries and self.make_room(evicted):
                self.clock += 1
                self.order.insert(key, self.clock, priority)
                self.entries[key] = TierEntry(ready_s, parent, priority)
                self.stored_blocks += 1
                stored.append(key)
        return stored, evicted

    def make_room(self, evicted: list[Evicted]) -> bool:
        """Is there room for one more entry? A full tier evicts the order's victim among the
        entries that may go (appended to ``evicted``); if none may go, the store is dropped."""
        if len(self.entries) < self.capacity:
            return True
        victim = self.order.victim(k for k in self.entries if self.may_go(k))
        if victim is None:
            self.dropped_blocks += 1
            return False
        gone = self.entries.pop(victim)
        evicted.append((victim, gone.parent, gone.priority))
        self.evictions += 1
        return True

    def use(self, keys: Sequence[Hashable], priority: int = 0) -> None:
        """A load read ``keys`` (each held), for a request of ``priority``."""
        for key in keys:
            self.clock += 1
            self.order.hit(key, self.clock, priority)
            entry = self.entries[key]
            entry.priority = max(entry.priority, priority)
        self.hit_blocks += len(keys)

    # --- invariants -----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError unless the tier is within capacity and the eviction order
        knows exactly the held entries."""
        assert len(self.entries) <= self.capacity, f"tier {self.name}: over capacity"
        assert set(self.order.facts) == set(self.entries), (
            f"tier {self.name}: the eviction order and the entries differ"
        )
