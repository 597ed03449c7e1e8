"""Generators: arrival processes, length samplers, presets, determinism, streaming."""

from __future__ import annotations

import itertools
import math
import tracemalloc
from collections import deque

import numpy as np
import pytest

from kvsim.traces import (
    ConstantArrivals,
    FilteredLengths,
    FixedLengths,
    GammaArrivals,
    LognormalLengths,
    PoissonArrivals,
    PoolLengths,
    UniformLengths,
    data_path,
    generate_requests,
    load_length_pool,
    make_arrivals,
    preset_lengths,
)
from kvsim.traces.presets import PAPER_WORKLOADS, truncated_lognormal_lengths
from kvsim.traces.sharegpt_filter import sharegpt_keep_array

FIXED = FixedLengths(10, 20)


def gaps_of(arrivals, n=100_000, seed=1) -> np.ndarray:
    times = [r.arrival_time for r in generate_requests(arrivals, FIXED, seed=seed, num_requests=n)]
    return np.diff(times)


# --- arrivals ------------------------------------------------------------------------------------


def test_poisson_mean_gap_and_cv():
    gaps = gaps_of(PoissonArrivals(4.0))
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_hits_rate_and_cv(cv):
    gaps = gaps_of(GammaArrivals(2.0, cv))
    assert 1 / gaps.mean() == pytest.approx(2.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_constant_arrivals_are_evenly_spaced():
    times = [
        r.arrival_time
        for r in generate_requests(ConstantArrivals(8.0), FIXED, seed=0, num_requests=5)
    ]
    assert times == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5])


def test_chunks_join_without_gaps_or_overlap():
    # Chunk boundaries must neither repeat nor skip an arrival.
    times = [
        r.arrival_time
        for r in generate_requests(
            ConstantArrivals(1.0), FIXED, seed=0, num_requests=10, chunk_size=3
        )
    ]
    assert times == pytest.approx(list(range(10)))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PoissonArrivals(0), "rate must be a finite number > 0; got 0"),
        (lambda: GammaArrivals(1.0, -1), "cv must be a finite number > 0"),
        (lambda: ConstantArrivals(math.inf), "rate must be a finite number > 0"),
        (lambda: make_arrivals("gamma", 1.0), "gamma arrivals need cv"),
        (lambda: make_arrivals("bursty", 1.0), "poisson, gamma or constant"),
    ],
)
def test_bad_arrival_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- the generator -------------------------------------------------------------------------------


def test_ids_order_and_first_arrival():
    requests = list(generate_requests(PoissonArrivals(3.0), FIXED, seed=5, num_requests=1000))
    assert [r.request_id for r in requests] == list(range(1000))
    assert requests[0].arrival_time == 0.0
    assert all(a.arrival_time <= b.arrival_time for a, b in itertools.pairwise(requests))


def test_same_seed_same_trace_other_seed_other_trace():
    def make(seed):
        lengths = preset_lengths("alpaca-paper")
        return list(generate_requests(PoissonArrivals(3.0), lengths, seed=seed, num_requests=500))

    assert make(7) == make(7)
    assert make(7) != make(8)


def test_generator_seed_object_is_accepted_and_deterministic():
    def make():
        rng = np.random.default_rng(3)
        return list(generate_requests(PoissonArrivals(1.0), FIXED, seed=rng, num_requests=50))

    assert make() == make()


def test_arrival_times_do_not_depend_on_the_lengths():
    def times(lengths):
        stream = generate_requests(GammaArrivals(5.0, 2.0), lengths, seed=11, num_requests=300)
        return [r.arrival_time for r in stream]

    assert times(FIXED) == times(preset_lengths("sharegpt-paper"))


def test_duration_and_count_stop_the_stream():
    by_time = list(generate_requests(PoissonArrivals(10.0), FIXED, seed=0, duration_s=60.0))
    assert by_time[-1].arrival_time < 60.0
    assert len(by_time) == pytest.approx(600, rel=0.15)
    both = list(
        generate_requests(PoissonArrivals(10.0), FIXED, seed=0, duration_s=60.0, num_requests=50)
    )
    assert len(both) == 50


def test_an_endless_generator_is_refused():
    with pytest.raises(ValueError, match="num_requests and/or duration_s"):
        generate_requests(PoissonArrivals(1.0), FIXED, seed=0)


