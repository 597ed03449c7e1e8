"""The free block queue's rules the prefix-cache tests do not pin down (policies/indexes/free_block_queue.py).

1. ``extend`` appends the given blocks themselves, in order, to the tail.
2. Taking from an empty queue (or more blocks than it holds) fails with a message that
   says what was asked and what was there: the v1 prefix cache lets these surface when its
   books are wrong, so the message is the first clue.
"""

from __future__ import annotations

import pytest

from kvsim.policies.indexes.free_block_queue import FreeBlockQueue


def test_extend_puts_the_blocks_at_the_tail_in_order():
    """[2] extended by (7, 5): the head is still 2, then 7, then 5; each is a member."""
    q = FreeBlockQueue([2])
    q.extend((7, 5))
    assert list(q) == [2, 7, 5] and 7 in q and 5 in q
    assert list(q.popleft_many(3)) == [2, 7, 5]
    assert not q and len(q) == 0


def test_popleft_on_an_empty_queue_says_it_is_empty():
    q = FreeBlockQueue()
    with pytest.raises(IndexError) as err:
        q.popleft()
    assert str(err.value) == "the free block queue is empty"


def test_popleft_many_beyond_the_queue_says_how_many():
    """Asking 3 of 2 takes nothing and names both counts."""
    q = FreeBlockQueue([4, 1])
    with pytest.raises(IndexError) as err:
        q.popleft_many(3)
    assert str(err.value) == "asked for 3 blocks, 2 in the free queue"
    assert list(q) == [4, 1]
