"""Edges of the v1 free queue under a non-LRU eviction policy that mutation testing found
unchecked: emptiness, membership of an uncached block, taking back an uncached block, and
the one-line errors when the queue runs dry."""

from __future__ import annotations

import pytest

from kvsim.policies.indexes.eviction_order import EvictionOrder
from kvsim.policies.indexes.free_block_queue import UncachedFirstQueue


def queue(blocks=(), cached: dict[int, str] | None = None) -> UncachedFirstQueue:
    cached = cached or {}
    return UncachedFirstQueue(blocks, EvictionOrder("lfu", 8), dict(cached), {k: b for b, k in cached.items()})


@pytest.mark.parametrize("blocks, truth", [((), False), ((7,), True), ((7, 8), True)])
def test_a_queue_is_true_while_it_holds_a_block(blocks, truth):
    assert bool(queue(blocks)) is truth


def test_a_cached_free_block_alone_makes_the_queue_true():
    q = queue(cached={3: "x"})
    q.order.insert("x", 1)
    q.append(3)
    assert bool(q) and len(q) == 1 and 3 in q


def test_an_uncached_free_block_is_in_the_queue_and_a_taken_one_is_not():
    q = queue((1, 2))
    assert 1 in q and 2 in q and 5 not in q
    q.remove(1)  # an uncached block taken back (e.g. reclaimed by its pool)
    assert 1 not in q and list(q) == [2] and q.popleft() == 2


def test_the_queue_running_dry_says_so_in_one_line():
    q = queue()
    with pytest.raises(IndexError) as err:
        q.popleft()
    assert str(err.value) == "the free block queue is empty"
    q = queue((1,))
    with pytest.raises(IndexError) as err:
        q.popleft_many(2)
    assert str(err.value) == "asked for 2 blocks, 1 in the free queue"
    assert list(q) == [1]  # all or none
