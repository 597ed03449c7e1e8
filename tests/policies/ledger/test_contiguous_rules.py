"""Contiguous-allocator rules that tests/policies/ledger/test_contiguous_allocator.py leaves open.

1. Every misuse is refused with a one-line error that names the sequence, the sizes and the
   limit, so a caller (a scheduler bug, a bad config) learns what it did wrong.
2. The defaults: no swap space unless asked for (also through a preset); a model whose
   maximum sequence is one token is valid.
3. ``copied_blocks`` counts every fork's copy (block size 1: one per token slot).
4. ``check()`` names the invariant that broke. Each corruption below breaks one invariant
   and leaves the rest intact, so only that assertion can fire.

Sizes are in token slots. ``oracle`` reserves exactly ``final_len`` slots, ``max`` reserves
``max_seq_len``.
"""

from __future__ import annotations

import re

import pytest

from kvsim.policies.kv_allocator import RunWeights
from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator, OutOfSlots


def oracle(capacity: int = 64, swap: int = 0) -> ContiguousAllocator:
    return ContiguousAllocator(capacity, "first_fit", "oracle", 64, swap_capacity_slots=swap)


# --- 1. misuse is refused, and the message says what and why --------------------------
def _fork_without_room():
    alloc = oracle(10)
    alloc.admit([0], 3, 8)  # region [0, 8): 2 slots left
    alloc.fork(0, 1, 5)


def _admit_twice():
    alloc = oracle()
    alloc.admit([1], 2, 4)
    alloc.admit([1], 2, 4)


def _admit_a_swapped_sequence():
    alloc = oracle(swap=8)
    alloc.admit([1], 2, 4)
    alloc.swap_out([1])
    alloc.admit([1], 2, 4)


def _admit_without_room():
    alloc = oracle(20)
    alloc.admit([0, 1], 3, 16)  # 16 + 16 > 20: the caller skipped check_admit


def _copy_into_unequal():
    alloc = oracle()
    alloc.admit([0], 3, 8)
    alloc.admit([1], 4, 8)
    alloc.copy_into(0, 1)


def _fork_below_parent():
    alloc = oracle()
    alloc.admit([0], 3, 8)
    alloc.fork(0, 1, 2)


def _fork_beyond_max():
    alloc = ContiguousAllocator(128, "first_fit", "max", 32)
    alloc.admit([0], 3, 8)
    alloc.fork(0, 1, 40)


def _swap_in_without_room():
    alloc = oracle(16, swap=16)
    alloc.admit([0], 3, 10)
    alloc.swap_out([0])
    alloc.admit([1], 2, 10)  # takes [0, 10): 6 slots left for a 10-slot region
    alloc.swap_in([0])


def _swap_out_beyond_swap_space():
    alloc = oracle(swap=4)
    alloc.admit([0], 5, 8)
    alloc.swap_out([0])


def _advance_a_negative_run():
    oracle().advance_all(RunWeights(-1, 1.0, 0.0))


MISUSE = {
    "max_seq_len 0": (lambda: ContiguousAllocator(8, "first_fit", "max", 0), ValueError,
                      "max_seq_len must be >= 1 token, got 0"),
    "negative swap": (lambda: ContiguousAllocator(8, "first_fit", "max", 8, -1), ValueError,
                      "swap_capacity_slots must be >= 0, got -1"),
    "fork without room": (_fork_without_room, OutOfSlots,
                          "no hole of 5 slots for sequence 1 (largest hole 2, free 2)"),
    "duplicate ids": (lambda: oracle().admit([3, 3], 2, 4), ValueError,
                      "duplicate sequence ids in [3, 3]"),
    "admitted twice": (_admit_twice, ValueError, "sequence 1 already holds memory"),
    "admit a swapped sequence": (_admit_a_swapped_sequence, ValueError,
                                 "sequence 1 already holds memory"),
    "fork from nothing": (lambda: oracle().fork(9, 1, 4), ValueError,
                          "sequence 9 is not running on the GPU"),
    "swap in what is not out": (lambda: oracle().check_swap_in([5], 0), ValueError,
                                "sequence 5 is not swapped out"),
    "longer than max": (lambda: ContiguousAllocator(64, "first_fit", "max", 16).admit([0], 4, 20),
                        ValueError,
                        "final_len 20 exceeds the 'max' reservation of 16 slots (max_seq_len 16)"),
    "admit without room": (_admit_without_room, OutOfSlots, "cannot place 2 regions of [16, 16] slots"),
    "num_seqs 0": (lambda: oracle().check_admit(2, 4, 0, 0), ValueError, "num_seqs must be >= 1, got 0"),
    "copy unequal": (_copy_into_unequal, ValueError, "sequences 0 and 1 hold 3 and 4 tokens"),
    "fork shorter": (_fork_below_parent, ValueError, "child_final_len 2 < parent's kv_len 3"),
    "fork beyond max": (_fork_beyond_max, ValueError,
                        "child_final_len 40 exceeds the reservation of 32 slots"),
    "free unknown": (lambda: oracle().free(7), ValueError, "sequence 7 holds no memory"),
    "swap in without room": (_swap_in_without_room, OutOfSlots,
                             "cannot place swapped-in regions of [10] slots"),
    "swap space full": (_swap_out_beyond_swap_space, OutOfSlots, "swap space of 4 slots is full"),
    # nothing runs, so at most 0 steps: a run of -1 is no run at all
    "negative run": (_advance_a_negative_run, ValueError, "cannot advance -1 lockstep steps: at most 0"),
}


