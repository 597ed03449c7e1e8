"""RunWeights: the closed forms allocators integrate memory against equal the plain sums."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.kv_allocator import RunWeights


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.floats(1e-4, 1.0), st.floats(0, 1e-2), st.data())
def test_run_weights_closed_forms_match_sums(steps, first, slope, data):
    run = RunWeights(steps, first, slope)
    d = [first + slope * (i - 1) for i in range(1, steps + 1)]
    assert run.total == pytest.approx(sum(d), rel=1e-12)
    assert run.ramp == pytest.approx(sum(i * x for i, x in enumerate(d, 1)), rel=1e-12)
    j = data.draw(st.integers(1, steps + 1))
    assert run.tail(j) == pytest.approx(sum(d[j - 1:]), rel=1e-12, abs=1e-15)
    every = data.draw(st.integers(1, 64))
    count = len(range(j, steps + 1, every))
    expected = sum(run.tail(t) for t in range(j, steps + 1, every))
    assert run.tails(j, every, count) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-3, 1.0), st.floats(0, 1e-2), st.floats(1e-6, 10.0))
def test_iterations_to_reach_is_the_first_boundary_at_or_after(first, slope, seconds):
    run = RunWeights(1, first, slope)
    m = run.iterations_to_reach(seconds)
    assert run.elapsed(m) >= seconds
    assert m == 1 or run.elapsed(m - 1) < seconds
    assert run.elapsed(m) == pytest.approx(sum(first + slope * i for i in range(m)), rel=1e-9)
