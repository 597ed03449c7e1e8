"""The paged allocator's ledger rules its other tests do not pin down
(policies/ledger/paged_allocator.py, policies/ledger/v1_prefix_cache.py).

1. ``check`` names what drifted: each of the ledger's running totals, corrupted by hand,
   fails with its own message (the message is the first clue when a campaign or a random
   test trips it), and ``check`` itself changes nothing (it fills in a *copy* of lazy tables).
2. ``free_slots`` is free blocks times the block size; ``resident`` lists the GPU-resident
   sequences.
3. ``extend_all`` is all or nothing: it counts the copy-on-write copies a lockstep append
   will make, and a chunk's sequence that crosses a block boundary counts that block once.
4. vLLM v1's cache: a duplicate block (same identity computed twice) stays uncached even
   after the first copy is evicted; taking a cached block for a new slot forgets its
   identity; the v1 allocator has no CPU pool; the v0 entry points refuse with one message.
"""

from __future__ import annotations

import pytest

from kvsim.policies.kv_allocator import Admission, MemoryUsage, RunWeights
from kvsim.policies.ledger.block_pool import OutOfBlocks
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator, block_identities

B = 4  # block size (slots) in every scenario here


def lazy_ledger() -> PagedAllocator:
    """Two sequences, lazy tables (nothing shared), 3 decode steps taken as owed blocks."""
    a = PagedAllocator(16, B)
    a.admit([1], 5, 20)
    a.admit([2], 3, 20)
    for _ in range(3):
        assert a.try_append_all()
    assert a.lazy_tables and a.owed_blocks == 1  # seq 2 went 3 -> 6 tokens: one block owed
    return a


def exact_ledger() -> PagedAllocator:
    """The same, with a prefix cache (exact tables from the start)."""
    a = PagedAllocator(16, B, prefix_caching=True)
    a.admit([1], 5, 20, prefix=("p",))
    a.admit([2], 3, 20)
    for _ in range(3):
        assert a.try_append_all()
    return a


def v1_ledger() -> V1PrefixCacheAllocator:
    a = V1PrefixCacheAllocator(16, B)
    for s, tokens in ((1, 5), (2, 3)):
        a.open_seq(s, [], tokens, 20)
        a.name(s, [], request_id=s, hit_blocks=0, lookups=0)
    assert a.try_append_all()
    return a


def test_the_ledgers_start_consistent():
    for a in (lazy_ledger(), exact_ledger(), v1_ledger()):
        a.check()


def test_check_changes_nothing_with_owed_blocks():
    """Lazy tables: ``check`` fills in the tables of a deep copy, never the allocator's own."""
    a = lazy_ledger()
    tables = {s: list(t) for s, t in a._tables.items()}
    free = a.pool.num_free
    a.check()
    assert a.owed_blocks == 1 and a.lazy_tables
    assert a._tables == tables and a.pool.num_free == free


def corrupt_table_longer(a):
    a._tables[1].append(a.pool.allocate())


def corrupt_owed(a):
    a._tables_mode.owed += 1


@pytest.mark.parametrize(("corrupt", "message"), [
    (corrupt_table_longer, "a table lists more blocks than its sequence holds"),
    (corrupt_owed, "owed block total drifted"),
    (lambda a: setattr(a, "_token_states", a._token_states + 1), "token_states drifted"),
])
def test_lazy_check_names_what_drifted(corrupt, message):
    a = lazy_ledger()
    corrupt(a)
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == message


def bump(field: str):
    def corrupt(a):
        setattr(a, field, getattr(a, field) + 1)
    return corrupt


def stray_due_entry(a):
    a._due[0][99] = None


EXACT_DRIFTS = [
    (bump("_token_states"), "token_states drifted from the blocks' contents"),
    (bump("_res_seqs"), "resident sequence count drifted"),
    (bump("_res_base"), "resident kv total drifted"),
    (stray_due_entry, "due buckets drifted"),
    (bump("_res_blocks"), "resident block total drifted"),
    (bump("_res_over"), "over-final total drifted"),
]


