"""Sustainable-rate search: bisection on synthetic monotone curves and on a tiny simulation."""

import math

import pytest

from kvsim.simulator.app.executors import InProcessExecutor, execute_run
from kvsim.simulator.app.rate_search import (
    RateBisection,
    SustainabilityCriterion,
    find_sustainable_rate,
)
from kvsim.simulator.app.sweep import load_sweep, run_sweep
from kvsim.simulator.config import validate_config
from kvsim.simulator.engine.runner import run_experiment


@pytest.mark.parametrize("knee", [0.6, 3.3, 7.3, 15.9])
def test_bisection_finds_a_known_knee_to_the_tolerance(knee):
    seen = []

    def ok(rate):
        seen.append(rate)
        return rate <= knee

    res = find_sustainable_rate(ok, lo=0.5, hi=16.0, tolerance=0.1)
    assert res.status == "ok"
    good, bad = res.bracket
    assert res.rate == good <= knee < bad and bad - good <= 0.1
    assert all(p.sustainable == (p.rate <= knee) for p in res.points)
    assert len(seen) == len(set(seen)) <= 2 + math.ceil(math.log2(15.5 / 0.1))


def test_ends_outside_the_range_are_reported_not_guessed():
    below = find_sustainable_rate(lambda r: False, 1.0, 8.0, max_widenings=0)
    assert below.status == "below_lo" and below.rate is None and len(below.points) == 2
    assert below.is_bound
    above = find_sustainable_rate(lambda r: True, 1.0, 8.0, max_widenings=0)
    assert above.status == "above_hi" and above.rate == 8.0 and len(above.points) == 2
    assert above.is_bound and above.bracket == (8.0, None)
    # Widening first: 4 times by 4x on each side, then the bound is reported.
    above = find_sustainable_rate(lambda r: True, 1.0, 8.0)
    assert above.status == "above_hi" and above.rate == 8.0 * 4**4 and above.widened == 4
    below = find_sustainable_rate(lambda r: False, 1.0, 8.0)
    assert below.status == "below_lo" and min(p.rate for p in below.points) == 1.0 / 4**4


@pytest.mark.parametrize("knee", [0.013, 0.3, 2.2, 5.9, 41.0, 700.0])
def test_default_search_is_relative_and_widens_to_bracket_the_knee(knee):
    # A range that misses the knee (0.013, 41, 700) is widened; every answer is bracketed to 2%
    # of the rate found, whatever its size (an absolute (hi - lo)/32 left 0.3 req/s within 60%).
    res = find_sustainable_rate(lambda r: r <= knee, lo=0.05, hi=6.0)
    assert res.status == "ok" and not res.is_bound
    good, bad = res.bracket
    assert res.rate == good <= knee < bad
    assert bad - good <= 0.02 * good
    assert (res.widened > 0) == (not 0.05 <= knee < 6.0)
    assert len(res.points) <= 2 + 4 + 12


def test_both_precisions_must_hold_when_both_are_given():
    res = find_sustainable_rate(lambda r: r <= 3.3, 0.5, 16.0, tolerance=0.5, rel_tolerance=0.01)
    good, bad = res.bracket
    assert bad - good <= 0.01 * good


def test_state_machine_asks_for_both_ends_then_one_midpoint_at_a_time():
    s = RateBisection(2.0, 10.0, tolerance=1.0)
    assert s.wanted() == [2.0, 10.0] and not s.done
    s.record(2.0, True)
    assert s.wanted() == [10.0]
    s.record(10.0, False)
    assert s.wanted() == [6.0]
    s.record(6.0, False)
    assert s.wanted() == [4.0]
    s.record(4.0, True)
    assert s.wanted() == [5.0]
    s.record(5.0, True)
    assert (
        s.done and s.wanted() == [] and s.result().rate == 5.0 and s.result().bracket == (5.0, 6.0)
    )


@pytest.mark.parametrize(
    "lo, hi, tol", [(0, 4, None), (4, 2, None), (1, 2, 0), (1, float("inf"), None)]
)
def test_invalid_ranges_are_refused(lo, hi, tol):
    with pytest.raises(ValueError):
        RateBisection(lo, hi, tol)


def test_criterion_needs_completed_requests_and_fails_on_nan():
    c = SustainabilityCriterion(max_normalized_latency=0.1, max_p99_ttft_ms=500)
    base = {"completed": 10, "normalized_latency_s_per_token": 0.05, "p99_ttft_ms": 100.0}
    assert c.sustainable(base)
    assert not c.sustainable(base | {"completed": 0})
    assert not c.sustainable(base | {"normalized_latency_s_per_token": float("nan")})
    assert not c.sustainable(base | {"p99_ttft_ms": 501.0})
    assert not c.sustainable(base | {"p99_ttft_ms": None})
    with pytest.raises(ValueError):
        SustainabilityCriterion(max_normalized_latency=None)


def test_search_on_a_tiny_simulation_matches_direct_runs_and_reuses_its_runs(
    write_sweep, tiny_base
):
    tiny_base["workload"]["num_requests"] = 120
    path = write_sweep(
        {
            "zip": {"label": ["paged-16", "paged-256"], "allocator.block_size": [16, 256]},
            "find_rate": {"lo": 1.0, "hi": 64.0, "tolerance": 2.0, "max_normalized_latency": 0.03},
        },
        base=tiny_base,
    )
    spec = load_sweep(path)
    result = run_sweep(spec, workers=2)
    rates = result.rates
    assert list(rates["system"]) == ["paged-16", "paged-256"]
    assert (rates["search_status"] == "ok").all()
    assert (result.table["status"] == "ok").all()
    assert list(rates["evaluations"]) == result.table.groupby("system", sort=False).size().tolist()
    criterion = SustainabilityCriterion(max_normalized_latency=0.03)
    for (_, r), block in zip(rates.iterrows(), (16, 256)):
        assert r["bracket_hi"] - r["bracket_lo"] <= 2.0 and r["sustainable_rate"] == r["bracket_lo"]
        for rate, expect in ((r["bracket_lo"], True), (r["bracket_hi"], False)):
            raw = dict(tiny_base, allocator={"kind": "paged", "block_size": block})
            raw["workload"] = dict(
                tiny_base["workload"], arrivals={"kind": "poisson", "rate": rate}
            )
            summary = run_experiment(
                validate_config(raw)
            ).summary  # outside the sweep and its cache
            assert criterion.sustainable(summary) is expect
    calls = []
    again = run_sweep(spec, InProcessExecutor(lambda job: calls.append(job) or execute_run(job)))
    assert calls == [] and again.reused == len(result.table)
    assert again.rates["sustainable_rate"].tolist() == rates["sustainable_rate"].tolist()
