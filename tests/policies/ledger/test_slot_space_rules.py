"""Slot-space rules the random test in tests/policies/ledger/test_slot_space.py rarely reaches.

1. ``can_place`` for ``buddy_exact`` must count the trimmed tail as free: a later, smaller
   region of the same batch may land in it.
2. ``check()`` is the invariant checker every allocator test leans on; each of its
   assertions must fire on the corruption it names (and say where). The states below are
   built by hand so that everything *else* still holds: the space is tiled exactly, so only
   the one broken invariant can be the reason.
"""

from __future__ import annotations

import re

import pytest

from kvsim.policies.ledger.slot_space import BestFitSpace, BuddySpace, FirstFitSpace


def test_buddy_exact_can_place_counts_the_trimmed_tail():
    """8 slots, buddy_exact: 5 slots take the 8-block [0, 8) and give back its tail
    [5, 6) (1 slot) and [6, 8) (2 slots). A region of 2 then fits at 6, so the batch
    [5, 2] fits; without the tail there would be no free slot left at all."""
    space = BuddySpace(8, trim_tail=True)
    assert space.can_place([5, 2])
    assert space.fits_empty([5, 2])
    assert space.allocate(5) == 0 and space.allocate(2) == 6
    assert not BuddySpace(8).can_place([5, 2])  # plain buddy keeps the whole 8-block


@pytest.mark.parametrize(
    ("capacity", "sizes", "fits"),
    [
        # 8 slots: 3 at 0 frees its tail [3, 4); 3 at 4 frees [7, 8). Two 1-slot tails
        # of the same order: both singles fit (the tail count adds to what is there).
        (8, [3, 3, 1, 1], True),
        # 4 slots: 3 at 0 leaves one tail slot [3, 4), so only one single fits after it.
        (4, [3, 1, 1], False),
        (4, [3, 1], True),
    ],
)
def test_buddy_exact_can_place_counts_each_tail_slot_once(capacity, sizes, fits):
    space = BuddySpace(capacity, trim_tail=True)
    assert space.can_place(sizes) is fits
    placed = [space.allocate(s) for s in sizes]
    assert (None not in placed) is fits  # the prediction is what allocation then does


def test_a_fresh_space_predicts_like_a_used_one():
    """fits_empty counts each top block once: 12 = 8 + 4 holds [8, 4] but not [8, 4, 1]."""
    space = BuddySpace(12)
    assert space.fits_empty([8, 4]) and not space.fits_empty([8, 4, 1])
    assert space.can_place([8, 4]) and not space.can_place([8, 4, 1])


# --- check(): each assertion fires on its own corruption --------------------------------
def test_check_names_an_empty_hole():
    """A zero-slot hole tiles nothing away, but it is not a hole: "empty hole at 10"."""
    space = FirstFitSpace(30)
    space.allocate(10), space.allocate(10)
    space._starts.insert(0, 10)  # a zero-size hole where the second region starts
    space._hole[10] = 0
    with pytest.raises(AssertionError, match="^empty hole at 10$"):
        space.check()


def test_check_names_a_region_that_overlaps():
    """Region bookkeeping off by one slot: "region at 9: expected 10 (gap or overlap)"."""
    space = FirstFitSpace(30)
    space.allocate(10), space.allocate(10)
    space._taken[9] = space._taken.pop(10)
    with pytest.raises(AssertionError, match=re.escape("region at 9: expected 10 (gap or overlap)")):
        space.check()


def test_check_catches_hole_offsets_out_of_order():
    """Holes [0, 10) and [20, 30) listed as 20, 0: the space still tiles, the list is wrong."""
    space = FirstFitSpace(30)
    a, _, c = space.allocate(10), space.allocate(10), space.allocate(10)
    space.free(a), space.free(c)
    space._starts.reverse()
    with pytest.raises(AssertionError, match="^hole offsets unsorted or duplicated$"):
        space.check()


def test_check_catches_a_hole_size_with_no_hole():
    space = FirstFitSpace(30)
    space.allocate(10)
    space._hole[25] = 5  # a size for a hole that is not in the list
    with pytest.raises(AssertionError, match="^hole list and hole sizes disagree$"):
        space.check()


@pytest.mark.parametrize("space_type", [FirstFitSpace, BestFitSpace])
def test_check_catches_touching_holes_left_apart(space_type):
    """[0, 10) and [10, 20) free as two holes: they should have been one."""
    space = space_type(30)
    space.allocate(10), space.allocate(10), space.allocate(10)
    size = space._taken.pop(10)
    space._starts.insert(1, 10)
    space._hole[10] = size
    space._free_slots += size
    space._taken.pop(0)
    space._starts.insert(0, 0)
    space._hole[0] = 10
    space._free_slots += 10
    assert space.holes() == [(0, 10), (10, 10)]
    with pytest.raises(AssertionError, match="^holes at 0 and 10 touch but were not coalesced$"):
        space.check()


def test_check_catches_an_unaligned_buddy_block():
    """16 slots: a region [0, 2), then free blocks [2, 6) (4 slots), [6, 8), [8, 16). The
    4-slot block at 2 tiles correctly but is not aligned to 4."""
    space = BuddySpace(16)
    space.allocate(2)
    space._free[1], space._free[2], space._free[3] = [6], [2], [8]
    with pytest.raises(AssertionError, match="^free block at 2 not aligned to 4$"):
        space.check()


def test_check_catches_free_buddies_left_unmerged():
    """16 slots all free as two 8-blocks: buddies at 0 and 8 should be one 16-block."""
    space = BuddySpace(16)
    space._free[4], space._free[3] = [], [0, 8]
    with pytest.raises(AssertionError, match="^free buddies at 0 and 8 not merged$"):
        space.check()