@pytest.mark.parametrize("case", MISUSE, ids=list(MISUSE))
def test_misuse_is_a_one_line_error_naming_what_was_wrong(case):
    action, error, message = MISUSE[case]
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        action()


# --- 2. defaults -------------------------------------------------------------------------
def test_there_is_no_swap_space_unless_asked_for():
    """A 1-token sequence cannot be swapped out of an allocator built without swap space."""
    alloc = ContiguousAllocator(8, "first_fit", "oracle", 8)
    alloc.admit([0], 1, 2)
    assert alloc.swap_capacity_slots == 0 and not alloc.can_swap_out([0])


def test_a_preset_passes_its_swap_space_on():
    assert ContiguousAllocator.from_preset("orca-max", 64, 16).swap_capacity_slots == 0
    alloc = ContiguousAllocator.from_preset("orca-max", 64, 16, swap_capacity_slots=48)
    assert alloc.swap_capacity_slots == 48
    alloc.admit([0], 5, 9)
    assert alloc.can_swap_out([0])


def test_a_one_token_model_is_valid():
    """max_seq_len 1: every sequence is one prompt token and ends there."""
    alloc = ContiguousAllocator(4, "first_fit", "max", 1)
    alloc.admit([0, 1], 1, 1)
    assert alloc.usage().token_states == 2 and alloc.free_slots() == 2


# --- 3. copies ----------------------------------------------------------------------------
def test_every_fork_copies_its_parents_tokens():
    """Parent of 3 tokens forked twice: 3 + 3 slots copied; then 3 copied in place."""
    alloc = oracle()
    alloc.admit([0], 3, 8)
    alloc.fork(0, 1, 8)
    alloc.fork(0, 2, 8)
    assert alloc.copied_blocks == 6
    alloc.copy_into(1, 2)
    assert alloc.copied_blocks == 9


# --- 4. check() names what broke -------------------------------------------------------------
def _two_running(swap: int = 0) -> ContiguousAllocator:
    alloc = oracle(swap=swap)
    alloc.admit([0], 3, 8)
    alloc.admit([1], 2, 6)
    alloc.check()  # intact before the corruption
    return alloc


def _share_an_offset(alloc):
    alloc._offset[1] = alloc._offset[0]


def _orphan_region(alloc):
    alloc.space.allocate(4)  # a region no sequence owns


def _drift_tokens(alloc):
    alloc._token_states += 1


def _run_and_swap(alloc):
    alloc._swapped[1] = (2, 6, 6)
    alloc._cpu_used += 2


def _drift_swap(alloc):
    alloc.swap_out([1])
    alloc._cpu_used += 1


def _overcommit_swap(alloc):
    alloc.swap_out([1])
    alloc.swap_capacity_slots = 1


CORRUPTIONS = {
    "two sequences share a region offset": _share_an_offset,
    "regions and sequences disagree": _orphan_region,
    "token_states total drifted": _drift_tokens,
    "a sequence is both running and swapped": _run_and_swap,
    "swap total drifted": _drift_swap,
    "swap space overcommitted": _overcommit_swap,
}


@pytest.mark.parametrize("message", CORRUPTIONS)
def test_check_names_the_broken_invariant(message):
    alloc = _two_running(swap=16)
    CORRUPTIONS[message](alloc)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        alloc.check()
