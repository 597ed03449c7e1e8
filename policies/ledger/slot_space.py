"""A linear space of token slots with real holes: where contiguous KV regions live.

A contiguous allocator gives each sequence one unbroken run of slots (a
*region*). Which run it gets is the *placement* policy, and placement decides
how badly free space shatters into holes that no request fits (external
fragmentation). Three placements share one interface:

- ``BuddySpace`` (Knuth's binary buddy system; Orca in the vLLM paper): sizes are
  rounded up to a power of two, regions are aligned to their size, and a freed
  block merges with its free *buddy* (the other half of the block it was split
  from). ``BuddySpace(..., trim_tail=True)`` ("buddy_exact") keeps the buddy
  structure but hands the rounded-up tail back at once, as Linux's
  ``alloc_pages_exact`` does, so a region takes exactly the slots asked for.
- ``FirstFitSpace``: exact sizes; the lowest-addressed hole that fits.
- ``BestFitSpace``: exact sizes; the smallest hole that fits (lowest address on ties).

All sizes and offsets are in token slots. Offsets run from 0 to ``capacity``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

PLACEMENTS = ("buddy", "buddy_exact", "first_fit", "best_fit")


# --- power-of-two arithmetic -----------------------------------------------------
def ceil_log2(n: int) -> int:
    """Smallest ``k`` with ``2**k >= n`` (n >= 1)."""
    return (n - 1).bit_length()


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (n >= 1)."""
    return 1 << ((n - 1).bit_length())


def aligned_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """Cover ``[start, end)`` with maximal power-of-two blocks, each aligned to its size.

    Returns ``(offset, order)`` pairs in address order; a block of order ``k``
    spans ``2**k`` slots and its offset is a multiple of ``2**k``. Greedy from
    the left: at each offset take the largest aligned block that still fits.
    From 0 this is the binary expansion of ``end``: 15,728 slots become
    8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16.
    """
    out: list[tuple[int, int]] = []
    while start < end:
        k = (end - start).bit_length() - 1  # largest block that fits
        if start:
            k = min(k, (start & -start).bit_length() - 1)  # largest alignment of start
        out.append((start, k))
        start += 1 << k
    return out