@pytest.mark.parametrize(("corrupt", "message"), EXACT_DRIFTS)
def test_exact_check_names_what_drifted(corrupt, message):
    a = exact_ledger()
    corrupt(a)
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == message


@pytest.mark.parametrize(("corrupt", "message"), [
    d for d in EXACT_DRIFTS if d[1] != "due buckets drifted"
] + [(lambda a: a._key_of.__setitem__(9, 123), "cache index sizes differ")])
def test_v1_check_names_what_drifted(corrupt, message):
    a = v1_ledger()
    corrupt(a)
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == message


def test_check_names_an_evictable_block_still_held():
    """Block 0 holds seq 1's cached prompt block; listing it as evictable is a lie."""
    a = exact_ledger()
    assert 0 in a._key_of and a.pool.refcount(0) == 2  # the sequence's and the cache's
    a._evictable[0] = None
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == "evictable block 0 is still held"


def test_check_names_owed_blocks_under_exact_tables():
    """A table one block short, and the strategy owing exactly that block: the totals
    agree, but exact tables owe nothing."""
    a = exact_ledger()
    a.pool.release(a._tables[2].pop())
    a._tables_mode.owed = 1
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == "exact tables owe no blocks"


def test_check_names_a_usage_disagreement(monkeypatch):
    a = lazy_ledger()
    walk = a._usage_walk()
    off = MemoryUsage(walk.capacity, walk.token_states, walk.reserved - B, walk.internal_frag + B,
                      walk.free, walk.unshared)
    monkeypatch.setattr(a, "_usage_walk", lambda: off)
    with pytest.raises(AssertionError) as err:
        a.check()
    assert str(err.value) == "incremental usage disagrees with the tables"


def test_free_slots_and_resident():
    """16 blocks of 4: prompts of 5 and 3 tokens hold 3 blocks; 13 free = 52 slots."""
    a = PagedAllocator(16, B)
    a.admit([7], 5, 20)
    a.admit([3], 3, 20)
    assert a.free_slots() == 52
    assert sorted(a.resident()) == [3, 7]


def test_extend_all_counts_the_copies_a_shared_partial_block_needs():
    """A 5-token sequence forked: both share a partly filled last block; the next append
    copies it (counted for each holder: 2) and only 1 block is free, so nothing happens."""
    a = PagedAllocator(3, B)
    a.admit([1], 5, 20)
    a.fork(1, 2, 20)
    assert a.num_free_blocks == 1
    assert a.max_advance_all(10) == 0  # a copy is pending: no closed-form run
    assert a.extend_all() is False
    assert (a.kv_len(1), a.kv_len(2), a.num_free_blocks, a.cow_copies) == (5, 5, 1, 0)


def test_extend_all_counts_a_crossing_chunk_block_once():
    """A full 4-token block: the one slot and a 4-token chunk (3 more) need one new block
    between them, and one is free."""
    a = PagedAllocator(2, B)
    a.admit([1], 4, 20)
    assert a.extend_all([(1, 4)]) is True
    assert a.kv_len(1) == 8 and a.num_free_blocks == 0
    a.check()


# --- vLLM v1's cache ---------------------------------------------------------------------

def test_v1_identity_of_a_block():
    """Shared-prefix blocks use the prefix's keys, every other full block is the request's own."""
    assert list(block_identities([7, 8], 3, 1, 4)) == [8, ("u", 3, 2), ("u", 3, 3)]
    assert list(block_identities([7, 8], 3, 0, 1)) == [7]
    assert list(block_identities([], 5, 0, 1)) == [("u", 5, 0)]
    assert list(block_identities([7], 5, 3, 3)) == []


