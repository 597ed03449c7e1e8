"""The reference contiguous allocator (Orca, FasterTransformer), written to be read.

The oracle the fast ``ContiguousAllocator`` is tested against, and the place to learn
the rules; it shares no code with it. Every sequence owns one unbroken region of a
linear space of token slots, reserved in full when it is admitted::

    slots  0 ........................................................ capacity
           [ seq 3: 11 tokens | reserved .... ][ hole ][ seq 9 ........ ][ hole ]

Reservation (the vLLM paper, section 6.1): ``max`` reserves the maximum sequence length
(Orca-Max, FasterTransformer); ``pow2`` the prompt plus the true output length rounded
up to a power of two (Orca-Pow2: 32 output slots for a 25-token output); ``oracle``
exactly prompt + output (Orca-Oracle).

Placement: ``buddy`` rounds a region up to a power of two, aligned to its size, splitting
the lowest-addressed free block of the smallest sufficient order and merging a freed block
with its free buddy; ``buddy_exact`` hands the rounded tail back at once; ``first_fit``
and ``best_fit`` carve exact regions from the lowest-addressed / smallest hole that fits.

Memory classes of a region of ``region`` slots, asked for as ``reserve`` slots, holding
``kv`` tokens of a sequence that ends at ``final`` tokens, with ``target = max(kv, min(final,
region))`` and ``asked = max(reserve, target)``: ``token_states = kv``, ``reserved = target -
kv``, ``internal_frag = asked - target`` (the reservation policy's waste), ``allocator_frag =
region - asked`` (the buddy's rounding: the paper's "external fragmentation from the memory
allocator like the buddy allocator", section 3); ``free`` is every slot in no region. Nothing is shared: each sample or beam holds its own copy of the prompt.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvsim.policies.reference.paged import FRAGMENTED, NEVER, NO_SPACE, OK, Memory

#: The paper's baselines: (placement, reservation, request-level batching).
REFERENCE_PRESETS = {
    "orca-max": ("buddy", "max", False),
    "orca-pow2": ("buddy", "pow2", False),
    "orca-oracle": ("buddy_exact", "oracle", False),
    "fastertransformer": ("first_fit", "max", True),
}


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def reservation(policy: str, prompt_len: int, final_len: int, max_seq_len: int) -> int:
    """Slots reserved for a sequence storing ``prompt_len`` tokens that ends at ``final_len``
    (its output is ``final_len - prompt_len + 1`` tokens: the last one's KV is never stored)."""
    if policy == "max":
        return max_seq_len
    if policy == "pow2":
        return min(prompt_len + next_power_of_two(final_len - prompt_len + 1), max_seq_len)
    if policy == "oracle":
        return final_len
    raise ValueError(f"unknown reservation policy {policy!r}; allowed: max, pow2, oracle")


class BuddySpace:
    """Binary buddy system over ``capacity`` slots (covered by its binary expansion of
    aligned power-of-two top blocks); ``exact`` returns each region's rounded tail."""

    def __init__(self, capacity: int, exact: bool = False):
        self.capacity, self.exact = capacity, exact
        self.free_blocks: set[tuple[int, int]] = set(aligned_blocks(0, capacity))  # (offset, order)
        self.regions: dict[int, int] = {}  # offset -> slots taken

    def slots_for(self, size: int) -> int:
        return size if self.exact else next_power_of_two(size)

    def allocate(self, size: int) -> int | None:
        order = (size - 1).bit_length()
        fitting = [(k, o) for o, k in self.free_blocks if k >= order]
        if not fitting:
            return None
        k, offset = min(fitting)  # the smallest sufficient order, then the lowest address
        self.free_blocks.remove((offset, k))
        while k > order:  # split: keep the lower half, free the upper half
            k -= 1
            self.free_blocks.add((offset + (1 << k), k))
        taken = 1 << order
        if self.exact:
            self.free_blocks.update(aligned_blocks(offset + size, offset + taken))
            taken = size
        self.regions[offset] = taken
        return offset

    def free(self, offset: int) -> None:
        taken = self.regions.pop(offset)
        for o, k in aligned_blocks(offset, offset + taken):
            while (o ^ (1 << k), k) in self.free_blocks:  # merge with the free buddy
                self.free_blocks.remove((o ^ (1 << k), k))
                o, k = min(o, o ^ (1 << k)), k + 1
            self.free_blocks.add((o, k))

    @property
    def free_slots(self) -> int:
        return sum(1 << k for _, k in self.free_blocks)


def aligned_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` as maximal power-of-two blocks aligned to their size: (offset, order)."""
    out = []
    while start < end:
        k = (end - start).bit_length() - 1
        if start:
            k = min(k, (start & -start).bit_length() - 1)
        out.append((start, k))
        start += 1 << k
    return out


class HoleSpace:
    """Exact regions carved from the left of a hole: ``best`` picks the smallest hole that
    fits (lowest address on ties), else the lowest-addressed one; frees coalesce."""

    def __init__(self, capacity: int, best: bool = False):
        self.capacity, self.best = capacity, best
        self.holes: list[list[int]] = [[0, capacity]]  # [offset, size], by address
        self.regions: dict[int, int] = {}

    def slots_for(self, size: int) -> int:
        return size

    def allocate(self, size: int) -> int | None:
        fitting = [h for h in self.holes if h[1] >= size]
        if not fitting:
            return None
        hole = min(fitting, key=lambda h: (h[1], h[0])) if self.best else fitting[0]
        offset = hole[0]
        hole[0] += size
        hole[1] -= size
        if hole[1] == 0:
            self.holes.remove(hole)
        self.regions[offset] = size
        return offset

    def free(self, offset: int) -> None:
        size = self.regions.pop(offset)
        holes = sorted(self.holes + [[offset, size]])
        merged = [holes[0]]
        for o, s in holes[1:]:
            if merged[-1][0] + merged[-1][1] == o:
                merged[-1][1] += s
            else:
                merged.append([o, s])
        self.holes = merged

    @property
    def free_slots(self) -> int:
        return sum(s for _, s in self.holes)


def make_space(placement: str, capacity: int) -> BuddySpace | HoleSpace:
    spaces = {
        "buddy": lambda: BuddySpace(capacity),
        "buddy_exact": lambda: BuddySpace(capacity, exact=True),
        "first_fit": lambda: HoleSpace(capacity),
        "best_fit": lambda: HoleSpace(capacity, best=True),
    }
    if placement not in spaces:
        raise ValueError(f"unknown placement {placement!r}; allowed: {', '.join(spaces)}")
    return spaces[placement]()


def places_all(space: BuddySpace | HoleSpace, sizes: Sequence[int]) -> bool:
    """Would every region of ``sizes`` be placed, in order? (Tried on a copy.)"""
    trial = copy.deepcopy(space)
    return all(trial.allocate(size) is not None for size in sizes)


@dataclass
class Region:
    offset: int
    size: int  # slots taken (buddy: rounded up)
    reserve: int  # slots asked for
    kv: int  # tokens stored
    final: int  # tokens it will finally store


@dataclass
class ReferenceContiguousAllocator:
    """``capacity`` GPU slots, ``swap_slots`` CPU slots; regions sized by ``reservation``."""

    capacity: int
    placement: str
    reservation: str
    max_seq_len: int
    swap_slots: int = 0
    shares_memory: bool = field(default=False, init=False)
    block_size: int = field(default=1, init=False)
    copied_blocks: int = field(default=0, init=False)  # slots copied between regions (beams)

    def __post_init__(self) -> None:
        self.space = make_space(self.placement, self.capacity)
        self.regions: dict[int, Region] = {}  # GPU-resident sequence -> its region
        self.swapped: dict[int, Region] = {}  # swapped-out sequence -> its region's record
        self.cpu_used = 0  # CPU slots holding swapped-out tokens

    def check_regions(self, sizes: list[int], watermark_slots: int) -> str:
        needed = sum(self.space.slots_for(s) for s in sizes)
        if needed > self.capacity - watermark_slots or not places_all(
            make_space(self.placement, self.capacity), sizes
        ):
            return NEVER  # not even an empty space (less the watermark) would hold it
        if self.space.free_slots - watermark_slots < needed:
            return NO_SPACE
        if not places_all(self.space, sizes):
            return FRAGMENTED  # enough free slots, but no hole large enough
        return OK

    def can_admit(self, prompt_len: int, finals: list[int], watermark_slots: int, prefix=()) -> str:
        reserves = [reservation(self.reservation, prompt_len, f, self.max_seq_len) for f in finals]
        if any(r < f for r, f in zip(reserves, finals)):
            return NEVER  # a sequence would outgrow its region
        return self.check_regions(reserves, watermark_slots)

    def never_reason(self, prompt_len: int, finals: list[int]) -> str | None:
        """A sequence longer than its region (``allocator.reserve_tokens``), if that is why NEVER."""
        for f in finals:
            if reservation(self.reservation, prompt_len, f, self.max_seq_len) < f:
                return (f"needs {f} KV slots (prompt + output - 1) but a region holds at most {self.max_seq_len} "
                        "(allocator.reserve_tokens)")
        return None

    def place(self, s: int, reserve: int, kv: int, final: int) -> None:
        offset = self.space.allocate(reserve)
        assert offset is not None, "placed without a check"
        self.regions[s] = Region(offset, self.space.regions[offset], reserve, kv, final)

    def admit(self, seq_ids: list[int], prompt_len: int, finals: list[int], prefix=()) -> int:
        for s, f in zip(seq_ids, finals):
            self.place(
                s, reservation(self.reservation, prompt_len, f, self.max_seq_len), prompt_len, f
            )
        return 0  # no prefix cache

    def can_append(self, seq_ids: Sequence[int]) -> bool:
        return all(self.regions[s].kv < self.regions[s].size for s in seq_ids)

    def append(self, seq_ids: Sequence[int]) -> None:
        for s in seq_ids:
            r = self.regions[s]
            r.kv += 1
            r.final = max(r.final, r.kv)

    def copy_into(self, src: int, dst: int) -> None:
        """Beam search without sharing: ``dst``'s region is overwritten by ``src``'s tokens."""
        self.copied_blocks += self.regions[src].kv

    def free(self, s: int) -> None:
        if s in self.swapped:
            self.cpu_used -= self.swapped.pop(s).kv
        else:
            self.space.free(self.regions.pop(s).offset)

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return self.cpu_used + sum(self.regions[s].kv for s in seq_ids) <= self.swap_slots

    def swap_out(self, seq_ids: Sequence[int]) -> tuple[int, int]:
        """Copy each region's tokens to the CPU and free the region: (regions, slots) moved."""
        moved = 0
        for s in seq_ids:
            r = self.regions.pop(s)
            self.space.free(r.offset)
            self.swapped[s] = r
            moved += r.kv
        self.cpu_used += moved
        return len(seq_ids), moved

    def can_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> str:
        return self.check_regions([self.swapped[s].reserve for s in seq_ids], watermark_slots)

    def swap_in(self, seq_ids: Sequence[int]) -> tuple[int, int]:
        moved = 0
        for s in seq_ids:
            r = self.swapped.pop(s)
            self.place(s, r.reserve, r.kv, r.final)
            moved += r.kv
        self.cpu_used -= moved
        return len(seq_ids), moved

    def kv_len(self, s: int) -> int:
        return (self.regions.get(s) or self.swapped[s]).kv

    def resident(self) -> tuple[int, int]:
        return len(self.regions), sum(r.kv for r in self.regions.values())

    def memory(self) -> Memory:
        tokens = reserved = internal = rounding = 0
        for r in self.regions.values():
            target = max(r.kv, min(r.final, r.size))
            asked = max(r.reserve, target)  # what the sequence asked for, or has grown to
            tokens += r.kv
            reserved += target - r.kv
            internal += asked - target
            rounding += r.size - asked
        free = self.space.free_slots
        assert tokens + reserved + internal + rounding + free == self.capacity
        return Memory(self.capacity, tokens, reserved, internal, free, self.capacity - free, rounding)

    def check(self) -> None:
        """Raise AssertionError unless regions and holes tile the space exactly."""
        if isinstance(self.space, BuddySpace):
            holes = [(o, 1 << k) for o, k in self.space.free_blocks]
        else:
            holes = [(o, s) for o, s in self.space.holes]
        pieces = sorted(holes + list(self.space.regions.items()))
        position = 0
        for offset, size in pieces:
            assert offset == position and size > 0, f"gap or overlap at slot {offset}"
            position += size
        assert position == self.capacity, "the pieces do not cover the space"
        assert {r.offset for r in self.regions.values()} == set(self.space.regions), (
            "regions disagree"
        )
        for r in self.regions.values():
            assert 1 <= r.kv <= r.size and r.reserve <= r.size, "a region holds more than it can"
        assert self.cpu_used == sum(r.kv for r in self.swapped.values()) <= self.swap_slots