def test_a_million_poisson_requests_stream_in_bounded_memory():
    stream = generate_requests(
        PoissonArrivals(100.0), preset_lengths("sharegpt-paper"), seed=0, num_requests=1_000_000
    )
    # Measure the second half: by then any growth proportional to the count would show.
    first_half = deque(itertools.islice(stream, 500_000), maxlen=1)
    tracemalloc.start()
    try:
        second_half = deque(stream, maxlen=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    last = second_half[0]
    assert first_half[0].request_id == 499_999 and last.request_id == 999_999
    assert last.arrival_time == pytest.approx(10_000, rel=0.01)
    assert peak < 1_000_000  # one 4096-request chunk of arrays is ~100 kB


# --- length samplers -----------------------------------------------------------------------------

RNG_SIZE = 200_000


def draw(sampler, seed=0, size=RNG_SIZE):
    return sampler.sample(np.random.default_rng(seed), size)


def test_fixed_lengths():
    prompt, output = draw(FixedLengths(7, 9), size=10)
    assert prompt.tolist() == [7] * 10 and output.tolist() == [9] * 10


def test_uniform_lengths_cover_the_inclusive_range():
    prompt, output = draw(UniformLengths(3, 6, 10, 10))
    assert set(prompt.tolist()) == {3, 4, 5, 6} and set(output.tolist()) == {10}
    assert prompt.mean() == pytest.approx(4.5, rel=0.01)


def test_lognormal_lengths_hit_mean_and_std():
    prompt, output = draw(LognormalLengths(500.0, 400.0, 80.0, 20.0))
    assert prompt.mean() == pytest.approx(500, rel=0.01)
    assert prompt.std() == pytest.approx(400, rel=0.03)
    assert output.mean() == pytest.approx(80, rel=0.01)
    assert output.std() == pytest.approx(20, rel=0.03)
    assert prompt.min() >= 1 and output.min() >= 1


def test_pool_samples_whole_rows():
    pool = PoolLengths(np.array([1, 2, 3]), np.array([10, 20, 30]))
    prompt, output = draw(pool)
    assert np.array_equal(output, prompt * 10)  # pairs stay together
    assert prompt.mean() == pytest.approx(2.0, rel=0.01)


def test_pool_from_the_shipped_sharegpt_file():
    pool = PoolLengths(
        *load_length_pool(data_path("sharegpt_8k_filtered_stats_llama2_tokenizer.csv"))
    )
    prompt, output = draw(pool)
    assert prompt.mean() == pytest.approx(2340, rel=0.02)
    assert output.mean() == pytest.approx(439, rel=0.02)


def test_sharegpt_filter_on_a_sampler():
    pool = PoolLengths(
        *load_length_pool(data_path("sharegpt_8k_filtered_stats_llama2_tokenizer.csv"))
    )
    prompt, output = draw(FilteredLengths(pool, sharegpt_keep_array), size=20_000)
    assert len(prompt) == 20_000
    assert prompt.min() >= 4 and output.min() >= 4
    assert prompt.max() <= 1024 and (prompt + output).max() <= 2048


def test_a_filter_that_keeps_nothing_fails_instead_of_hanging():
    never = FilteredLengths(FixedLengths(5000, 5000), sharegpt_keep_array)
    with pytest.raises(ValueError, match="length filter kept 0"):
        draw(never, size=10)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedLengths(0, 5), "prompt_tokens must be an integer >= 1; got 0"),
        (lambda: FixedLengths(5, 2.5), "output_tokens must be an integer >= 1"),
        (lambda: UniformLengths(5, 4, 1, 1), "prompt_max must be an integer >= 5; got 4"),
        (lambda: LognormalLengths(100, -1, 10, 1), "prompt_std must be a finite number >= 0"),
        (lambda: LognormalLengths(100, 1, math.nan, 1), "output_mean must be a finite number >= 1"),
        (lambda: PoolLengths(np.array([1]), np.array([0])), "must all be >= 1"),
        (lambda: preset_lengths("lmsys"), "sharegpt-paper, alpaca-paper"),
    ],
)
def test_bad_length_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- presets -------------------------------------------------------------------------------------

PAPER = {"sharegpt-paper": (161.31, 337.99), "alpaca-paper": (19.31, 58.45)}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_preset_exact_means_match_the_paper(name):
    prompt_mean, output_mean = preset_lengths(name).expected_means()
    assert prompt_mean == pytest.approx(PAPER[name][0], rel=1e-6)
    assert output_mean == pytest.approx(PAPER[name][1], rel=1e-6)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_preset_samples_reproduce_the_means_and_respect_the_filter(name):
    prompt, output = draw(preset_lengths(name), seed=2024, size=400_000)
    assert prompt.mean() == pytest.approx(PAPER[name][0], rel=0.01)
    assert output.mean() == pytest.approx(PAPER[name][1], rel=0.01)
    assert sharegpt_keep_array(prompt, output).all()


def test_generated_preset_workload_means():
    stream = generate_requests(
        PoissonArrivals(2.0), preset_lengths("sharegpt-paper"), seed=1, num_requests=200_000
    )
    lengths = np.array([(r.prompt_tokens, r.output_tokens) for r in stream])
    assert lengths[:, 0].mean() == pytest.approx(161.31, rel=0.01)
    assert lengths[:, 1].mean() == pytest.approx(337.99, rel=0.01)


def test_sharegpt_spread_is_the_shipped_files():
    # The documented shape choice: sigma measured on the shipped ShareGPT lengths.
    prompts, outputs = load_length_pool(
        data_path("sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    )
    workload = PAPER_WORKLOADS["sharegpt-paper"]
    assert workload.prompt_sigma == pytest.approx(np.log(prompts).std(), abs=0.01)
    assert workload.output_sigma == pytest.approx(np.log(outputs).std(), abs=0.01)


def test_sharegpt_varies_more_than_alpaca():
    # The paper: ShareGPT has longer inputs and outputs "with higher variance".
    share_p, share_o = draw(preset_lengths("sharegpt-paper"))
    alpaca_p, alpaca_o = draw(preset_lengths("alpaca-paper"))
    assert share_p.var() > alpaca_p.var() and share_o.var() > alpaca_o.var()


def test_calibration_rejects_unreachable_means():
    with pytest.raises(ValueError, match="prompt_mean must lie in"):
        truncated_lognormal_lengths(2000.0, 100.0, 1.0, 1.0)