def test_v1_a_duplicate_stays_uncached_after_the_first_copy_is_evicted():
    """Seqs 1 and 2 both compute the prefix block (no lookup in between): 1's copy is
    cached, 2's is a duplicate. 1 ends and its blocks are evicted by seq 3; when seq 2
    registers its next full block, its duplicate does not become the cached copy."""
    a = V1PrefixCacheAllocator(8, B)
    keys = a.prefix_keys(["p"])
    for s in (1, 2):
        a.open_seq(s, [], 5, 12)
        a.name(s, keys, request_id=s, hit_blocks=0, lookups=1)
        a.register_full(s)
    first = a._tables[1][0]
    assert list(a.lookup(keys, 9, 8)) == [first]
    a.free(1)
    a.open_seq(3, [], 24, 24)  # takes every free block: the cached ones are evicted
    a.name(3, [], request_id=3, hit_blocks=0, lookups=0)
    assert list(a.lookup(keys, 9, 8)) == []
    a.free(3)
    assert a.extend(2, 4)
    a.register_full(2)
    assert list(a.lookup(keys, 9, 8)) == []
    assert list(a.lookup(keys, 2, 9)) == []  # the request's own block 1 is named, but block 0 misses
    a.check()


def test_v1_taking_a_cached_block_for_a_new_slot_forgets_it():
    """2 blocks. Seq 1's full prefix block (cached) is freed last and waits at the queue's
    tail; seq 2 fills a block exactly and outgrows its final length, so its next slot
    takes that cached block: its identity is gone (an eviction)."""
    a = V1PrefixCacheAllocator(2, B)
    keys = a.prefix_keys(["p"])
    a.open_seq(1, [], 5, 8)
    a.name(1, keys, request_id=1, hit_blocks=0, lookups=1)
    a.register_full(1)
    cached = a._tables[1][0]
    a.free(1)
    a.open_seq(2, [], 4, 4)
    a.name(2, [], request_id=2, hit_blocks=0, lookups=0)
    assert a._tables[2][0] != cached
    assert a.try_append_all()
    assert a._tables[2][1] == cached
    assert list(a.lookup(keys, 9, 8)) == [] and a.evictions == 1
    a.check()


def test_by_default_there_is_no_cpu_pool():
    a = PagedAllocator(4, B)
    a.admit([1], 3, 8)
    assert a.cpu_pool.num_blocks == 0 and not a.can_swap_out([1])


def test_v1_has_no_cpu_pool():
    a = V1PrefixCacheAllocator(4, B)
    a.open_seq(1, [], 3, 8)
    assert a.cpu_pool.num_blocks == 0 and not a.can_swap_out([1])


@pytest.mark.parametrize("entry", ["check_admit", "admit"])
def test_v1_refuses_the_v0_entry_points(entry):
    a = V1PrefixCacheAllocator(4, B)
    with pytest.raises(NotImplementedError) as err:
        getattr(a, entry)([1], 4, 8)
    assert str(err.value) == "the v1 prefix cache is driven by SchedulerV1 (lookup, open_seq, extend)"


def test_open_seq_refuses_a_sequence_with_nothing_to_compute():
    """Cached blocks covering every token: the last block would be shared, not its own."""
    a = V1PrefixCacheAllocator(4, B)
    with pytest.raises(AssertionError) as err:
        a.open_seq(1, [], 0, 8)
    assert str(err.value) == "a sequence computes at least one token past its cached blocks"


def test_extend_all_with_one_token_chunks_touches_no_table():
    """A one-token chunk is the lockstep slot alone: lazy tables stay lazy (seq 2 still owes
    its block, seq 1 crossing into a new block owes one more)."""
    a = lazy_ledger()
    assert a.extend_all([(2, 1)]) is True
    assert a.owed_blocks == 2 and a.kv_len(2) == 7 and a.kv_len(1) == 9
    a.check()


def test_fork_into_a_beam_of_the_same_length_takes_the_new_final_length():
    """Two beams of 8 tokens (full blocks, nothing to copy), finals 30 and 20; beam 2
    becomes a copy of beam 1 with final 30: 22 lockstep steps fit before anyone ends."""
    a = PagedAllocator(32, B)
    a.admit([1, 2], 8, [30, 20])
    assert a.max_advance_all(100) == 12
    a.fork_into(1, 2, 30)
    assert a.max_advance_all(100) == 22
    a.check()


def test_swap_in_of_a_group_as_large_as_the_gpu_fits():
    """4 GPU blocks, a 16-token sequence swapped out holds all 4: it fits back exactly."""
    a = PagedAllocator(4, B, swap_blocks=4)
    a.admit([1], 16, 20)
    assert a.can_swap_out([1])  # 4 CPU blocks hold it exactly
    a.swap_out([1])
    assert a.check_swap_in([1], 0) == Admission.OK
    assert a.check_swap_in([1], B) == Admission.NEVER  # a watermark block leaves 3


