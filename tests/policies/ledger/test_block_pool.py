"""BlockPool: refcounts exact, blocks conserved, no block both free and used."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.ledger.block_pool import BlockPool, OutOfBlocks


def test_allocate_until_empty_then_raises():
    pool = BlockPool(3, 16)
    got = {pool.allocate() for _ in range(3)}
    assert got == {0, 1, 2}
    assert pool.num_free == 0
    with pytest.raises(OutOfBlocks):
        pool.allocate()


def test_release_returns_block_only_after_last_holder():
    pool = BlockPool(2, 4)
    b = pool.allocate()
    pool.share(b)
    assert pool.refcount(b) == 2
    assert pool.release(b) is False
    assert pool.num_free == 1
    assert pool.release(b) is True
    assert pool.num_free == 2
    with pytest.raises(ValueError):
        pool.release(b)


def test_sharing_a_free_block_is_an_error():
    pool = BlockPool(2, 4)
    with pytest.raises(ValueError):
        pool.share(1)


def test_allocate_many_is_all_or_nothing():
    pool = BlockPool(4, 1)
    pool.allocate()
    with pytest.raises(OutOfBlocks):
        pool.allocate_many(4)
    assert pool.num_free == 3
    assert len(set(pool.allocate_many(3))) == 3
    assert pool.num_free == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "share", "release"]), st.integers(0, 1000)), max_size=120))
def test_random_operations_keep_invariants(ops):
    pool = BlockPool(8, 16)
    holders: dict[int, int] = {}  # block -> holders, kept independently of the pool
    for op, pick in ops:
        if op == "alloc":
            if pool.num_free == 0:
                with pytest.raises(OutOfBlocks):
                    pool.allocate()
                continue
            b = pool.allocate()
            assert b not in holders, "a used block was handed out again"
            holders[b] = 1
        elif holders:
            b = sorted(holders)[pick % len(holders)]
            if op == "share":
                pool.share(b)
                holders[b] += 1
            else:
                freed = pool.release(b)
                holders[b] -= 1
                assert freed == (holders[b] == 0)
                if holders[b] == 0:
                    del holders[b]
        pool.check()
        assert pool.num_used == len(holders)
        for b, n in holders.items():
            assert pool.refcount(b) == n


def test_release_all_and_free_exclusive_match_one_by_one_release():
    pool = BlockPool(6, 4)
    table = pool.allocate_many(4)
    pool.share(table[1])
    assert pool.release_all(table) == [table[0], table[2], table[3]]  # table[1] still has a holder
    assert pool.refcount(table[1]) == 1 and pool.num_free == 5
    pool.check()
    with pytest.raises(ValueError):
        pool.release_all([table[0]])  # already free
    mine = pool.allocate_many(3)
    pool.free_exclusive(mine)
    assert pool.num_free == 5
    pool.check()
    pool.share(table[1])
    with pytest.raises(ValueError, match="shared"):
        pool.free_exclusive([table[1]])

