"""The v1 prefix cache's per-run paths (speed): chained keys walked a run at a
time (policies/indexes/key_chain.py), whole-table releases and whole-hit holds in the queued pool,
lookups in strides. Each must give exactly what the block-by-block definition gives."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.free_block_queue import FreeBlockQueue
from kvsim.policies.indexes.key_chain import KeyChain, chain_keys_plain
from kvsim.policies.ledger.block_pool import QueuedBlockPool
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator, block_identities

# A prompt: a cut of an earlier prompt (a shared prefix) plus new blocks from a small
# alphabet, so contents repeat under different parents and chains branch and rejoin runs.
prompt_ops = st.lists(
    st.tuples(st.integers(0, 10), st.integers(0, 200), st.lists(st.integers(0, 2), max_size=80)),
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(prompt_ops)
def test_key_chain_gives_the_block_by_block_keys(ops):
    chain, plain, prompts = KeyChain(), {}, [[]]
    for base, cut, new in ops:
        source = prompts[base % len(prompts)]
        prompt = source[:cut] + [("h", c, len(source[:cut]) + j) for j, c in enumerate(new)]
        prompts.append(prompt)
        assert list(chain.keys(prompt)) == chain_keys_plain(plain, prompt)
        assert len(chain) == len(plain)
    # every pair is found again, in any order, without creating keys
    for prompt in reversed(prompts):
        assert list(chain.keys(prompt)) == chain_keys_plain(plain, prompt)
    assert len(chain) == len(plain)


def test_key_chain_keeps_a_dict_entry_per_branch_not_per_block():
    chain = KeyChain()
    trunk = [("h", 0, j) for j in range(1000)]
    assert list(chain.keys(trunk)) == list(range(1000))
    assert chain.branches == {}  # one run from the root: key 0 follows parent -1
    fork = trunk[:600] + [("h", 1, j) for j in range(600, 900)]
    assert list(chain.keys(fork)) == list(range(600)) + list(range(1000, 1300))
    assert chain.branches == {(599, ("h", 1, 600)): 1000}  # one entry for 300 new blocks
    # a prompt that runs along the trunk, onto the fork and back is walked from both
    assert list(chain.keys(fork[:700])) == list(range(600)) + list(range(1000, 1100))
    assert list(chain.keys(trunk[:5] + [("h", 9, 5)])) == [0, 1, 2, 3, 4, 1300]
    assert len(chain) == 1301


def test_key_chain_takes_any_iterable_and_empty_prompts():
    chain = KeyChain()
    assert list(chain.keys(())) == [] and len(chain) == 0
    assert list(chain.keys(iter([("p", 1, 0), ("p", 1, 1)]))) == [0, 1]
    assert list(chain.keys((("p", 1, 0),))) == [0]


def test_queue_extend_keeps_order_and_refuses_a_queued_block():
    q = FreeBlockQueue([5])
    q.extend([3, 1, 4])
    q.extend(iter([9]))
    assert list(q) == [5, 3, 1, 4, 9]
    with pytest.raises(ValueError, match="block 4 is already in the free queue"):
        q.extend([7, 4])
    with pytest.raises(ValueError, match="already in the free queue"):
        FreeBlockQueue().extend([2, 2])
    q.remove_many([1, 9])
    assert list(q) == [5, 3, 4]
    with pytest.raises(ValueError, match="block 1 is not in the free queue"):
        q.remove_many([1])


def test_pool_release_all_frees_in_order_to_the_tail_and_hold_takes_back():
    pool = QueuedBlockPool(6, 16)
    table = pool.allocate_many(4)  # [0, 1, 2, 3]
    pool.share(1)
    pool.share(2)
    freed = pool.release_all(table[::-1])  # last block first, as a request frees
    assert freed == [3, 0] and list(pool._free) == [4, 5, 3, 0]
    assert [pool.refcount(b) for b in range(4)] == [0, 1, 1, 0]
    assert pool.hold([0, 1, 2, 3]) == 2  # 0 and 3 were free: out of the queue
    assert [pool.refcount(b) for b in range(4)] == [1, 2, 2, 1] and list(pool._free) == [4, 5]
    pool.check()
    with pytest.raises(ValueError, match="released more often than held"):
        pool.release_all([4])


def _plain_lookup(cache: V1PrefixCacheAllocator, keys, rid, tokens):
    hits = []
    for key in block_identities(keys, rid, 0, (tokens - 1) // cache.block_size):
        b = cache._cached.get(key)
        if b is None:
            break
        hits.append(b)
    return hits


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(1, 300 * 4), st.sets(st.integers(0, 299), max_size=3))
def test_lookup_in_strides_is_the_plain_lookup(named, tokens, holes):
    cache = V1PrefixCacheAllocator(400, 4)
    keys = cache.prefix_keys([("h", 0, j) for j in range(named)])
    for i, key in enumerate(block_identities(keys, 7, 0, 320)):  # cached: shared and own blocks
        if i not in holes:
            cache._cached[key] = i
    assert list(cache.lookup(keys, 7, tokens)) == _plain_lookup(cache, keys, 7, tokens)
    assert cache.in_use(cache.lookup(keys, 7, tokens)) == 0


def test_never_used_blocks_stay_a_range_until_one_is_taken_from_the_middle():
    q = FreeBlockQueue(range(10**6))  # an unbounded cache: no buffer entry per block
    assert len(q) == 10**6 and q._tail == 0 and 5 in q
    assert list(q.popleft_many(3)) == [0, 1, 2] and q.popleft() == 3
    q.extend([1, 0])  # freed blocks queue behind every never-used one
    assert q._tail == 2 and list(q)[:2] == [4, 5] and list(q)[-2:] == [1, 0]
    with pytest.raises(ValueError, match="block 7 is already in the free queue"):
        q.extend([2, 7])
    with pytest.raises(ValueError, match="block 9 is already in the free queue"):
        q.append(9)
    small = FreeBlockQueue(range(6))
    small.popleft()
    small.append(0)
    small.remove_many([3])  # out of the middle of the never-used blocks: they spill into the buffer
    assert list(small) == [1, 2, 4, 5, 0] and len(small) == 5
    small.remove(1)
    assert list(small.popleft_many(4)) == [2, 4, 5, 0] and not small
    with pytest.raises(IndexError):
        small.popleft()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "free", "hit"]), st.integers(0, 40)),
                max_size=60))
def test_queue_with_a_fresh_range_behaves_as_one_ordered_queue(ops):
    q, model, held = FreeBlockQueue(range(30)), list(range(30)), []
    for op, x in ops:
        if op == "take" and model:
            n = 1 + x % len(model)
            assert list(q.popleft_many(n)) == model[:n]
            held += model[:n]
            del model[:n]
        elif op == "free" and held:
            b = held.pop(x % len(held))
            q.extend([b])
            model.append(b)
        elif op == "hit" and model:
            b = model.pop(x % len(model))
            q.remove_many([b])
            held.append(b)
        assert list(q) == model and len(q) == len(model)
        assert all(b in q for b in model) and not any(b in q for b in held)