def test_swap_in_evicts_unreferenced_cached_blocks():
    """4 GPU blocks: seq 1's two cached prompt blocks outlive it (evictable), seq 3 holds
    the other two; swapping seq 2 (2 blocks) back in must evict both cached ones."""
    a = PagedAllocator(4, B, swap_blocks=4, prefix_caching=True)
    a.admit([1], 8, 12, prefix=("a", "b"))
    a.admit([2], 8, 12)
    a.swap_out([2])
    a.free(1)
    a.admit([3], 8, 12)
    assert a.pool.num_free == 0 and a.num_free_blocks == 2
    assert a.check_swap_in([2], 0) == Admission.OK
    assert a.swap_in([2]).blocks == 2
    assert a.evictions == 2 and a.num_free_blocks == 0 and a.kv_len(2) == 8
    a.check()


def test_a_first_block_is_not_a_later_block_of_another_chain():
    """("x", "y", "z") cached: a prompt whose first block holds "z" shares no identity
    with the third block (the root's parent is no block's key)."""
    a = PagedAllocator(16, B, prefix_caching=True)
    a.admit([1], 13, 20, prefix=("x", "y", "z"))
    assert a.admit([2], 5, 20, prefix=("z",)) == 0
    assert (a.prefix_lookups, a.prefix_hits) == (4, 0)


def test_a_block_identity_depends_on_its_parent():
    """("a", "b") and ("c", "d") cached: ("a", "d") hits its first block only (its "d"
    follows "a", not "c")."""
    a = PagedAllocator(16, B, prefix_caching=True)
    a.admit([1], 8, 20, prefix=("a", "b"))
    a.admit([2], 8, 20, prefix=("c", "d"))
    assert a.admit([3], 9, 20, prefix=("a", "d")) == 4
    assert a.prefix_hits == 1
    a.check()


def test_a_sequence_past_its_final_length_has_no_room():
    """Admitted for 4 tokens, it takes a fifth: its final length is now 5, so no lockstep
    step fits before its next append, and the 3 empty slots of its second block are
    internal fragmentation, not a reservation."""
    a = PagedAllocator(4, B)
    a.admit([1], 4, 4)
    assert a.try_append_all()
    assert a.kv_len(1) == 5 and a.max_advance_all(10) == 0
    u = a.usage()
    assert (u.token_states, u.reserved, u.internal_frag) == (5, 0, 3)
    a.check()


def test_swap_in_without_its_check_names_the_skipped_check():
    """2 GPU blocks, both taken while seq 1 (2 blocks) is swapped out: swapping it in
    anyway fails with the allocator's own error, not a bare KeyError."""
    a = PagedAllocator(2, B, swap_blocks=2)
    a.admit([1], 8, 12)
    a.swap_out([1])
    a.admit([2], 8, 12)
    with pytest.raises(OutOfBlocks) as err:
        a.swap_in([1])
    assert str(err.value) == "no free GPU block (the caller skipped a check)"


def test_a_one_sequence_final_length_may_come_as_a_list():
    """``final_len`` [9] for one 5-token sequence: 4 lockstep steps fit before it ends."""
    a = PagedAllocator(8, B)
    a.admit([1], 5, [9])
    assert a.max_advance_all(100) == 4
    a.check()


def test_without_a_prefix_cache_a_prefix_is_ignored():
    """No cache: a group admitted twice with the same prefix computes it twice, and
    nothing is looked up."""
    a = PagedAllocator(16, B)
    assert a.admit([1, 2], 8, 20, prefix=("a", "b")) == 0
    assert a.admit([3, 4], 8, 20, prefix=("a", "b")) == 0
    assert (a.prefix_lookups, a.prefix_hits) == (0, 0) and a.num_free_blocks == 12
    a.check()


