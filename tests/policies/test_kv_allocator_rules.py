"""The shared allocator interface's own rules (policies/kv_allocator.py), which mutation
testing found unchecked: ``MemoryUsage.check`` catches any negative class, the default
methods an allocator may inherit do what they say, and errors give their numbers."""

import pytest

from kvsim.policies.kv_allocator import KVAllocator, MemoryUsage, RunWeights, final_lengths
from kvsim.policies.ledger.paged_allocator import PagedAllocator


@pytest.mark.parametrize("negative", ["token_states", "reserved", "internal_frag", "free"])
def test_usage_check_rejects_any_negative_class(negative):
    # Classes that sum to the capacity but with one of them negative.
    values = {"token_states": 4, "reserved": 4, "internal_frag": 4, "free": 4}
    values[negative] = -2
    other = next(c for c in values if c != negative)
    values[other] += 6  # the sum stays 16
    with pytest.raises(AssertionError):
        MemoryUsage(16, **values).check()
    MemoryUsage(16, 16, 0, 0, 0).check()  # zero is a valid class


def test_usage_check_names_a_wrong_sum():
    with pytest.raises(AssertionError, match="^memory classes sum to 15, capacity 16$"):
        MemoryUsage(16, 4, 4, 4, 3).check()


def test_final_lengths_one_per_sequence():
    assert final_lengths(7, 3) == [7, 7, 7]
    assert final_lengths([5, 6], 2) == [5, 6]
    with pytest.raises(ValueError, match="^2 final lengths for 3 sequences$"):
        final_lengths([5, 6], 3)


def two_sequences():
    """A paged allocator holding sequence 0 (prompt 6, final 9) and a fork 1 of it."""
    a = PagedAllocator(16, 4)
    a.admit([0], 6, 9)
    a.fork(0, 1, 9)
    assert a.try_append([0])
    return a


def test_default_fork_into_is_free_then_fork():
    # The default (for allocators without a faster one) and the paged override agree.
    default, override = two_sequences(), two_sequences()
    KVAllocator.fork_into(default, 0, 1, 9)
    override.fork_into(0, 1, 9)
    for a in (default, override):
        a.check()
        assert (a.kv_len(0), a.kv_len(1)) == (7, 7)
    assert default.usage() == override.usage()


def test_defaults_without_macro_steps_or_copies():
    a = two_sequences()
    assert KVAllocator.max_advance_all(a, 5) == 0  # step one iteration at a time
    with pytest.raises(NotImplementedError, match="^PagedAllocator does not support macro-stepping$"):
        KVAllocator.advance_all(a, RunWeights(1, 1.0, 0.0))
    with pytest.raises(NotImplementedError, match="^PagedAllocator shares blocks instead of copying$"):
        KVAllocator.copy_into(a, 0, 1)


@pytest.mark.parametrize("count", [0, -1])
def test_no_tails_sum_to_nothing(count):
    run = RunWeights(10, 1.0, 0.5)
    assert run.tails_sum(4, count, 3, 2, 2) == 0.0
    assert run.tails(1, 4, count) == 0.0
    assert run.tail(11) == 0.0 and run.tail(12) == 0.0  # past the last iteration


@pytest.mark.parametrize("first", [1e-3, 0.013, 0.3])
@pytest.mark.parametrize("slope", [0.0, 1e-5, 7e-4, 0.1])
def test_a_boundary_reached_exactly_takes_exactly_that_many_iterations(first, slope):
    # The closed-form estimate may land one past an exact boundary (float rounding in the
    # square root, e.g. first 1e-3, slope 1e-5, 1 iteration); it must settle back on it.
    run = RunWeights(1, first, slope)
    for m in range(1, 300):
        assert run.iterations_to_reach(run.elapsed(m)) == m
        assert run.iterations_to_reach(run.elapsed(m) * (1 + 1e-12)) == m + 1


class CountingRun(RunWeights):
    """RunWeights that counts the ``elapsed`` evaluations a search makes."""

    def elapsed(self, m: int) -> float:
        self.calls = getattr(self, "calls", 0) + 1
        return super().elapsed(m)


@pytest.mark.parametrize("first", [1e-3, 0.013, 0.3])
@pytest.mark.parametrize("slope", [0.0, 1e-5, 1e-4, 7e-4, 0.1])
def test_the_closed_form_lands_within_one_iteration(first, slope):
    # iterations_to_reach solves the quadratic for the boundary and only corrects float
    # rounding: one evaluation each way around the estimate, at most 3 in all (a search
    # from a poor estimate would walk there one iteration at a time).
    run = CountingRun(1, first, slope)
    for m in [1, 2, 3, 5, 10, 40, 130, 500, 2000]:
        for seconds in (run.elapsed(m), run.elapsed(m) * (1 - 1e-9), (run.elapsed(m) + run.elapsed(m - 1)) / 2):
            run.calls = 0
            assert run.iterations_to_reach(seconds) == m
            assert run.calls <= 3, (m, seconds, run.calls)
