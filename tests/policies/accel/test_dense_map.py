"""The v1 prefix cache's index in arrays (policies/accel/dense_map.py) and the queued pool's
whole-table paths (numpy past ``NUMPY_TABLE`` blocks): each must do exactly what a dict,
or the block-by-block loop, does."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.accel.dense_map import NUMPY_RUN, DenseMap
from kvsim.policies.ledger.block_pool import NUMPY_TABLE, QueuedBlockPool

keys = st.one_of(st.integers(0, 40), st.integers(-3, -1),
                 st.tuples(st.just("u"), st.integers(0, 3), st.integers(0, 3)))
values = st.one_of(st.integers(0, 50), st.tuples(st.just("u"), st.integers(0, 3), st.integers(0, 3)))
ops = st.lists(st.tuples(st.sampled_from(["set", "pop", "del", "get", "put_ints", "pop_many",
                                          "leading", "delete_many", "put_others", "put_absent_ints",
                                          "put_absent_boxed"]),
                         keys, values, st.lists(st.integers(0, 40), max_size=12, unique=True)),
               max_size=60)


def _plain_leading(d: dict, ks: list[int]) -> list[int]:
    out = []
    for k in ks:
        v = d.get(k)
        if not (type(v) is int and v >= 0):
            break
        out.append(v)
    return out


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(0, 8))
def test_dense_map_does_what_a_dict_does(steps, size):
    m, d = DenseMap(size), {}
    for op, key, value, run in steps:
        if op == "set":
            m[key] = value
            d[key] = value
        elif op == "pop":
            assert m.pop(key, "none") == d.pop(key, "none")
        elif op == "del":
            if key in d:
                del m[key]
                del d[key]
            else:
                with pytest.raises(KeyError):
                    del m[key]
        elif op == "get":
            assert m.get(key) == d.get(key) and (key in m) == (key in d)
        elif op == "put_ints":
            vals = [v % 50 for v in range(len(run))]
            free = not any(k in d for k in run)
            assert m.put_ints(run, vals) == free
            if free:
                d.update(zip(run, vals))
        elif op == "put_others":  # own identities -> blocks, a run at once
            own = [("u", v % 4, k) for k, v in zip(run, range(len(run)))]
            free = not any(k in d for k in own)
            assert m.put_others(own, run) == free
            if free:
                d.update(zip(own, run))
        elif op in ("put_absent_ints", "put_absent_boxed"):  # the caller knows: absent keys only
            absent = [k for k in run if k not in d]
            vals = ([v % 50 for v in range(len(absent))] if op == "put_absent_ints"
                    else [("u", 1, v) for v in range(len(absent))])
            getattr(m, op)(absent, vals)
            d.update(zip(absent, vals))
        elif op == "pop_many":
            assert m.pop_many(run) == [d.pop(k) for k in run if k in d]
        elif op == "leading":
            assert list(m.leading(run)) == _plain_leading(d, run)
        else:
            present = [k for k in run if k in d]
            m.delete_many(present)
            for k in present:
                del d[k]
        assert len(m) == len(d) and bool(m) == bool(d)
        assert dict(m.items()) == d and m.keys() == set(d)


def test_long_runs_go_through_numpy_and_agree_with_the_short_path():
    n = NUMPY_RUN + 100
    m = DenseMap()
    run = list(range(1000, 1000 + n))  # consecutive keys, as a miss's new chain keys are
    assert m.put_ints(run, list(range(n)))
    assert not m.put_ints([5] * 0 + run[:1] + [7], [1, 2])  # one present: nothing stored
    assert 7 not in m and len(m) == n
    m[run[n - 50]] = ("u", 1, 2)  # boxed: not a small int, so a lookup stops there
    assert list(m.leading(run)) == list(range(n - 50))
    assert list(m.leading([3] + run)) == []  # never seen: a miss at once
    scattered = run[::-1][:n - 10] + [10**6]  # reversed, one beyond the array
    popped = m.pop_many(scattered)
    assert popped == [("u", 1, 2) if k == run[n - 50] else k - 1000 for k in run[::-1][:n - 10]]
    assert len(m) == 10 and sorted(m) == run[:10]
    shuffled = [(k * 7919) % (3 * n) + 5 * n for k in range(n)]  # distinct, not a run
    assert m.put_ints(shuffled, list(range(n)))
    assert not m.put_ints(shuffled[1:] + [run[0]], list(range(n)))  # run[0] is present
    assert list(m.leading(shuffled)) == list(range(n)) and len(m) == n + 10
    assert m.pop_many(shuffled[:-1]) == list(range(n - 1)) and len(m) == 11
    beyond = list(range(4 * n, 5 * n))  # absent, past the array: it grows
    m.put_absent_ints(beyond, list(range(n)))
    assert list(m.leading(beyond)) == list(range(n)) and len(m) == n + 11


def test_pool_whole_table_paths_match_the_block_by_block_loop():
    n = NUMPY_TABLE + 40
    big, small = QueuedBlockPool(3 * n, 16), QueuedBlockPool(3 * n, 16)
    for pool in (big, small):
        table = pool.allocate_many(n)
        assert list(table) == list(range(n))
        pool.hold(table[::3])  # a second holder of every third block
    # the big pool releases the whole table at once, the small one in short pieces
    freed_big = big.release_table(list(range(n))[::-1])
    freed_small = sum(small.release_table(list(range(n))[::-1][i:i + 10]) for i in range(0, n, 10))
    assert freed_big == freed_small == n - len(range(0, n, 3))
    assert list(big._free) == list(small._free)
    assert list(big.refcounts) == list(small.refcounts)
    assert big.in_use(list(range(n))) == len(range(0, n, 3)) == small.in_use(list(range(0, n, 3)))
    # a hit on the freed blocks and the held ones takes the free ones out of the queue
    assert big.hold(list(range(n))) == n - len(range(0, n, 3))
    assert [big.refcount(b) for b in range(n)] == [2 if b % 3 == 0 else 1 for b in range(n)]
    big.check()
    with pytest.raises(ValueError, match="block 0 released more often than held"):
        QueuedBlockPool(n, 16).release_table(list(range(n)))
    twice = QueuedBlockPool(n + 1, 16)
    twice.allocate_many(n)
    with pytest.raises(ValueError, match="released twice at once"):
        twice.release_table(list(range(n - 1)) + [0])
    assert list(twice.refcounts)[:n] == [1] * n  # refused: nothing done
    assert twice.release_all(list(range(n))) == list(range(n))
