"""Prefix caching in the paged allocator: chained identities, reuse, LRU eviction."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator


def contents(tag, n):
    return [(tag, j) for j in range(n)]


def test_shared_prefix_blocks_are_reused_and_counted_once():
    a = PagedAllocator(num_blocks=20, block_size=4, prefix_caching=True)
    assert a.admit([0], 10, 12, contents("p", 2)) == 0  # cold: nothing cached
    used = a.pool.num_used
    cached = a.admit([1], 10, 12, contents("p", 2))
    assert cached == 8  # two full 4-token blocks hit
    assert a.pool.num_used == used + 1  # only the unique tail block is new
    assert a.prefix_hits == 2 and a.prefix_lookups == 4
    a.check()


def test_identity_is_chained_a_block_needs_its_whole_prefix():
    a = PagedAllocator(num_blocks=20, block_size=4, prefix_caching=True)
    a.admit([0], 8, 9, [("x", 0), ("y", 0)])
    # Same second block content after a different first block: no hit at all.
    assert a.admit([1], 8, 9, [("z", 0), ("y", 0)]) == 0
    a.check()


def test_whole_prompt_cached_still_computes_last_token():
    a = PagedAllocator(num_blocks=20, block_size=4, prefix_caching=True)
    a.admit([0], 8, 9, contents("p", 2))
    assert a.admit([1], 8, 9, contents("p", 2)) == 7


def test_freed_cached_blocks_stay_reusable_and_count_as_free():
    a = PagedAllocator(num_blocks=10, block_size=4, prefix_caching=True)
    a.admit([0], 8, 9, contents("p", 2))
    a.free(0)
    assert a.num_free_blocks == 10 and a.usage().free == 40 and a.usage().token_states == 0
    assert a.admit([1], 8, 9, contents("p", 2)) == 7  # revived from the cache
    a.check()


def test_referenced_cached_blocks_are_never_evicted():
    a = PagedAllocator(num_blocks=6, block_size=4, prefix_caching=True)
    a.admit([0], 8, 20, contents("held", 2))  # held by a running sequence
    a.admit([1], 8, 9, contents("old", 2))
    a.free(1)  # 2 unreferenced cached blocks
    held = [a._cached[k] for k in a._keys(contents("held", 2))]
    assert a.check_admit(16, 17, 1, 0, contents("new", 4)) is Admission.OK
    a.admit([2], 16, 17, contents("new", 4))  # needs 4 blocks: 2 free + 2 evicted
    assert a.evictions == 2
    assert all(a._key_of.get(b) is not None for b in held)
    assert a.kv_len(0) == 8
    a.check()
    assert a.check_admit(4, 5, 1, 0) is Admission.NO_SPACE  # nothing left to evict


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "append", "free", "fork", "fork_into"]), st.integers(0, 50),
                          st.integers(0, 3)), max_size=60))
def test_random_operations_with_cache_keep_invariants(ops):
    a = PagedAllocator(num_blocks=16, block_size=2, swap_blocks=0, prefix_caching=True)
    live, next_id = [], 0
    for op, pick, tag in ops:
        if op == "admit":
            prompt = 1 + pick % 9
            prefix = contents(tag, prompt // 2)
            if a.check_admit(prompt, prompt + 4, 1, 0, prefix) is Admission.OK:
                a.admit([next_id], prompt, prompt + 4, prefix)
                live.append(next_id)
                next_id += 1
        elif op == "append" and live:
            a.try_append([live[pick % len(live)]])
        elif op == "fork" and live:
            s = live[pick % len(live)]
            a.fork(s, next_id, a.kv_len(s) + 4)
            live.append(next_id)
            next_id += 1
        elif op == "free" and live:
            a.free(live.pop(pick % len(live)))
        elif op == "fork_into" and len(live) >= 2:
            parent, target = live[pick % len(live)], live[(pick + 1 + tag) % len(live)]
            if parent != target:
                a.fork_into(parent, target, a.kv_len(parent) + 4)
                assert a._tables[target] == a._tables[parent]
        a.check()
        # Every referenced cached block is still indexed.
        held = {b for s in live for b in a._tables[s]}
        assert not (held & set(a._evictable))
    for s in live:
        a.free(s)
    assert a.num_free_blocks == 16


def test_child_block_cached_after_its_parent_was_evicted_is_kept_consistent():
    a = PagedAllocator(num_blocks=4, block_size=2, prefix_caching=True)
    a.admit([0], 4, 5, contents("p", 2))
    a.free(0)  # p0, p1 unreferenced, p0 least recently used
    a.admit([1], 6, 7)  # 3 blocks: 2 free + evicts p0; p1 stays cached without its parent
    a.free(1)
    assert a.evictions == 1
    assert a.admit([2], 4, 5, contents("p", 2)) == 0  # the chain breaks at p0: no hit
    a.check()  # p1's cache entry still points at one block, indexed once
    a.free(2)
    assert a.admit([3], 4, 5, contents("p", 2)) == 3  # whole chain cached again
    a.check()
