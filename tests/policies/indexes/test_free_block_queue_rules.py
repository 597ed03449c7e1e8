"""Rules of the free block queue (policies/indexes/free_block_queue.py) that mutation testing found
unchecked: the one-line errors word for word, block numbers at the edges of the slot array
(the last one it holds, one past it, a negative one), the buffer holding no gaps, a wide
take from the buffer's first slot, never-used blocks kept as a range through a hit, the
count check, and the uncached-first queue with cached blocks filed in its eviction order."""

from __future__ import annotations

import re

import pytest

from kvsim.policies.indexes import free_block_queue
from kvsim.policies.indexes.eviction_order import EvictionOrder
from kvsim.policies.indexes.free_block_queue import FreeBlockQueue, UncachedFirstQueue


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize("batch", [0, 64])  # through numpy, and a block at a time
def test_the_errors_say_what_is_wrong_word_for_word(monkeypatch, batch):
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", batch)
    q = FreeBlockQueue([3, 8])
    with pytest.raises(ValueError, match=exactly("a block was given twice: it is already in the free queue")):
        q.extend([5, 5])
    with pytest.raises(ValueError, match=exactly("block 2 is not in the free queue")):
        q.remove_many([2])
    with pytest.raises(ValueError, match=exactly("block 8 is not in the free queue (taken out twice)")):
        q.remove_many([3, 8, 8])
    with pytest.raises(ValueError, match=exactly("block numbers are integers >= 0, got [-1, -2, -3, -4, -5]")):
        q.extend([-1, -2, -3, -4, -5, -6, -7])
    assert list(q) == [3, 8]


def test_a_repeated_hit_among_never_used_blocks_names_the_repeated_block():
    q = FreeBlockQueue(range(10))  # never-used blocks: the removal goes through numpy
    with pytest.raises(ValueError, match=exactly("block 8 is not in the free queue (taken out twice)")):
        q.remove_many([7, 8, 8])
    assert list(q) == list(range(10))


@pytest.mark.parametrize("bad", [-1, 4, 2**40])
def test_a_hit_on_a_block_beyond_the_slot_array_is_refused(bad):
    """Blocks 0..3 never used: the slot array holds 4 blocks; -1 is not block 3 (no wrap
    around), 4 is one past the array."""
    q = FreeBlockQueue(range(4))
    with pytest.raises(ValueError, match=exactly(f"block {bad} is not in the free queue")):
        q.remove_many([bad])
    assert list(q) == [0, 1, 2, 3] and len(q) == 4


def test_a_hit_one_past_the_slot_array_is_refused_a_block_at_a_time():
    q = FreeBlockQueue([3, 8])  # slot array of 9 blocks, no never-used ones
    with pytest.raises(ValueError, match=exactly("block 9 is not in the free queue")):
        q.remove(9)
    assert list(q) == [3, 8]


def test_appending_the_block_one_past_the_slot_array_grows_it():
    q = FreeBlockQueue(range(4))
    assert list(q.popleft_many(4)) == [0, 1, 2, 3]
    q.append(4)
    q.append(0)
    assert list(q) == [4, 0] and 4 in q and 5 not in q


def test_the_largest_block_number_is_allowed(monkeypatch):
    monkeypatch.setattr(free_block_queue, "MAX_BLOCK", 20)
    q = FreeBlockQueue()
    q.extend([20])
    with pytest.raises(ValueError, match=exactly("block 21 is beyond the queue's 32-bit block numbers (at most 20)")):
        q.extend([21])
    assert list(q) == [20]


def test_blocks_appended_one_by_one_leave_no_gap_in_the_buffer():
    q = FreeBlockQueue()
    for b in (6, 2, 9, 4):
        q.append(b)
    assert q._tail - q._head == len(q) == 4 and list(q) == [6, 2, 9, 4]


def test_a_wide_take_from_the_buffer_s_first_slot_moves_the_head_past_it(monkeypatch):
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", 0)
    q = FreeBlockQueue()
    q.extend([5, 6, 7])
    assert q.popleft() == 5 and list(q) == [6, 7] and len(q) == 2
    assert list(q.popleft_many(2)) == [6, 7] and not q


def test_a_hit_on_a_used_block_keeps_the_never_used_blocks_a_range():
    q = FreeBlockQueue(range(10))
    assert list(q.popleft_many(2)) == [0, 1]
    q.extend([0])
    q.remove_many([0])
    assert q._fresh == range(2, 10) and list(q) == list(range(2, 10))


def test_a_wrong_count_is_caught_when_a_wide_take_runs_dry(monkeypatch):
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", 0)
    q = FreeBlockQueue()
    q.extend(range(100))
    q._len = 200  # corrupted by hand: only 100 are live
    with pytest.raises(AssertionError, match=exactly("the free queue's count is wrong")):
        q.popleft_many(150)


def uncached_first(blocks=(5, 7)) -> UncachedFirstQueue:
    """Blocks 3 and 4 cached (contents "x", "y", used once and twice), filed in an LFU
    order; ``blocks`` free and uncached."""
    key_of = {3: "x", 4: "y"}
    order = EvictionOrder("lfu", 8)
    q = UncachedFirstQueue(blocks, order, key_of, {k: b for b, k in key_of.items()})
    order.insert("y", 1)
    order.insert("x", 2)
    order.hit("y", 3)
    return q


def test_cached_blocks_are_filed_and_taken_only_after_the_uncached_ones():
    q = uncached_first()
    q.extend([4, 3, 9])
    assert list(q.uncached) == [5, 7, 9] and q.order.num_filed == 2 and len(q) == 5
    assert 3 in q and 4 in q
    assert list(q.popleft_many(5)) == [5, 7, 9, 3, 4]  # then x (one use) before y (two)
    assert not q


def test_popleft_takes_the_eviction_order_s_victim_once_no_uncached_block_is_left():
    q = uncached_first(())
    q.append(4)
    q.append(3)
    assert q.popleft() == 3 and q.popleft() == 4
    with pytest.raises(IndexError, match=exactly("the free block queue is empty")):
        q.popleft()


def test_taking_back_a_cached_free_block_withdraws_it_once():
    q = uncached_first((5,))
    q.extend([3, 4])
    q.remove_many([3])
    assert 3 not in q and len(q) == 2 and q.order.num_filed == 1 and "x" in q.order
    with pytest.raises(ValueError, match=exactly("block 3 is not in the free queue")):
        q.remove(3)  # cached, but held: not filed
    with pytest.raises(ValueError, match=exactly("block 8 is not in the free queue")):
        q.remove(8)  # neither queued nor cached
    assert list(q.popleft_many(2)) == [5, 4]
