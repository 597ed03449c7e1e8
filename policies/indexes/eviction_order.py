"""Which cached entry goes first: the eviction order of a prefix cache, one policy per class.

A prefix cache (vLLM's cached blocks, SGLang's radix nodes, later a CPU or disk tier) is
a set of cached *entries* with a capacity; when room is needed, one evictable entry goes.
This module keeps only the order. The cache says what happens to an entry and when
(``now`` is the cache's own logical clock, so two engines that see the same events get
the same order), and which entries may go::

    cache                          EvictionOrder
    ─────                          ─────────────
    entry used again          ──>  hit(key, now, priority)   frequency + 1, recency = now
    entry let go / passed     ──>  touch(key, now)           recency = now
    entry may be evicted      ──>  offer(key)                filed under its current key
    entry held again          ──>  withdraw(key)
    room needed               ──>  evict(now, can_go) -> key the smallest filed key

Policies (the entry with the smallest key goes; ties: the entry inserted first):

- ``lru``: (last use,)
- ``lfu``: (uses, last use): least frequently used, ties by recency
- ``fifo``: (insertion,)
- ``priority``: (priority, last use): the lowest request priority first, then LRU
- ``arc``: Adaptive Replacement Cache (N. Megiddo and D. S. Modha, "ARC: A Self-Tuning,
  Low Overhead Replacement Cache", FAST 2003). Entries used once since they were cached
  live in T1, entries used again in T2; entries evicted from T1 (T2) are remembered, keys
  only, in the ghost list B1 (B2). Inserting a key found in B1 means recency lists were too
  short: the target size ``p`` of T1 grows by ``max(1, |B2| // |B1|)`` (at most
  ``capacity``); found in B2, ``p`` shrinks by ``max(1, |B1| // |B2|)`` (at least 0); either
  way the entry starts in T2. A victim comes from T1 (its least recently used evictable
  entry) when T1 holds more than ``p`` entries or T2 has no evictable entry, else from T2.
  Ghost lists hold at most ``capacity`` keys each (the oldest is forgotten). Integer
  arithmetic, so an engine and its reference agree exactly. What differs from the paper,
  because a serving cache decides *when* to evict by memory, not by a miss: the victim
  choice does not look at the missed key (the paper's ``x in B2 and |T1| == p`` case), and
  held entries (a running request's blocks) stay in T1/T2 but are never victims.

What "evictable" means is the cache's rule, not the order's: SGLang's tree offers only
unlocked leaves (leaf-only eviction), vLLM's free queue offers only blocks no request holds.
``evict`` takes a ``can_go`` check so a cache may also leave an entry filed and let the
order drop it lazily when it stops being evictable (the radix tree does: a node that gains
a child or a lock is not withdrawn, it is skipped).

Cost: a heap with lazy deletion (a stamp per entry: a heap item whose stamp is not the
entry's is stale), so every operation is O(log n); ARC keeps one heap per list. The heap is
rebuilt when stale items outnumber live entries, so it stays O(entries).
``policies.reference.eviction`` is the same rules written plainly (a scan for the minimum):
the oracle this module is tested against.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

EVICTION_POLICIES = ("lru", "lfu", "fifo", "arc", "priority")


@dataclass(slots=True)
class Entry:
    """What the order knows of one cached entry (times are the cache's logical clock)."""

    seq: int  # insertion number: the tie-break
    created: int  # when it was inserted
    last: int  # when it was last hit or touched
    uses: int  # 1 + hits
    priority: int
    ghost: Hashable  # what a ghost list remembers it by (ARC)
    arc_list: int = 1  # 1: T1 (used once), 2: T2 (used again)
    stamp: int = 0  # renewed (from one counter for all entries, so a key cached again never
    # matches its old heap items) when its key changes or it is withdrawn; heap items carry it
    filed: bool = False  # offered and not withdrawn or evicted since


class EvictionOrder:
    """The eviction order of one cache under one policy (see the module docstring)."""

    def __init__(self, policy: str = "lru", capacity: int = 0,
                 ghost_of: Callable[[Hashable], Hashable] | None = None):
        """``ghost_of``: what ARC's ghost lists remember an evicted entry by, computed at its
        eviction (default: the ``ghost`` given at insertion, else its key)."""
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction policy must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.policy = policy
        self.capacity = capacity  # entries the cache can hold: ARC's c (bounds p and the ghosts)
        self.ghost_of = ghost_of
        self.entries: dict[Hashable, Entry] = {}
        self._seq = 0
        # ARC: list sizes (held entries too), T1's target size, ghost lists (oldest first)
        self.t_sizes = [0, 0, 0]  # index 1: |T1|, 2: |T2|
        self.p = 0
        self.ghosts: list[OrderedDict[Hashable, None]] = [OrderedDict(), OrderedDict(), OrderedDict()]
        # one heap, or per ARC list (index 1, 2), of (key, seq, stamp, entry key)
        self._heaps: list[list[tuple]] = [[], [], []]
        self._filed = 0  # entries filed
        self._stamps = 0  # the last stamp given

    # --- queries --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    @property
    def num_filed(self) -> int:
        """Entries offered as evictable (and not withdrawn or evicted since)."""
        return self._filed

    def sort_key(self, e: Entry) -> tuple:
        """The policy's key of an entry: the smallest goes first."""
        p = self.policy
        if p == "lru" or p == "arc":
            return (e.last,)
        if p == "lfu":
            return (e.uses, e.last)
        if p == "fifo":
            return (e.created,)
        return (e.priority, e.last)

    # --- what happens to entries -----------------------------------------------------------
    def insert(self, key: Hashable, now: int, priority: int = 0, ghost: Hashable | None = None) -> None:
        """``key`` is cached from ``now`` on (held, not yet evictable); ``ghost``: what ARC's
        ghost lists remember it by (default: ``key``), checked here for a ghost hit."""
        if key in self.entries:
            raise ValueError(f"{key!r} is already in the eviction order")
        g = key if ghost is None else ghost
        self._seq += 1
        e = self.entries[key] = Entry(self._seq, now, now, 1, priority, g)
        if self.policy == "arc":
            e.arc_list = self._arc_adapt(g)
            self.t_sizes[e.arc_list] += 1

    def copy(self, key: Hashable, like: Hashable, ghost: Hashable | None = None) -> None:
        """Insert ``key`` with the times, uses, priority and ARC list of ``like`` (a radix
        node split in two: both halves were touched together until now)."""
        src = self.entries[like]
        self._seq += 1
        e = self.entries[key] = Entry(self._seq, src.created, src.last, src.uses, src.priority,
                                      key if ghost is None else ghost, src.arc_list)
        if self.policy == "arc":
            self.t_sizes[e.arc_list] += 1

    def hit(self, key: Hashable, now: int, priority: int = 0) -> None:
        """A new request reuses the cached entry: one more use, recency ``now``, priority
        raised to the request's; ARC moves it to T2."""
        e = self.entries[key]
        e.uses += 1
        e.last = now
        if priority > e.priority:
            e.priority = priority
        if e.arc_list == 1 and self.policy == "arc":
            self.t_sizes[1] -= 1
            self.t_sizes[2] += 1
            e.arc_list = 2
        if e.filed:
            self._file(e, key)

    def touch(self, key: Hashable, now: int, priority: int = 0) -> None:
        """Recency only (``now``; priority raised): the entry was passed or let go, not reused."""
        e = self.entries[key]
        e.last = now
        if priority > e.priority:
            e.priority = priority
        if e.filed:
            self._file(e, key)

    def offer(self, key: Hashable) -> None:
        """The entry may be evicted (again filed under its current key)."""
        e = self.entries[key]
        if not e.filed:
            e.filed = True
            self._filed += 1
        self._file(e, key)

    def withdraw(self, key: Hashable) -> None:
        """The entry is held again: not a victim until offered again."""
        e = self.entries[key]
        if e.filed:
            e.filed = False
            self._filed -= 1
            e.stamp = self._new_stamp()

    def remove(self, key: Hashable) -> None:
        """The entry leaves the cache other than by eviction (no ghost is kept)."""
        e = self.entries.pop(key)
        if e.filed:
            self._filed -= 1
        if self.policy == "arc":
            self.t_sizes[e.arc_list] -= 1

    def evict(self, can_go: Callable[[Hashable], bool] | None = None) -> Hashable | None:
        """Remove and return the filed entry with the smallest key (None if none is filed).
        A filed entry for which ``can_go`` says False is skipped and no longer filed."""
        if self.policy == "arc":
            return self._arc_evict(can_go)
        return self._pop(0, can_go)

    # --- the heaps --------------------------------------------------------------------------
    def _heap_of(self, e: Entry) -> list[tuple]:
        return self._heaps[e.arc_list if self.policy == "arc" else 0]

    def _new_stamp(self) -> int:
        self._stamps += 1
        return self._stamps

    def _file(self, e: Entry, key: Hashable) -> None:
        e.stamp = self._new_stamp()
        heap = self._heap_of(e)
        heapq.heappush(heap, (self.sort_key(e), e.seq, e.stamp, key))
        if len(heap) > 2 * len(self.entries) + 64:  # stale items pile up: keep the heap O(entries)
            entries = self.entries
            heap[:] = [h for h in heap if (x := entries.get(h[3])) is not None and x.stamp == h[2] and x.filed]
            heapq.heapify(heap)

    def _head(self, i: int, can_go: Callable[[Hashable], bool] | None) -> Hashable | None:
        """The key of heap ``i``'s smallest live, evictable item (stale items dropped)."""
        heap, entries = self._heaps[i], self.entries
        while heap:
            _, _, stamp, key = heap[0]
            e = entries.get(key)
            if e is None or e.stamp != stamp or not e.filed:
                heapq.heappop(heap)
                continue
            if can_go is not None and not can_go(key):
                heapq.heappop(heap)
                e.filed = False
                self._filed -= 1
                e.stamp = self._new_stamp()
                continue
            return key
        return None

    def _pop(self, i: int, can_go: Callable[[Hashable], bool] | None) -> Hashable | None:
        key = self._head(i, can_go)
        if key is not None:
            heapq.heappop(self._heaps[i])
            self.remove(key)
        return key

    # --- ARC -------------------------------------------------------------------------------
    def _arc_adapt(self, ghost: Hashable) -> int:
        """A key inserted: adapt ``p`` on a ghost hit; return the list it starts in."""
        b1, b2 = self.ghosts[1], self.ghosts[2]
        if ghost in b1:
            self.p = min(self.capacity, self.p + max(1, len(b2) // len(b1)))
            del b1[ghost]
            return 2
        if ghost in b2:
            self.p = max(0, self.p - max(1, len(b1) // len(b2)))
            del b2[ghost]
            return 2
        return 1

    def _arc_evict(self, can_go: Callable[[Hashable], bool] | None) -> Hashable | None:
        t1 = self._head(1, can_go)
        t2 = self._head(2, can_go)
        if t1 is not None and (self.t_sizes[1] > self.p or t2 is None):
            i, key = 1, t1
        elif t2 is not None:
            i, key = 2, t2
        else:
            return None
        ghost = self.entries[key].ghost if self.ghost_of is None else self.ghost_of(key)
        heapq.heappop(self._heaps[i])
        self.remove(key)
        b = self.ghosts[i]
        b.pop(ghost, None)
        b[ghost] = None
        if len(b) > self.capacity:
            b.popitem(last=False)
        return key

    # --- invariants --------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if a count or a heap is wrong (tests call this)."""
        filed = [k for k, e in self.entries.items() if e.filed]
        assert len(filed) == self._filed, "filed count drifted"
        live = {}
        for i, heap in enumerate(self._heaps):
            for key_tuple, seq, stamp, key in heap:
                e = self.entries.get(key)
                if e is not None and e.stamp == stamp and e.filed:
                    assert key not in live, f"{key!r} filed twice"
                    assert key_tuple == self.sort_key(e), f"{key!r} filed under a stale key"
                    assert i == (e.arc_list if self.policy == "arc" else 0), f"{key!r} in the wrong heap"
                    live[key] = seq
        assert set(live) == set(filed), "a filed entry is missing from the heaps"
        if self.policy == "arc":
            sizes = [0, 0, 0]
            for e in self.entries.values():
                sizes[e.arc_list] += 1
            assert sizes[1:] == self.t_sizes[1:], "ARC list sizes drifted"
            assert 0 <= self.p <= self.capacity, "ARC target out of range"
            assert all(len(b) <= self.capacity for b in self.ghosts), "a ghost list outgrew the capacity"
