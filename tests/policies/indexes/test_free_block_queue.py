"""vLLM v1's free block queue and the prefix cache built on it (policies/indexes/free_block_queue.py,
QueuedBlockPool, V1PrefixCacheAllocator): eviction order, hits out of the middle,
first-registration-wins, and exact memory classes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.free_block_queue import FreeBlockQueue
from kvsim.policies.ledger.block_pool import NUMPY_TABLE, OutOfBlocks, QueuedBlockPool
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator


def test_queue_is_fifo_with_removal_from_the_middle():
    q = FreeBlockQueue(range(5))
    assert q.popleft() == 0
    q.remove(2)
    q.append(0)  # freed: to the tail
    assert list(q) == [1, 3, 4, 0] and len(q) == 4 and 3 in q and 2 not in q
    assert list(q.popleft_many(2)) == [1, 3]
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(4)
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(7)
    with pytest.raises(IndexError):
        q.popleft_many(3)


def test_never_used_blocks_are_the_head_of_the_range_left():
    """What a v1 cache skips when it forgets the contents of blocks it takes: only blocks
    still in the never-used range, which are always taken first."""
    q = FreeBlockQueue(range(6))
    assert q.never_used == 6
    taken = list(q.popleft_many(2))
    q.extend(taken[::-1])  # used, freed: behind the range
    assert q.never_used == 4 and list(q)[:4] == [2, 3, 4, 5]
    q.popleft_many(5)
    assert q.never_used == 0 and QueuedBlockPool(3, 16).never_used == 3


def test_a_whole_table_held_out_of_the_never_used_range():
    """``hold`` past ``NUMPY_TABLE`` blocks on never-used ones (no prefix hit does this, a
    pool user may): they leave the queue, and the next take skips them."""
    n = NUMPY_TABLE + 8
    pool = QueuedBlockPool(2 * n, 16)
    assert pool.hold(list(range(1, n + 1))) == n
    assert pool.num_free == n and pool.never_used == 0
    assert list(pool.allocate_many(n)) == [0, *range(n + 1, 2 * n)]


def test_a_whole_hit_with_a_few_free_blocks_takes_them_out_of_the_queue():
    """``hold`` past ``NUMPY_TABLE`` blocks of which only a few are free (fewer than the free
    queue's one-by-one limit): those leave the queue, the rest just gain a holder."""
    n = NUMPY_TABLE + 20
    pool = QueuedBlockPool(2 * n, 16)
    table = list(pool.allocate_many(n))
    assert pool.release_table(table[:10][::-1]) == 10  # now free (and cached, for a v1 cache)
    assert pool.hold(table) == 10
    assert pool.num_free == n and all(pool.refcounts[b] == (1 if i < 10 else 2) for i, b in enumerate(table))
    assert list(pool.allocate_many(n)) == list(range(n, 2 * n))


def test_block_numbers_beyond_64_bits_are_refused_with_the_queue_s_own_errors():
    with pytest.raises(ValueError, match="block numbers are integers >= 0"):
        FreeBlockQueue().extend([2**70])
    with pytest.raises(ValueError, match=f"block {2**70} is not in the free queue"):
        FreeBlockQueue(range(4)).remove_many([2**70])


def test_queued_pool_takes_the_head_and_frees_to_the_tail():
    pool = QueuedBlockPool(4, 16)
    assert list(pool.allocate_many(2)) == [0, 1]  # index order at first
    pool.reclaim(3)  # a hit on a free block takes it out of the middle
    assert pool.refcount(3) == 1 and list(pool._free) == [2]
    pool.release_all([1, 0])
    assert list(pool._free) == [2, 1, 0]
    assert pool.allocate() == 2
    pool.check()
    with pytest.raises(OutOfBlocks):
        pool.allocate_many(3)


def cache(num_blocks=8, B=4):
    return V1PrefixCacheAllocator(num_blocks, B)


def test_a_request_frees_last_block_first_so_its_tail_is_evicted_first():
    """Sequence 0 (request 7) holds 3 full blocks [0, 1, 2] and one partial, [3]; the
    others wait in the queue [4..7]. Freed, its blocks join the tail last first: [.., 3, 2, 1,
    0] and its full ones are named ("u", 7, i). Taking 5 blocks then evicts the four never
    used ones, then block 3 (uncached: no eviction), and the next takes block 2 (its identity
    ("u", 7, 2) evicted): a lookup now finds blocks 0 and 1 only."""
    a = cache()
    a.open_seq(0, [], 13, 13)
    a.name(0, [], 7, 0, 3)
    assert list(a._tables[0]) == [0, 1, 2, 3]
    a.free(0)
    assert list(a.pool._free) == [4, 5, 6, 7, 3, 2, 1, 0]
    assert list(a.lookup([], 7, 13)) == [0, 1, 2]
    a.open_seq(1, [], 20, 20)
    a.name(1, [], 8, 0, 4)
    assert a.evictions == 0
    a.open_seq(2, [], 1, 1)
    a.name(2, [], 9, 0, 0)
    assert a.evictions == 1 and list(a._tables[2]) == [2]
    assert list(a.lookup([], 7, 13)) == [0, 1]
    a.check()


def test_hit_on_a_free_block_leaves_the_queue_and_counts_as_held():
    a = cache()
    a.open_seq(0, [], 9, 9)
    a.name(0, [], 0, 0, 2)
    a.free(0)
    hits = a.lookup([], 0, 9)
    assert list(hits) in ([1, 0], [0, 1])
    assert a.in_use(hits) == 0
    a.take_hits(hits)
    assert all(b not in a.pool._free for b in hits)
    a.open_seq(1, hits, 9, 9)
    a.name(1, [], 0, 2, 2)
    u = a.usage()
    assert u.token_states == 9 and u.free == (8 - 3) * 4
    u.check()
    a.check()


def test_hit_is_capped_at_num_tokens_minus_one():
    a = cache()
    keys = a.prefix_keys(["x", "y"])
    a.open_seq(0, [], 8, 10)
    a.name(0, keys, 0, 0, 1)
    a.register_full(0)
    assert len(a.lookup(keys, 1, 9)) == 2  # 8 cached tokens of 9
    assert len(a.lookup(keys, 1, 8)) == 1  # at most 7 of 8: one whole block


def test_the_first_registration_stays_cached_and_the_duplicate_is_free_uncached():
    """Two sequences computed the same shared block (both missed). The first registered
    is the cached copy; freed, the second's copy is an uncached free block: taking it
    evicts nothing, while taking the first's evicts its identity."""
    a = cache(num_blocks=4)
    keys = a.prefix_keys(["x"])
    for s in (0, 1):
        a.open_seq(s, [], 5, 5)
        a.name(s, keys, s, 0, 1)
    a.register_full(0)
    a.register_full(1)
    first, second = a._tables[0][0], a._tables[1][0]
    assert list(a.lookup(keys, 2, 5)) == [first]
    a.free(1)
    a.free(0)
    taken = a._take_many(4)
    assert taken.index(second) < taken.index(first) and a.evictions == 1
    assert list(a.lookup(keys, 2, 5)) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.booleans()), min_size=1, max_size=40))
def test_memory_classes_stay_exact_under_random_use(ops):
    """Open, extend (decode-like and chunk-like), free and hit sequences at random: the
    allocator's books (refcounts, free queue, cache index, token states, classes summing
    to capacity) balance after every operation."""
    a = cache(num_blocks=12)
    keys = a.prefix_keys(["a", "b"])
    live: dict[int, int] = {}
    for s, tokens, grow in ops:
        if s in live:
            if grow and a.extend(s, min(tokens, 40 - a.kv_len(s))) if a.kv_len(s) < 40 else False:
                a.register_full(s)
            else:
                a.free(s)
                del live[s]
        else:
            hits = a.lookup(keys, s, tokens)
            need = -(-tokens // 4) - a.in_use(hits)
            if need <= a.num_free_blocks:
                a.take_hits(hits)
                a.open_seq(s, hits, tokens, 40)
                a.name(s, keys, s, len(hits), (tokens - 1) // 4)
                live[s] = tokens
        a.check()
