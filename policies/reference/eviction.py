"""Eviction orders written to be read: the oracle for ``policies.indexes.eviction_order``.

The same rules as the fast module (read its docstring for the policies and for ARC, after
Megiddo and Modha, FAST 2003), kept plainly: every cached entry's facts in a dict, the
ghost lists as Python lists, and the victim found by scanning the evictable entries the
cache names for the smallest key. No heaps, no stamps, nothing filed: the cache says, at
each eviction, which entries may go. The reference engines (``reference.paged``'s v1
allocator, ``reference.radix``) use this class and never the fast one.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

POLICIES = ("lru", "lfu", "fifo", "arc", "priority")


@dataclass
class Facts:
    """One cached entry: when it was inserted (``number``: the insertion order, the tie-break),
    when last used or passed, how many requests used it, the highest priority among them,
    and which ARC list it is in (1: used once since cached, 2: used again)."""

    number: int
    created: int
    last: int
    uses: int
    priority: int
    ghost: Hashable
    arc_list: int = 1


class PlainEvictionOrder:
    """``capacity``: entries the cache holds at most (ARC's ``c``)."""

    def __init__(self, policy: str, capacity: int, ghost_of=None):
        """``ghost_of(key)``: what a ghost list remembers an entry by when it is evicted
        (default: the ``ghost`` it was inserted with, else its key)."""
        if policy not in POLICIES:
            raise ValueError(f"eviction policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.capacity = capacity
        self.ghost_of = ghost_of
        self.facts: dict[Hashable, Facts] = {}
        self.inserted = 0
        self.p = 0  # ARC: the target size of T1
        self.b1: list[Hashable] = []  # ARC ghosts of entries evicted from T1, oldest first
        self.b2: list[Hashable] = []  # ... from T2

    def key(self, f: Facts) -> tuple:
        """Smallest goes first; the insertion number breaks ties."""
        if self.policy in ("lru", "arc"):
            return (f.last, f.number)
        if self.policy == "lfu":
            return (f.uses, f.last, f.number)
        if self.policy == "fifo":
            return (f.created, f.number)
        return (f.priority, f.last, f.number)

    def insert(self, key: Hashable, now: int, priority: int = 0, ghost: Hashable | None = None) -> None:
        ghost = key if ghost is None else ghost
        self.inserted += 1
        facts = Facts(self.inserted, now, now, 1, priority, ghost)
        if self.policy == "arc":
            if ghost in self.b1:  # evicted from T1 too early: give T1 more room
                self.p = min(self.capacity, self.p + max(1, len(self.b2) // len(self.b1)))
                self.b1.remove(ghost)
                facts.arc_list = 2
            elif ghost in self.b2:  # evicted from T2 too early: give T2 more room
                self.p = max(0, self.p - max(1, len(self.b1) // len(self.b2)))
                self.b2.remove(ghost)
                facts.arc_list = 2
        self.facts[key] = facts

    def copy(self, key: Hashable, like: Hashable, ghost: Hashable | None = None) -> None:
        """A new entry with ``like``'s facts (a radix node split in two)."""
        src = self.facts[like]
        self.inserted += 1
        self.facts[key] = Facts(self.inserted, src.created, src.last, src.uses, src.priority,
                                key if ghost is None else ghost, src.arc_list)

    def hit(self, key: Hashable, now: int, priority: int = 0) -> None:
        f = self.facts[key]
        f.uses += 1
        f.last = now
        f.priority = max(f.priority, priority)
        f.arc_list = 2

    def touch(self, key: Hashable, now: int, priority: int = 0) -> None:
        f = self.facts[key]
        f.last = now
        f.priority = max(f.priority, priority)

    def remove(self, key: Hashable) -> None:
        del self.facts[key]

    def victim(self, evictable: Iterable[Hashable]) -> Hashable | None:
        """The entry to evict among ``evictable`` (None if there is none); it is removed (ARC:
        remembered in its ghost list)."""
        candidates = list(evictable)
        if not candidates:
            return None
        if self.policy != "arc":
            chosen = min(candidates, key=lambda k: self.key(self.facts[k]))
            del self.facts[chosen]
            return chosen
        t1 = [k for k in candidates if self.facts[k].arc_list == 1]
        t2 = [k for k in candidates if self.facts[k].arc_list == 2]
        t1_size = sum(1 for f in self.facts.values() if f.arc_list == 1)  # held entries count too
        if t1 and (t1_size > self.p or not t2):
            chosen, ghosts = min(t1, key=lambda k: self.key(self.facts[k])), self.b1
        else:
            chosen, ghosts = min(t2, key=lambda k: self.key(self.facts[k])), self.b2
        facts = self.facts.pop(chosen)
        ghost = facts.ghost if self.ghost_of is None else self.ghost_of(chosen)
        if ghost in ghosts:
            ghosts.remove(ghost)
        ghosts.append(ghost)
        if len(ghosts) > self.capacity:
            ghosts.pop(0)
        return chosen
