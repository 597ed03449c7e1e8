"""The free block queue's buffer (policies/indexes/free_block_queue.py): dead entries left by hits out
of the middle, compaction when the buffer fills, and the one-by-one and windowed takes, all
against a plain list (the queue's meaning: free blocks, head first)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes import free_block_queue
from kvsim.policies.indexes.free_block_queue import FreeBlockQueue

OPS = st.lists(st.tuples(st.sampled_from(["take", "free", "hit", "pop"]), st.integers(0, 60),
                         st.integers(1, 9)), max_size=80)


@pytest.fixture
def tiny_buffer(monkeypatch):
    """A buffer of 2 slots and one-block-at-a-time paths for at most 2 blocks: every path runs often."""
    monkeypatch.setattr(free_block_queue, "MIN_CAPACITY", 2)
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", 2)


def _check(q: FreeBlockQueue, model: list[int], held: list[int]) -> None:
    assert list(q) == model and len(q) == len(model) and bool(q) == bool(model)
    assert all(b in q for b in model) and not any(b in q for b in held)
    # the buffer never holds more entries than its slots (compaction keeps it so)
    assert q._tail - q._head <= len(q._buf)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # constants only
@given(ops=OPS, fresh=st.integers(0, 12), use_range=st.booleans())
def test_the_queue_is_a_plain_list_under_random_takes_frees_and_hits(tiny_buffer, ops, fresh, use_range):
    """Take n from the head, free several to the tail, take several out of the middle (hits),
    single pops: the queue always lists the model's blocks in the model's order."""
    model = list(range(fresh))
    q = FreeBlockQueue(range(fresh) if use_range else model)
    held = list(range(fresh, 40))  # blocks a request holds (never in the queue yet)
    for op, x, n in ops:
        if op == "take" and model:
            k = 1 + x % len(model)
            assert list(q.popleft_many(k)) == model[:k]
            held += model[:k]
            del model[:k]
        elif op == "pop" and model:
            assert q.popleft() == model.pop(0)
        elif op == "free" and held:
            chosen = [held.pop(x % len(held)) for _ in range(min(n, len(held)))]
            q.extend(chosen)
            model += chosen
        elif op == "hit" and model:
            chosen = [model.pop(x % len(model)) for _ in range(min(n, len(model)))]
            q.remove_many(chosen)
            held += chosen
        _check(q, model, held)


def test_dead_entries_are_passed_over_and_a_full_buffer_mostly_live_doubles(tiny_buffer):
    """Blocks 0..7 freed (the buffer grows to 16 slots), 1..6 hit (dead entries), 8..15
    freed (the buffer is full), 3 freed again: 6 of 16 entries are dead and nothing was
    taken from the head, so the buffer doubles (to twice what it must hold, rounded up)
    and no entry moves: 3 goes to slot 16."""
    q = FreeBlockQueue()
    q.extend(range(8))
    assert len(q._buf) == 16
    q.remove_many([1, 2, 3, 4, 5, 6])
    q.extend(range(8, 16))
    assert q._tail == 16 and len(q) == 10
    q.append(3)
    assert len(q._buf) == 64 and (q._head, q._tail) == (0, 17)
    assert list(q) == [0, 7, *range(8, 16), 3]
    q.remove(7)
    assert list(q.popleft_many(10)) == [0, *range(8, 16), 3] and not q
    with pytest.raises(IndexError, match="asked for 1 blocks, 0 in the free queue"):
        q.popleft_many(1)


def test_a_full_buffer_mostly_dead_drops_its_dead_entries(tiny_buffer):
    """Blocks 0..7 freed (16 slots), 1..7 hit, 8..15 freed (full), 8..12 hit: 12 of 16
    entries are dead, so freeing 3 again moves the live entries 0, 13, 14, 15 to the front
    of the buffer (16 slots: room for twice what it holds), 3 behind them."""
    q = FreeBlockQueue()
    q.extend(range(8))
    q.remove_many(range(1, 8))
    q.extend(range(8, 16))
    q.remove_many(range(8, 13))
    assert len(q._buf) == 16 and q._tail == 16
    q.append(3)
    assert len(q._buf) == 16 and (q._head, q._tail) == (0, 5)
    assert list(q) == [0, 13, 14, 15, 3] and q._pos[3] == 4


def test_a_buffer_exactly_half_live_doubles_and_less_than_half_is_compacted(tiny_buffer):
    """The boundary of the two ways: 8 live of 16 entries doubles the buffer (no entry moves,
    the next goes to slot 16); 6 live of 16 compacts (the next goes to slot 6)."""
    half, less = FreeBlockQueue(), FreeBlockQueue()
    for q, hits in ((half, []), (less, [8, 9])):
        q.extend(range(8))
        q.remove_many(range(8))  # 8 dead entries
        q.extend(range(8, 16))
        q.remove_many(hits)
        assert q._tail == 16 == len(q._buf)
    half.append(0)
    less.append(0)
    assert (half._head, half._tail, half._pos[0]) == (0, 17, 16)
    assert (less._head, less._tail, less._pos[0]) == (0, 7, 6)
    assert list(less) == [10, 11, 12, 13, 14, 15, 0]


def test_never_used_blocks_do_not_count_as_live_entries_of_the_buffer(tiny_buffer):
    """8 never-used blocks at the head and 6 live entries of 32 in the buffer: the buffer is
    mostly dead, so the next free compacts it (the range is not in the buffer)."""
    q = FreeBlockQueue(range(24))
    used = list(q.popleft_many(16))  # 0..15; 16..23 stay never used
    q.extend(used)
    q.remove_many(used)
    q.extend(used)
    q.remove_many(used[:10])
    assert (q._tail, len(q._buf), q.never_used) == (32, 32, 8)
    q.append(0)
    assert (q._head, q._tail) == (0, 7)
    assert list(q) == [*range(16, 24), *range(10, 16), 0]


def test_wide_takes_skip_dead_entries_in_windows(monkeypatch):
    """A take wider than the one-by-one limit, over a head full of dead entries."""
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", 0)
    q = FreeBlockQueue()
    q.extend(range(100))
    q.remove_many(range(0, 100, 3))
    want = [b for b in range(100) if b % 3]
    assert list(q.popleft_many(50)) == want[:50] and list(q) == want[50:]
    assert q.popleft() == want[50]


@pytest.mark.parametrize("batch", [0, 64])  # through numpy, and a block at a time
def test_bad_blocks_are_refused_without_changing_the_queue(monkeypatch, batch):
    monkeypatch.setattr(free_block_queue, "SCALAR_BATCH", batch)
    q = FreeBlockQueue([3, 8])
    with pytest.raises(ValueError, match="block numbers are integers >= 0"):
        q.extend([-1])
    with pytest.raises(ValueError, match="block 2147483648 is beyond the queue's 32-bit block numbers"):
        q.extend([2**31])
    with pytest.raises(ValueError, match="block 2 is not in the free queue"):
        q.remove_many([8, 2])
    with pytest.raises(ValueError, match="block 8 is not in the free queue \\(taken out twice\\)"):
        q.remove_many([8, 8])
    with pytest.raises(ValueError, match="a block was given twice"):
        q.extend([5, 5])
    with pytest.raises(ValueError, match="block 3 is already in the free queue"):
        q.extend([6, 3])
    assert list(q) == [3, 8] and len(q) == 2
    assert not any(b in q for b in (-1, 2, 5, 6))
