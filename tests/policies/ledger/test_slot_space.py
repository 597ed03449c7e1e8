"""Slot spaces: placement choices, coalescing, and invariants under random use.

The property test keeps its own model of the space (the set of live regions)
and derives everything else independently from it: which slots are free, the
maximal free runs, where first fit and best fit must place, and (for the buddy
system) whether an aligned free block of the rounded size exists.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.ledger.slot_space import (
    PLACEMENTS,
    BestFitSpace,
    BuddySpace,
    FirstFitSpace,
    aligned_blocks,
    make_slot_space,
)


def binary_expansion_blocks(capacity: int) -> list[tuple[int, int]]:
    """Top blocks from the bits of ``capacity``, largest first (independent of the code)."""
    out, pos = [], 0
    for bit in range(capacity.bit_length() - 1, -1, -1):
        if capacity >> bit & 1:
            out.append((pos, 1 << bit))
            pos += 1 << bit
    return out


def free_runs(capacity: int, regions: dict[int, int]) -> list[tuple[int, int]]:
    """Maximal runs of slots covered by no region, by address."""
    used = bytearray(capacity)
    for o, s in regions.items():
        used[o : o + s] = b"\x01" * s
    runs, start = [], None
    for i in range(capacity + 1):
        free = i < capacity and not used[i]
        if free and start is None:
            start = i
        elif not free and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def expected_offset(placement: str, capacity: int, regions: dict[int, int], size: int):
    """Where a hole-list placement must put ``size`` slots (None if nowhere)."""
    fitting = [(o, s) for o, s in free_runs(capacity, regions) if s >= size]
    if not fitting:
        return None
    if placement == "first_fit":
        return fitting[0][0]
    return min(fitting, key=lambda r: (r[1], r[0]))[0]  # best fit


def buddy_fits(capacity: int, regions: dict[int, int], size: int) -> bool:
    """Is some aligned, fully free block of next_pow2(size) slots inside one top block?"""
    block = 1 << (size - 1).bit_length()
    used = bytearray(capacity)
    for o, s in regions.items():
        used[o : o + s] = b"\x01" * s
    for top, top_size in binary_expansion_blocks(capacity):
        if top_size < block:
            continue
        for o in range(top, top + top_size, block):
            if not any(used[o : o + block]):
                return True
    return False


# --- fixed cases --------------------------------------------------------------------------
def test_top_blocks_are_the_binary_expansion():
    # 15,728 = 0b11_1101_0111_0000 (OPT-13B on an A100-40GB, the paper's Table 1)
    blocks = aligned_blocks(0, 15_728)
    assert [1 << k for _, k in blocks] == [8192, 4096, 2048, 1024, 256, 64, 32, 16]
    assert [(o, 1 << k) for o, k in blocks] == binary_expansion_blocks(15_728)
    assert BuddySpace(15_728).holes() == binary_expansion_blocks(15_728)


def test_aligned_blocks_from_an_unaligned_start():
    # 5 is odd -> 1 slot; 6 is 2-aligned -> 2 slots; 8 is 8-aligned and 8 remain -> 8
    assert aligned_blocks(5, 16) == [(5, 0), (6, 1), (8, 3)]


def test_buddy_holds_seven_max_length_regions_in_15728_slots():
    space = BuddySpace(15_728)
    offsets = [space.allocate(2048) for _ in range(7)]  # 4 in the 8192 block, 2 + 1 after
    assert None not in offsets
    assert all(o % 2048 == 0 for o in offsets)
    assert space.allocate(2048) is None  # 1392 slots left, in blocks of at most 1024
    assert space.free_slots == 15_728 - 7 * 2048
    assert space.largest_hole() == 1024


def test_buddy_rounds_up_and_merges_back():
    space = BuddySpace(16)
    a = space.allocate(5)  # rounded to 8
    assert space.region_size(a) == 8 and space.free_slots == 8
    b = space.allocate(3)  # rounded to 4, split from the other half
    c = space.allocate(4)
    assert {a, b, c} == {0, 8, 12} and a == 0
    assert space.allocate(1) is None
    for o in (b, a, c):
        space.free(o)
        space.check()
    assert space.holes() == [(0, 16)]


def test_buddy_exact_trims_the_tail_and_reclaims_it():
    space = BuddySpace(16, trim_tail=True)
    a = space.allocate(5)
    assert a == 0 and space.region_size(a) == 5
    assert space.holes() == [(5, 1), (6, 2), (8, 8)]  # the tail of the 8-block is free again
    assert space.allocate(2) == 6  # the freed tail is usable
    space.free(6)
    space.free(a)
    space.check()
    assert space.holes() == [(0, 16)]


def test_buddy_exact_cannot_pack_what_exact_fit_can():
    # 12 slots = top blocks 8 + 4. Two regions of 6 each need an 8-block for each.
    assert not BuddySpace(12, trim_tail=True).fits_empty([6, 6])
    assert FirstFitSpace(12).fits_empty([6, 6])
    assert not BuddySpace(12).fits_empty([6, 6])  # 8 + 8 rounded > 12 anyway


def test_first_fit_and_best_fit_choose_different_holes():
    spaces = {"first_fit": FirstFitSpace(100), "best_fit": BestFitSpace(100)}
    for space in spaces.values():
        offs = [space.allocate(s) for s in (10, 30, 10, 5, 10)]  # at 0, 10, 40, 50, 55
        assert offs == [0, 10, 40, 50, 55]
        space.free(10)  # hole of 30 at 10
        space.free(50)  # hole of 5 at 50 (the tail hole is 35 at 65)
        assert space.holes() == [(10, 30), (50, 5), (65, 35)]
    assert spaces["first_fit"].allocate(5) == 10  # lowest address that fits
    assert spaces["best_fit"].allocate(5) == 50  # tightest hole
    assert spaces["best_fit"].allocate(31) == 65  # only the tail hole fits 31


def test_frees_coalesce_with_both_neighbours():
    space = FirstFitSpace(30)
    a, b, c = space.allocate(10), space.allocate(10), space.allocate(10)
    space.free(a)
    space.free(c)
    assert space.holes() == [(0, 10), (20, 10)]
    space.free(b)  # joins the holes on both sides
    assert space.holes() == [(0, 30)]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_bad_input_is_a_clear_error(placement):
    with pytest.raises(ValueError, match="capacity"):
        make_slot_space(placement, 0)
    space = make_slot_space(placement, 8)
    with pytest.raises(ValueError, match="size"):
        space.allocate(0)
    with pytest.raises(ValueError, match="no region starts at slot 3"):
        space.free(3)


def test_unknown_placement_names_the_allowed_ones():
    with pytest.raises(ValueError, match="buddy, buddy_exact, first_fit, best_fit"):
        make_slot_space("worst_fit", 8)


# --- random use -------------------------------------------------------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 80)),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("batch"), st.lists(st.integers(1, 40), min_size=1, max_size=4)),
    ),
    max_size=40,
)


@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=120, deadline=None)
@given(capacity=st.integers(1, 150), script=ops, data=st.data())
def test_random_use_keeps_every_invariant(placement, capacity, script, data):
    space = make_slot_space(placement, capacity)
    buddy = placement.startswith("buddy")
    regions: dict[int, int] = {}  # the test's own model: offset -> slots taken

    def allocate(size: int) -> int | None:
        if buddy:
            fits = buddy_fits(capacity, regions, size)
        else:
            want = expected_offset(placement, capacity, regions, size)
            fits = want is not None
        assert (size <= space.largest_hole()) == fits
        offset = space.allocate(size)
        assert (offset is not None) == fits
        if offset is None:
            return None
        taken = space.region_size(offset)
        if placement == "buddy":
            assert taken == 1 << (size - 1).bit_length()  # rounded to a power of two
        else:
            assert taken == size
        assert taken == space.slots_for(size)
        block = 1 << (size - 1).bit_length()
        if buddy:
            assert offset % block == 0, "buddy region not aligned to its block"
        else:
            assert offset == want
        assert all(o + s <= offset or offset + taken <= o for o, s in regions.items())
        regions[offset] = taken
        return offset

    for op, arg in script:
        if op == "alloc":
            allocate(arg)
        elif op == "free" and regions:
            offset = sorted(regions)[arg % len(regions)]
            space.free(offset)
            del regions[offset]
        elif op == "batch":
            predicted = space.can_place(arg)
            placed = [allocate(s) for s in arg]
            assert predicted == (None not in placed)
        space.check()
        assert space.free_slots == capacity - sum(regions.values())
        assert space.regions() == sorted(regions.items())
        if not buddy:  # holes are exactly the maximal free runs: fully coalesced
            assert space.holes() == free_runs(capacity, regions)

    order = data.draw(st.permutations(sorted(regions)))
    for offset in order:
        space.free(offset)
    space.check()
    assert space.free_slots == capacity
    if buddy:
        assert space.holes() == binary_expansion_blocks(capacity)
    else:
        assert space.holes() == [(0, capacity)]


@pytest.mark.parametrize("placement", PLACEMENTS)
@given(capacity=st.integers(1, 100), sizes=st.lists(st.integers(1, 60), max_size=5))
def test_fits_empty_predicts_a_fresh_space(placement, capacity, sizes):
    space = make_slot_space(placement, capacity)
    space.allocate(1)  # fits_empty must ignore what is allocated now
    fresh = make_slot_space(placement, capacity)
    placed = [fresh.allocate(s) for s in sizes]
    assert space.fits_empty(sizes) == (None not in placed)
