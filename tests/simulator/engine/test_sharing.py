"""Sharing end to end: parallel samples, beam search, shared prefixes (issue: copy-on-write)."""

import pytest

from kvsim.simulator.config import validate_config
from kvsim.simulator.engine.runner import run_experiment


def run(**sections):
    raw = {
        "name": "share",
        "model": {"name": "opt-13b"},
        "hardware": {"gpu": "a100-40gb", "kv_cache_gib": 12},
        "workload": {
            "arrivals": {"kind": "poisson", "rate": 4.0},
            "lengths": {"kind": "preset", "name": "alpaca-paper"},
            "num_requests": 150,
        },
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return run_experiment(validate_config(raw)).summary


def test_no_sharing_no_saving():
    s = run()
    assert s["memory_saving_perc"] == pytest.approx(0.0, abs=1e-9)
    assert s["cow_copies"] == 0


@pytest.mark.parametrize("n", [2, 4])
def test_parallel_samples_share_the_prompt(n):
    s = run(workload={"n": n})
    assert s["completed"] == 150
    assert s["memory_saving_perc"] > 1.0
    assert s["cow_copies"] > 0  # each sample copies the shared partial prompt block once


def test_contiguous_allocators_do_not_share():
    s = run(workload={"n": 4}, allocator={"kind": "contiguous", "preset": "orca-oracle"})
    assert s["completed"] == 150 and s["memory_saving_perc"] == pytest.approx(0.0, abs=1e-9)


def test_beam_search_saves_more_than_parallel_sampling():
    sampling = run(workload={"n": 4})
    beams = run(workload={"beam_width": 4})
    assert beams["completed"] == 150
    assert beams["memory_saving_perc"] > sampling["memory_saving_perc"]


def test_independent_sample_lengths_change_outputs_deterministically():
    a = run(workload={"n": 3}, decoding={"sample_lengths": "independent"})
    b = run(workload={"n": 3}, decoding={"sample_lengths": "independent"})
    same = run(workload={"n": 3})
    assert a == b
    assert a["output_throughput"] != same["output_throughput"]


def test_shared_prefix_is_cached_and_skipped_by_prefill():
    cold = run(workload={"shared_prefix": {"tokens": 341}})
    warm = run(workload={"shared_prefix": {"tokens": 341}}, allocator={"prefix_caching": True})
    assert cold["prefix_cache_lookups"] == 0 and cold["cached_prompt_tokens"] == 0
    assert warm["prefix_cache_hit_ratio"] > 0.9  # every request after the first hits
    assert warm["cached_prompt_tokens"] >= 149 * (341 // 16) * 16
    assert warm["memory_saving_perc"] > cold["memory_saving_perc"]
    assert warm["mean_ttft_ms"] < cold["mean_ttft_ms"]


def test_contiguous_beams_copy_kv_instead_of_sharing():
    s = run(workload={"beam_width": 4}, allocator={"kind": "contiguous", "preset": "orca-oracle"})
    assert s["completed"] == 150 and s["memory_saving_perc"] == pytest.approx(0.0, abs=1e-9)
    assert s["cow_copies"] > 0  # beams that replace dead ones copy their parent's KV
