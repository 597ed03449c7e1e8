"""The least room (final length - base) every lockstep step asks for comes from a heap
whose entries go stale (``PagedAllocator._least_room``). It must be the least room of the
resident sequences (``check`` asserts it after every operation of the random-operations
tests), and stale entries must not pile up: the per-sequence path files a new entry for
every sequence at every append."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.ledger.paged_allocator import PagedAllocator


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 300), st.sampled_from([1, 4, 16]))
def test_per_sequence_appends_keep_the_room_heap_bounded(seqs, appends, block_size):
    a = PagedAllocator(num_blocks=4096, block_size=block_size)
    for s in range(seqs):
        a.admit([s], 10 + s, 10_000)
    for _ in range(appends):
        assert a.try_append(list(range(seqs)))
        # at most twice the live entries and the slack, plus the one just filed
        assert len(a._room_heap) <= 2 * seqs + 64 + 1
    assert a._least_room() == min(a._room.values()) == 10_000 - (10 + seqs - 1) - appends
    a.check()


def test_the_least_room_skips_sequences_that_left():
    """The sequence with the least room finishes first (freed, or swapped out): the next
    least is the next sequence's, and with nobody resident no run is possible."""
    a = PagedAllocator(num_blocks=64, block_size=4, swap_blocks=8)
    a.admit([0], 4, 6)
    a.admit([1], 4, 9)
    a.admit([2], 4, 30)
    assert a.max_advance_all(100) == 2
    a.free(0)
    assert a.max_advance_all(100) == 5
    a.swap_out([1])
    assert a.max_advance_all(100) == 26
    a.swap_in([1])
    assert a.max_advance_all(100) == 5
    a.free(1)
    a.free(2)
    assert a.max_advance_all(100) == 0 and a.try_append_all()
    a.check()