def test_blocks_after_a_still_cached_child_are_indexed_too():
    """("a", "b") cached, then "a"'s block evicted (by a 5-block prompt) while "b"'s stays:
    a prompt ("a", "b", "c") misses from the start; it indexes its "a" and "c" blocks and
    keeps the old "b" copy, so the next such prompt hits all three."""
    a = PagedAllocator(6, B, prefix_caching=True)
    a.admit([1], 8, 12, prefix=("a", "b"))
    a.free(1)
    a.admit([2], 20, 24)
    assert a.evictions == 1
    a.free(2)
    assert a.admit([3], 13, 16, prefix=("a", "b", "c")) == 0
    assert a.admit([4], 13, 16, prefix=("a", "b", "c")) == 12
    assert a.prefix_hits == 3
    a.check()


def test_admitting_past_the_free_blocks_says_how_many():
    """4 blocks, 3 taken: a 5-token prompt (2 blocks) without its check names both counts."""
    a = PagedAllocator(4, B)
    a.admit([1], 12, 12)
    with pytest.raises(OutOfBlocks) as err:
        a.admit([2], 5, 8)
    assert str(err.value) == "asked for 2 GPU blocks, 1 free (the caller skipped a check)"


def test_a_run_integrates_capacity_and_free_slots_over_its_seconds():
    """8 blocks of 4, one 5-token sequence; 3 steps of 0.5 s take it to 8 tokens, still in
    its 2 blocks: capacity 32 slots and free 24 slots, each held for 1.5 s."""
    a = PagedAllocator(8, B)
    a.admit([1], 5, 20)
    u = a.advance_all(RunWeights(3, 0.5, 0.0))
    assert u.capacity == pytest.approx(48.0) and u.free == pytest.approx(36.0)
    assert a.kv_len(1) == 8
    a.check()


def test_no_run_without_resident_sequences_or_steps():
    a = PagedAllocator(8, B)
    assert a.max_advance_all(5) == 0
    a.admit([1], 5, 20)
    assert a.max_advance_all(0) == 0 and a.max_advance_all(5) == 5


def test_a_run_stops_at_the_first_append_that_finds_no_block():
    """3 blocks of 4: seq 1 (4 tokens) and seq 2 (2 tokens) hold one each, 1 is free.
    Step 1 gives seq 1 the free block, step 3 would need one for seq 2: 2 steps fit."""
    a = PagedAllocator(3, B)
    a.admit([1], 4, 40)
    a.admit([2], 2, 40)
    assert a.max_advance_all(100) == 2


def test_the_lockstep_append_serves_a_sequence_reaching_its_final_length():
    """Seq 2 (3 tokens, final 7) after 3 steps has one slot of room: the next append is
    still the lockstep one (tables stay lazy: seq 2 still owes its block, seq 1 crossing
    into its third block owes one more); the per-sequence path is for outgrowing it."""
    a = PagedAllocator(16, B)
    a.admit([1], 5, 20)
    a.admit([2], 3, 7)
    for _ in range(3):
        assert a.try_append_all()
    assert a.owed_blocks == 1
    assert a.try_append_all()
    assert a.owed_blocks == 2 and a.kv_len(2) == 7
    a.check()


def test_an_append_with_nobody_resident_succeeds():
    assert PagedAllocator(4, B).try_append_all() is True


def test_a_freed_swapped_sequence_is_forgotten():
    """Seq 1 swapped out, then freed; its id admitted again after a step is a resident
    sequence like any other (its length counts the clock)."""
    a = PagedAllocator(8, B, swap_blocks=4)
    a.admit([1], 4, 8)
    a.admit([2], 4, 8)
    a.swap_out([1])
    a.free(1)
    assert a.try_append_all()
    a.admit([1], 4, 8)
    assert a.kv_len(1) == 4 and sorted(a.resident()) == [1, 2]
    a.check()


def test_an_append_into_the_last_free_slot_of_a_block_takes_no_block():
    """One block of 4, a 3-token sequence admitted with final length 3 (so the append goes
    the per-sequence way): its fourth token fits the block it has, with no block free."""
    a = PagedAllocator(1, B)
    a.admit([1], 3, 3)
    assert a.try_append_all() is True
    assert a.kv_len(1) == 4 and a.num_free_blocks == 0
    a.check()