# --- the interface -----------------------------------------------------------------
class SlotSpace(ABC):
    """``capacity`` slots; regions are taken with ``allocate`` and given back with ``free``.

    A *hole* is a maximal run of free slots the placement can hand out as one
    region (for the buddy system: one free block).
    """

    __slots__ = ()
    capacity: int

    @property
    @abstractmethod
    def free_slots(self) -> int:
        """Slots in no region."""

    @abstractmethod
    def allocate(self, size: int) -> int | None:
        """Take a region able to hold ``size`` slots; its offset, or None if no hole fits."""

    @abstractmethod
    def free(self, offset: int) -> None:
        """Give back the region at ``offset``, merging it with free neighbours."""

    @abstractmethod
    def largest_hole(self) -> int:
        """The largest ``size`` for which ``allocate(size)`` would succeed now (0 if none)."""

    @abstractmethod
    def region_size(self, offset: int) -> int:
        """Slots the region at ``offset`` actually takes (buddy: the rounded-up size)."""

    @abstractmethod
    def slots_for(self, size: int) -> int:
        """Slots ``allocate(size)`` takes (>= size)."""

    @abstractmethod
    def can_place(self, sizes: Sequence[int]) -> bool:
        """Would ``allocate`` succeed for every size, in this order, with no frees between?"""

    @abstractmethod
    def fits_empty(self, sizes: Sequence[int]) -> bool:
        """``can_place`` on this space with everything freed: False means never."""

    @abstractmethod
    def regions(self) -> list[tuple[int, int]]:
        """``(offset, slots taken)`` of every region, by address."""

    @abstractmethod
    def holes(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of every hole, by address."""

    def check(self) -> None:
        """Raise AssertionError unless regions and holes tile ``[0, capacity)`` exactly."""
        pieces = sorted(
            [(o, s, "region") for o, s in self.regions()]
            + [(o, s, "hole") for o, s in self.holes()]
        )
        pos = 0
        for offset, size, kind in pieces:
            assert size > 0, f"empty {kind} at {offset}"
            assert offset == pos, f"{kind} at {offset}: expected {pos} (gap or overlap)"
            pos += size
        assert pos == self.capacity, f"pieces end at {pos}, capacity {self.capacity}"
        hole_total = sum(s for _, s, kind in pieces if kind == "hole")
        assert hole_total == self.free_slots, f"holes {hole_total} != free_slots {self.free_slots}"


def _check_capacity(capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"slot space capacity must be >= 1 slot, got {capacity}")


def _check_size(size: int) -> None:
    if size < 1:
        raise ValueError(f"region size must be >= 1 slot, got {size}")


# --- buddy system ---------------------------------------------------------------------
class BuddySpace(SlotSpace):
    """Binary buddy allocator over ``capacity`` slots.

    ``capacity`` need not be a power of two: the space is covered by the
    maximal aligned power-of-two *top blocks* of ``aligned_blocks(0, capacity)``
    (its binary expansion). Top blocks never merge with each other, so the
    largest region is the largest top block (8192 of 15,728 slots). A top block
    of order K starts at a multiple of 2**(K+1) (the sum of larger binary
    digits), so its would-be buddy lies in the smaller top blocks after it,
    where no free block of order K can exist: the plain buddy rule never merges
    across top blocks.

    Free blocks are kept per order in address-sorted lists; allocation splits
    the lowest-addressed block of the smallest sufficient order.

    ``trim_tail=False``: a region is the whole ``next_pow2(size)`` block (the
    rounding is internal fragmentation). ``trim_tail=True``: the block's tail
    beyond ``size`` is freed at once as aligned blocks, so the region takes
    exactly ``size`` slots; its tail pieces' buddies lie inside the region, so
    they merge back only when the region is freed.
    """

    __slots__ = ("capacity", "trim_tail", "_top", "_max_order", "_free", "_taken", "_free_slots")

    def __init__(self, capacity: int, trim_tail: bool = False):
        _check_capacity(capacity)
        self.capacity = capacity
        self.trim_tail = trim_tail
        self._top = aligned_blocks(0, capacity)
        self._max_order = max(k for _, k in self._top)
        self._free: list[list[int]] = [[] for _ in range(self._max_order + 1)]
        for offset, k in self._top:
            self._free[k].append(offset)
        self._taken: dict[int, int] = {}  # region offset -> slots taken
        self._free_slots = capacity

    @property
    def free_slots(self) -> int:
        return self._free_slots

    @property
    def top_blocks(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of the top blocks: all holes when the space is empty."""
        return [(o, 1 << k) for o, k in self._top]

    def slots_for(self, size: int) -> int:
        _check_size(size)
        return size if self.trim_tail else next_pow2(size)

    def allocate(self, size: int) -> int | None:
        _check_size(size)
        k = ceil_log2(size)
        free = self._free
        for j in range(k, self._max_order + 1):
            if free[j]:
                break
        else:
            return None
        offset = free[j].pop(0)
        while j > k:  # split: keep the lower half, free the upper half
            j -= 1
            insort(free[j], offset + (1 << j))
        taken = 1 << k
        if self.trim_tail and size < taken:
            for o, p in aligned_blocks(offset + size, offset + taken):
                insort(free[p], o)
            taken = size
        self._taken[offset] = taken
        self._free_slots -= taken
        return offset

    def free(self, offset: int) -> None:
        taken = self._taken.pop(offset, None)
        if taken is None:
            raise ValueError(f"no region starts at slot {offset}")
        if self.trim_tail:
            for o, k in aligned_blocks(offset, offset + taken):
                self._release(o, k)
        else:
            self._release(offset, taken.bit_length() - 1)
        self._free_slots += taken

    def _release(self, offset: int, k: int) -> None:
        """Free one aligned block, merging with its buddy while the buddy is free."""
        free = self._free
        while k < self._max_order:
            buddy = offset ^ (1 << k)
            blocks = free[k]
            i = bisect_left(blocks, buddy)
            if i == len(blocks) or blocks[i] != buddy:
                break
            del blocks[i]
            offset = min(offset, buddy)
            k += 1
        insort(free[k], offset)

    def largest_hole(self) -> int:
        for k in range(self._max_order, -1, -1):
            if self._free[k]:
                return 1 << k
        return 0

    def region_size(self, offset: int) -> int:
        return self._taken[offset]

    def _simulate(self, counts: list[int], sizes: Iterable[int]) -> bool:
        """Replay allocations on free-block counts per order (what ``allocate`` would split)."""
        top = self._max_order
        for size in sizes:
            _check_size(size)
            k = ceil_log2(size)
            for j in range(k, top + 1):
                if counts[j]:
                    break
            else:
                return False
            counts[j] -= 1
            for i in range(k, j):  # the upper halves split off on the way down
                counts[i] += 1
            if self.trim_tail:  # the tail's orders depend only on size (the block is aligned)
                for _, p in aligned_blocks(size, 1 << k):
                    counts[p] += 1
        return True

    def can_place(self, sizes: Sequence[int]) -> bool:
        return self._simulate([len(blocks) for blocks in self._free], sizes)

    def fits_empty(self, sizes: Sequence[int]) -> bool:
        counts = [0] * (self._max_order + 1)
        for _, k in self._top:
            counts[k] += 1
        return self._simulate(counts, sizes)

    def regions(self) -> list[tuple[int, int]]:
        return sorted(self._taken.items())

    def holes(self) -> list[tuple[int, int]]:
        return sorted((o, 1 << k) for k, blocks in enumerate(self._free) for o in blocks)

    def check(self) -> None:
        super().check()
        tops = self._top
        for k, blocks in enumerate(self._free):
            assert blocks == sorted(set(blocks)), f"free list of order {k} unsorted or duplicated"
            for o in blocks:
                assert o % (1 << k) == 0, f"free block at {o} not aligned to {1 << k}"
                top_off, top_k = max(t for t in tops if t[0] <= o)
                assert k <= top_k and o + (1 << k) <= top_off + (1 << top_k), (
                    f"free block ({o}, {1 << k}) straddles top blocks"
                )
                if k < top_k:
                    buddy = o ^ (1 << k)
                    assert buddy not in blocks, f"free buddies at {o} and {buddy} not merged"
        for o, taken in self._taken.items():
            block = next_pow2(taken)
            assert self.trim_tail or block == taken, (
                f"region at {o} takes {taken}, not a power of 2"
            )
            assert o % block == 0, f"region at {o} not aligned to its block of {block}"


# --- hole lists: first fit and best fit ------------------------------------------------
class HoleListSpace(SlotSpace):
    """Exact-size regions carved from the start of a chosen hole; frees coalesce.

    Holes are an address-sorted list of offsets (``bisect`` finds a freed
    region's neighbours in O(log holes)) plus a dict offset -> size. Choosing a
    hole is O(holes); subclasses say which hole (``_pick``).
    """

    __slots__ = ("capacity", "_starts", "_hole", "_taken", "_free_slots")

    def __init__(self, capacity: int):
        _check_capacity(capacity)
        self.capacity = capacity
        self._starts: list[int] = [0]  # hole offsets, sorted
        self._hole: dict[int, int] = {0: capacity}  # hole offset -> size
        self._taken: dict[int, int] = {}  # region offset -> size
        self._free_slots = capacity

    @staticmethod
    @abstractmethod
    def _pick(hole_sizes: Sequence[int], size: int) -> int:
        """Index of the hole (by address) to carve ``size`` slots from; -1 if none fits."""

    @property
    def free_slots(self) -> int:
        return self._free_slots

    def slots_for(self, size: int) -> int:
        _check_size(size)
        return size

    def allocate(self, size: int) -> int | None:
        _check_size(size)
        starts, hole = self._starts, self._hole
        i = self._pick([hole[s] for s in starts], size)
        if i < 0:
            return None
        offset = starts[i]
        rest = hole.pop(offset) - size
        if rest:  # the hole shrinks from the left and keeps its place in address order
            starts[i] = offset + size
            hole[offset + size] = rest
        else:
            del starts[i]
        self._taken[offset] = size
        self._free_slots -= size
        return offset

    def free(self, offset: int) -> None:
        size = self._taken.pop(offset, None)
        if size is None:
            raise ValueError(f"no region starts at slot {offset}")
        starts, hole = self._starts, self._hole
        end = offset + size
        i = bisect_left(starts, offset)  # holes before the region: starts[:i]
        prev = starts[i - 1] if i else -1
        merge_prev = i > 0 and prev + hole[prev] == offset
        merge_next = i < len(starts) and starts[i] == end
        if merge_prev and merge_next:
            hole[prev] += size + hole.pop(end)
            del starts[i]
        elif merge_prev:
            hole[prev] += size
        elif merge_next:
            hole[offset] = size + hole.pop(end)
            starts[i] = offset
        else:
            starts.insert(i, offset)
            hole[offset] = size
        self._free_slots += size

    def largest_hole(self) -> int:
        return max(self._hole.values(), default=0)

    def region_size(self, offset: int) -> int:
        return self._taken[offset]

    def _simulate(self, hole_sizes: list[int], sizes: Iterable[int]) -> bool:
        for size in sizes:
            _check_size(size)
            i = self._pick(hole_sizes, size)
            if i < 0:
                return False
            hole_sizes[i] -= size  # carved from the left: the rest stays in address order
        return True

    def can_place(self, sizes: Sequence[int]) -> bool:
        hole = self._hole
        return self._simulate([hole[s] for s in self._starts], sizes)

    def fits_empty(self, sizes: Sequence[int]) -> bool:
        return self._simulate([self.capacity], sizes)

    def regions(self) -> list[tuple[int, int]]:
        return sorted(self._taken.items())

    def holes(self) -> list[tuple[int, int]]:
        return [(s, self._hole[s]) for s in self._starts]

    def check(self) -> None:
        super().check()
        starts = self._starts
        assert starts == sorted(set(starts)), "hole offsets unsorted or duplicated"
        assert set(starts) == set(self._hole), "hole list and hole sizes disagree"
        for a, b in zip(starts, starts[1:]):
            assert a + self._hole[a] < b, f"holes at {a} and {b} touch but were not coalesced"


class FirstFitSpace(HoleListSpace):
    """The lowest-addressed hole that fits."""

    __slots__ = ()

    @staticmethod
    def _pick(hole_sizes: Sequence[int], size: int) -> int:
        for i, h in enumerate(hole_sizes):
            if h >= size:
                return i
        return -1


class BestFitSpace(HoleListSpace):
    """The smallest hole that fits; the lowest-addressed of equals."""

    __slots__ = ()

    @staticmethod
    def _pick(hole_sizes: Sequence[int], size: int) -> int:
        best, best_size = -1, 0
        for i, h in enumerate(hole_sizes):
            if h >= size and (best < 0 or h < best_size):
                best, best_size = i, h
                if h == size:
                    break
        return best


def make_slot_space(placement: str, capacity: int) -> SlotSpace:
    """The slot space for a placement name (one of ``PLACEMENTS``)."""
    if placement == "buddy":
        return BuddySpace(capacity)
    if placement == "buddy_exact":
        return BuddySpace(capacity, trim_tail=True)
    if placement == "first_fit":
        return FirstFitSpace(capacity)
    if placement == "best_fit":
        return BestFitSpace(capacity)
    raise ValueError(f"unknown placement {placement!r}; allowed: {', '.join(PLACEMENTS)}")
