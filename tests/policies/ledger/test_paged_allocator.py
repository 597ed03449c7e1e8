"""Paged allocator: exact block counts, copy-on-write, swapping, and memory classes."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.kv_allocator import Admission, RunWeights
from kvsim.policies.ledger.block_pool import OutOfBlocks
from kvsim.policies.ledger.paged_allocator import (
    PagedAllocator,
    blocks_for,
    blocks_to_grow,
    common_prefix,
)


def test_new_block_only_when_last_is_full():
    a = PagedAllocator(num_blocks=10, block_size=4, swap_blocks=0)
    a.admit([0], prompt_len=5, final_len=9)  # blocks: [4, 1]
    assert a.pool.num_used == 2
    for expected_used in (2, 2, 2, 3):  # slots 6,7,8 fill block 2; slot 9 needs block 3
        assert a.try_append([0])
        assert a.pool.num_used == expected_used
    assert a.kv_len(0) == 9
    a.check()


def test_usage_classes_for_one_sequence():
    a = PagedAllocator(num_blocks=10, block_size=4)
    a.admit([0], prompt_len=5, final_len=7)
    u = a.usage()
    # 2 blocks = 8 slots: 5 tokens, 2 reserved (up to final length 7), 1 never filled.
    assert (u.token_states, u.reserved, u.internal_frag, u.free) == (5, 2, 1, 32)
    u.check()


def test_fork_shares_and_copy_on_write_copies_partial_block():
    a = PagedAllocator(num_blocks=10, block_size=4)
    a.admit([0], prompt_len=6, final_len=12)  # blocks full(4) + partial(2)
    a.fork(0, 1, child_final_len=12)
    assert a.pool.num_used == 2
    assert a.usage().token_states == 6  # shared blocks count once
    assert a.try_append([0])  # seq 0 appends into the shared partial block: copy first
    assert a.cow_copies == 1
    assert a.pool.num_used == 3
    assert a.try_append([1])  # seq 1 is now the only holder: no copy
    assert a.cow_copies == 1
    assert a.pool.num_used == 3
    a.check()
    a.free(0)
    a.free(1)
    assert a.pool.num_free == 10
    a.check()


def test_full_shared_block_is_not_copied():
    a = PagedAllocator(num_blocks=10, block_size=4)
    a.admit([0, 1], prompt_len=8, final_len=12)  # two full blocks shared by two samples
    assert a.try_append([0, 1])
    assert a.cow_copies == 0
    assert a.pool.num_used == 4
    a.check()


def test_try_append_is_all_or_nothing():
    a = PagedAllocator(num_blocks=3, block_size=2)
    a.admit([0], 2, 10)
    a.admit([1], 2, 10)
    a.try_append([0])  # takes the last free block
    before = (a.kv_len(0), a.kv_len(1), a.pool.num_free)
    assert not a.try_append([1])
    assert (a.kv_len(0), a.kv_len(1), a.pool.num_free) == before


def test_admission_watermark_and_never():
    a = PagedAllocator(num_blocks=100, block_size=16)
    assert a.check_admit(16 * 99, 16 * 99, 1, watermark_slots=16) is Admission.OK
    assert a.check_admit(16 * 100, 16 * 100, 1, watermark_slots=16) is Admission.NEVER
    assert a.check_admit(16, 16 * 101, 1, watermark_slots=0) is Admission.NEVER  # could never finish
    a.admit([0], 16 * 60, 16 * 60)
    assert a.check_admit(16 * 40, 16 * 40, 1, watermark_slots=16) is Admission.NO_SPACE


def test_swap_round_trip_keeps_sharing_and_contents():
    a = PagedAllocator(num_blocks=8, block_size=4, swap_blocks=8)
    a.admit([0, 1], prompt_len=6, final_len=10)
    a.try_append([0, 1])
    usage_before = a.usage()
    assert a.can_swap_out([0, 1])
    out = a.swap_out([0, 1])
    assert out.blocks == 3  # 1 shared full block + 2 private partial blocks
    assert a.pool.num_free == 8 and a.cpu_pool.num_used == 3
    a.check()
    back = a.swap_in([0, 1])
    assert back.blocks == 3 and back.slots == out.slots == 4 + 3 + 3
    assert a.usage() == usage_before
    a.check()


def lockstep_steps_possible(a: PagedAllocator, limit: int) -> int:
    """Brute force: lockstep appends that succeed on a copy with no copy-on-write and no
    sequence outgrowing its final length."""
    twin = copy.deepcopy(a)
    for k in range(limit):
        lengths = {s: twin.kv_len(s) for s in twin._room}
        if any(n >= twin._final[s] for s, n in lengths.items()):
            return k
        copies = twin.copied_blocks
        if not twin.try_append_all() or twin.copied_blocks != copies:
            return k
    return limit


@st.composite
def operations(draw):
    return draw(st.lists(st.tuples(st.sampled_from(["admit", "append", "fork", "free", "swap_out", "swap_in",
                                                    "advance", "append_all", "fork_into"]),
                                   st.integers(0, 10_000), st.integers(1, 40)), max_size=80))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), operations())
def test_random_operations_keep_every_invariant(block_size, ops):
    a = PagedAllocator(num_blocks=24, block_size=block_size, swap_blocks=16)
    live: list[int] = []
    swapped: list[int] = []
    next_id = 0
    for op, pick, size in ops:
        if op == "admit":
            if a.check_admit(size, size + 20, 1, 0) is Admission.OK:
                a.admit([next_id], size, size + 20)
                live.append(next_id)
                next_id += 1
        elif op == "append" and live:
            s = live[pick % len(live)]
            before = a.kv_len(s)
            ok = a.try_append([s])
            assert a.kv_len(s) == before + (1 if ok else 0)
        elif op == "fork" and live:
            s = live[pick % len(live)]
            free = a.num_free_blocks  # (the first fork takes the blocks lazy tables owe)
            a.fork(s, next_id, a.kv_len(s) + 20)
            assert a.num_free_blocks == free  # a fork takes no new block
            live.append(next_id)
            next_id += 1
        elif op == "free" and (live or swapped):
            pool = live if live and (pick % 2 or not swapped) else swapped
            s = pool.pop(pick % len(pool))
            a.free(s)
        elif op == "swap_out" and live:
            s = live[pick % len(live)]
            if a.can_swap_out([s]):
                a.swap_out([s])
                live.remove(s)
                swapped.append(s)
        elif op == "fork_into" and len(live) >= 2:
            parent = live[pick % len(live)]
            target = live[(pick // 7 + 1 + pick % len(live)) % len(live)]
            if parent != target:
                a._share()  # fill in lazy tables first, so both take the same blocks
                twin = copy.deepcopy(a)
                final = a.kv_len(parent) + size
                a.fork_into(parent, target, final)
                twin.free(target)
                twin.fork(parent, target, final)  # what fork_into promises to equal
                assert a.usage() == twin.usage()
                assert a._tables[target] == twin._tables[target] == a._tables[parent]
                assert a.pool._refcount == twin.pool._refcount
        elif op == "append_all":
            before = {s: a.kv_len(s) for s in live}
            ok = a.try_append_all()
            assert all(a.kv_len(s) == before[s] + ok for s in live)
        elif op == "advance" and live:
            k = a.max_advance_all(size)
            assert k == lockstep_steps_possible(a, size)
            if k:
                before = {s: a.kv_len(s) for s in live}
                run = RunWeights(k, 0.01 + pick / 1e5, (pick % 7) / 1e3)
                twin = copy.deepcopy(a)
                integral = a.advance_all(run)
                assert all(a.kv_len(s) == before[s] + k for s in live)
                # Brute force: step the twin one append at a time and weigh each state.
                sums = dict.fromkeys(("token_states", "reserved", "internal_frag", "free", "unshared"), 0.0)
                for i in range(1, k + 1):
                    assert twin.try_append_all()
                    u = twin.usage()
                    for c in sums:
                        sums[c] += getattr(u, c) * (run.first + run.slope * (i - 1))
                for c, v in sums.items():
                    assert getattr(integral, c) == pytest.approx(v, rel=1e-9, abs=1e-9), c
                assert a.usage() == twin.usage()
        elif op == "swap_in" and swapped:
            s = swapped[pick % len(swapped)]
            if a.check_swap_in([s], 0) is Admission.OK:
                a.swap_in([s])
                swapped.remove(s)
                live.append(s)
        a.check()  # refcounts exact, blocks conserved, classes sum to capacity
        # Lazy tables: a sequence holds its listed blocks and the ones it is owed.
        owed = [blocks_for(a.kv_len(s), block_size) - len(a._tables[s]) for s in live]
        assert min(owed, default=0) >= 0 and sum(owed) == a.owed_blocks
        assert a.num_free_blocks == a.pool.num_free - a.owed_blocks
    for s in live + swapped:
        a.free(s)
    assert a.pool.num_free == 24 and a.cpu_pool.num_free == 16
    assert a.usage().token_states == 0


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]),
       st.lists(st.tuples(st.sampled_from(["admit", "admit", "append", "free", "swap_out", "swap_in", "advance",
                                           "advance", "append_all"]),
                          st.integers(0, 10_000), st.integers(1, 40)), min_size=10, max_size=80))
def test_lazy_tables_equal_tables_filled_block_by_block(block_size, ops):
    """Without sharing, decode steps only count the blocks they take (lazy tables); an
    allocator that lists every block at once (as with sharing) must agree on every
    number: usage, free blocks, lengths and run integrals."""
    lazy = PagedAllocator(num_blocks=64, block_size=block_size, swap_blocks=16)
    eager = PagedAllocator(num_blocks=64, block_size=block_size, swap_blocks=16)
    eager._share()  # nothing is shared yet, but tables are now filled in block by block
    both = (lazy, eager)
    live: list[int] = []
    swapped: list[int] = []
    next_id = 0
    for op, pick, size in ops:
        if op == "admit":
            verdicts = {a.check_admit(size, size + 1 + pick % 50, 1, 0) for a in both}
            assert len(verdicts) == 1
            if verdicts == {Admission.OK}:
                s = next_id
                next_id += 1
                for a in both:
                    a.admit([s], size, size + 1 + pick % 50)
                live.append(s)
        elif op == "append" and live:
            s = live[pick % len(live)]
            assert len({a.try_append([s]) for a in both}) == 1
        elif op == "free" and live:
            s = live.pop(pick % len(live))
            for a in both:
                a.free(s)
        elif op == "swap_out" and live:
            s = live[pick % len(live)]
            fits = {a.can_swap_out([s]) for a in both}
            assert len(fits) == 1
            if fits == {True}:
                assert len({a.swap_out([s]) for a in both}) == 1
                live.remove(s)
                swapped.append(s)
        elif op == "swap_in" and swapped:
            s = swapped[pick % len(swapped)]
            if all(a.check_swap_in([s], 0) is Admission.OK for a in both):
                for a in both:
                    a.swap_in([s])
                swapped.remove(s)
                live.append(s)
        elif op == "append_all":
            assert len({a.try_append_all() for a in both}) == 1
        elif op == "advance":
            for s in [s for s in live if lazy.kv_len(s) >= lazy._final[s]]:  # finished: retire, as the scheduler does
                live.remove(s)
                for a in both:
                    a.free(s)
            ks = {a.max_advance_all(size) for a in both}
            assert len(ks) == 1
            k = ks.pop()
            if k:
                run = RunWeights(k, 0.01 + pick / 1e5, (pick % 7) / 1e3)
                got, want = (a.advance_all(run) for a in both)
                for c in ("token_states", "reserved", "internal_frag", "free", "unshared"):
                    assert getattr(got, c) == pytest.approx(getattr(want, c), rel=1e-9, abs=1e-9), c
        assert lazy.usage() == eager.usage()
        assert lazy.num_free_blocks == eager.num_free_blocks
        assert {s: lazy.kv_len(s) for s in live + swapped} == {s: eager.kv_len(s) for s in live + swapped}
        assert eager.owed_blocks == 0
        lazy.check()
    assert lazy.lazy_tables  # it stayed lazy throughout


@pytest.mark.parametrize("filled_in", [False, True])
def test_admitting_past_the_free_blocks_raises_even_with_owed_blocks(filled_in):
    """A caller that skips check_admit gets OutOfBlocks, not a negative free count:
    blocks owed to lazy tables are not free."""
    a = PagedAllocator(4, 2)
    if filled_in:
        a._share()
    a.admit([0], 2, 8)
    a.try_append_all()
    a.try_append_all()  # seq 0 holds 2 blocks (lazily: 1 listed + 1 owed)
    assert a.num_free_blocks == 2 and a.check_admit(5, 6, 1, 0) is Admission.NO_SPACE
    with pytest.raises(OutOfBlocks):
        a.admit([1], 5, 6)  # 3 blocks
    assert a.num_free_blocks == 2


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=6),
       st.lists(st.integers(0, 3), max_size=6))
def test_common_prefix_is_the_longest_equal_lead(shared, a_tail, b_tail):
    a, b = shared + a_tail, shared + b_tail
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_blocks_to_grow_is_the_one_rule():
    """A new block exactly when the last one is full, for every length and growth."""
    for B in (1, 3, 4):
        for length in range(3 * B + 1):
            for tokens in range(2 * B + 1):
                held = [b for b in range(length + tokens) if b % B == 0]  # block starts written
                before = sum(1 for b in held if b < length)
                assert blocks_to_grow(length, tokens, B) == len(held) - before
            assert blocks_to_grow(length, 1, B) == (length % B == 0)


def test_the_first_share_swaps_lazy_tables_for_exact_ones_once():
    """Lazy tables owe blocks until something is shared; the fork fills every table in,
    hands over to the exact strategy, and the strategy stays chosen after that."""
    a = PagedAllocator(num_blocks=16, block_size=2)
    a.admit([0], 3, 12)
    a.admit([1], 1, 12)
    for _ in range(4):
        assert a.try_append_all()
    assert a.lazy_tables and a.owed_blocks == 4  # seq 0: 7 tokens in 4 blocks, 2 listed; seq 1: 5 in 3, 1
    a.fork(0, 2, 12)
    assert not a.lazy_tables and a.owed_blocks == 0
    assert [len(a._tables[s]) for s in (0, 1, 2)] == [4, 3, 4] and a._tables[2] == a._tables[0]
    exact = a._tables_mode
    a.fork(1, 3, 12)
    assert a._tables_mode is exact
    a.check()
    assert not PagedAllocator(4, 2, prefix_caching=True).lazy_tables  # a cache shares from the start


def test_refcounts_is_a_view_of_the_pool_counts():
    a = PagedAllocator(num_blocks=4, block_size=2)
    a.admit([0, 1], 3, 4)  # two sequences share both prompt blocks
    assert [a.pool.refcounts[b] for b in range(4)] == [a.pool.refcount(b) for b in range(4)]
    assert sorted(a.pool.refcounts) == [0, 0, 2, 2]
