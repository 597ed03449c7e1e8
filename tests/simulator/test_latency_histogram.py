"""Inter-token latencies in log buckets: exact mean, quantiles within the bucket width."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.simulator.latency_histogram import LatencyHistogram


def test_quantiles_within_a_tenth_of_a_percent_and_exact_mean():
    rng = np.random.default_rng(1)
    values = rng.lognormal(-3, 0.5, 5000)
    h = LatencyHistogram()
    for v in values:
        h.add(float(v))
    assert h.mean == pytest.approx(values.mean(), rel=1e-12)
    for q in (0.5, 0.9, 0.99):
        exact = np.sort(values)[int(np.ceil(q * len(values))) - 1]
        assert h.quantile(q) == pytest.approx(exact, rel=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 1.0), st.floats(0, 1e-3), st.integers(1, 3000), st.integers(1, 5))
def test_linear_run_in_closed_form_counts_like_adding_one_by_one(a, b, n, times):
    closed, single = LatencyHistogram(), LatencyHistogram()
    closed.add_linear(a, b, n, times)
    for i in range(n):
        single.add(a + b * i, times)
    assert closed.count == single.count == n * times
    assert closed.total == pytest.approx(single.total, rel=1e-9)
    # Every bucket holds the same count, up to values that sit on a bucket edge.
    a, b = closed.buckets(), single.buckets()
    moved = sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))
    assert moved <= 2 * times  # at most a value on a bucket edge filed one bucket over
    for q in (0.01, 0.5, 0.99, 1.0):
        assert closed.quantile(q) == pytest.approx(single.quantile(q), rel=2.1e-3)


def test_unsorted_values_and_merge():
    h, other = LatencyHistogram(), LatencyHistogram()
    for v in (0.3, 0.1, 0.2):
        h.add(v)
    other.add(0.4, 2)
    h.merge(other)
    assert h.count == 5 and h.mean == pytest.approx((0.6 + 0.8) / 5)
    assert h.quantile(1.0) == pytest.approx(0.4, rel=1e-3)
    assert np.isnan(LatencyHistogram().quantile(0.5))
