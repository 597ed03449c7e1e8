"""Runs of block numbers and keys as typed arrays (policies/accel/int_runs.py): each helper gives
exactly the array the item-by-item definition gives, and numpy reads them in place."""

from array import array

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.policies.accel import int_runs
from kvsim.policies.accel.dense_map import DenseMap
from kvsim.policies.accel.int_runs import BLOCKS, KEYS, arange, extend_run, from_numpy, view
from kvsim.policies.indexes.key_chain import KeyChain
from kvsim.policies.ledger.block_pool import QueuedBlockPool
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator


@given(st.integers(0, 2**31 - 2000), st.integers(0, 1500), st.sampled_from([BLOCKS, KEYS]))
def test_arange_and_extend_run_are_the_item_by_item_arrays(start, count, typecode):
    want = array(typecode, range(start, start + count))
    got = arange(start, start + count, typecode)
    assert got == want and got.typecode == typecode
    out = array(typecode, [7])
    extend_run(out, start, start + count)
    assert out == array(typecode, [7]) + want


@pytest.mark.parametrize("count", [0, int_runs.SHORT_RUN, int_runs.SHORT_RUN + 1, 1000])
def test_extend_run_on_both_sides_of_the_short_run_threshold(count):
    out = array(KEYS)
    extend_run(out, 5, 5 + count)
    assert list(out) == list(range(5, 5 + count))


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300))
def test_from_numpy_keeps_every_value_and_view_reads_them_in_place(values):
    got = from_numpy(np.array(values, dtype=np.int64))
    assert list(got) == values and got.typecode == BLOCKS
    assert all(type(v) is int for v in got)  # Python ints: dict and DenseMap keys stay ints
    seen = view(got)
    assert seen.tolist() == values
    if values:
        seen[0] = 12345  # a view, not a copy
        assert got[0] == 12345


def test_the_v1_paths_hand_runs_on_as_typed_arrays():
    """Keys, hits, fresh blocks and tables stay arrays from end to end (a list anywhere
    would be read item by item by numpy again)."""
    chain = KeyChain()
    keys = chain.keys(list(range(300)))
    assert isinstance(keys, array) and keys.typecode == KEYS and list(keys) == list(range(300))
    pool = QueuedBlockPool(1000, 16)
    fresh = pool.allocate_many(400)
    assert isinstance(fresh, array) and fresh.typecode == BLOCKS and list(fresh) == list(range(400))
    index = DenseMap()
    assert index.put_ints(keys, fresh[:300])
    hits = index.leading(keys)
    assert isinstance(hits, array) and hits.typecode == BLOCKS and list(hits) == list(range(300))

    a = V1PrefixCacheAllocator(100, 4)
    k = a.prefix_keys(list(range(10)))
    a.open_seq(0, a.lookup(k, 0, 41), 41, 41)
    a.name(0, k, 0, 0, 10)
    assert isinstance(a._tables[0], array) and list(a._tables[0]) == list(range(11))
    a.free(0)
    hits = a.lookup(k, 1, 41)
    assert isinstance(hits, array) and list(hits) == list(range(10))
    a.take_hits(hits)
    a.open_seq(1, hits, 41, 41)
    a.name(1, k, 1, len(hits), 10)
    assert list(a._tables[1]) == [*range(10), 11]  # block 10 (the partial one) waits ahead of 11
    a.check()
