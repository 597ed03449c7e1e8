"""Decoding models: beam parent choice, sample lengths, prompt-block contents."""

import numpy as np
import pytest

from kvsim.simulator.decoding import beam_parent_counts, prefix_contents, sample_targets
from kvsim.traces import Request


@pytest.mark.parametrize("concentration", [0.0, 1.0, 3.0])
def test_beam_parents_follow_exponential_rank_weights(concentration):
    rng = np.random.default_rng(0)
    width, draws = 4, 20_000
    total = np.zeros(width)
    for _ in range(draws):
        counts = beam_parent_counts(concentration, rng.random(width).tolist())
        assert sum(counts) == width and min(counts) >= 0
        total += counts
    weights = np.exp(-concentration * np.arange(width))
    np.testing.assert_allclose(total / total.sum(), weights / weights.sum(), atol=0.01)


def test_sample_lengths_same_or_independent_with_the_request_mean():
    r = Request(0, 0.0, prompt_tokens=100, output_tokens=50, n=4)
    rng = np.random.default_rng(3)
    assert sample_targets(r, "same", rng, 4096) == [50] * 4
    draws = [t for _ in range(3000) for t in sample_targets(r, "independent", rng, 4096)]
    assert min(draws) >= 1 and max(draws) <= 4096 - 100
    assert np.mean(draws) == pytest.approx(50.5, rel=0.05)  # ceil of an exponential with mean 50


def test_hash_ids_map_onto_blocks_that_divide_them():
    r = Request(0, 0.0, prompt_tokens=1100, output_tokens=5, hash_ids=(7, 8, 9))  # 512-token blocks
    blocks = prefix_contents(r, 256)
    assert blocks == [("h", 7, 0), ("h", 7, 1), ("h", 8, 0), ("h", 8, 1)]  # 1100 // 256 full blocks
    assert len(prefix_contents(r, 16)) == 1100 // 16
    shared = Request(1, 0.0, prompt_tokens=100, output_tokens=5, prefix_id="few-shot", prefix_tokens=80)
    assert prefix_contents(shared, 16) == [("p", "few-shot", j) for j in range(5)]
    assert prefix_contents(Request(2, 0.0, 100, 5), 16) == []
