"""Decoding models: beam parent choice, sample lengths, prompt-block contents."""

import numpy as np
import pytest

from kvsim.simulator.decoding import (
    HASH_POSITIONS,
    beam_parent_counts,
    hash_block_contents,
    prefix_contents,
    sample_targets,
)
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
    # 1100 // 256 full blocks: (hash id, position in its 512-token block) as one int
    assert list(blocks) == [7 * HASH_POSITIONS, 7 * HASH_POSITIONS + 1, 8 * HASH_POSITIONS, 8 * HASH_POSITIONS + 1]
    assert prefix_contents(r, 16)[32] == 8 * HASH_POSITIONS  # block 32 of 16 starts hash id 8
    assert len(prefix_contents(r, 16)) == 1100 // 16
    shared = Request(1, 0.0, prompt_tokens=100, output_tokens=5, prefix_id="few-shot", prefix_tokens=80)
    assert prefix_contents(shared, 16) == [("p", "few-shot", j) for j in range(5)]
    assert prefix_contents(Request(2, 0.0, 100, 5), 16) == []


def test_hash_block_contents_are_the_same_through_numpy_and_python_ints():
    """Hash ids too large for numpy's int64 spread take Python's ints: the same formula."""
    big = 1 << 50
    got = hash_block_contents((big, 3), 64, 16, 120)  # 120 tokens: 7 full blocks of 16
    assert got == [big * HASH_POSITIONS + j for j in range(4)] + [3 * HASH_POSITIONS + j for j in range(3)]
    assert list(hash_block_contents((5, 3), 64, 16, 120)) == [5 * HASH_POSITIONS + j for j in range(4)] + [
        3 * HASH_POSITIONS + j for j in range(3)]
    assert hash_block_contents((5,), 64, 16, 10) == []


def test_hash_blocks_must_hold_whole_blocks_and_not_too_many():
    with pytest.raises(ValueError, match="block size 48 does not divide the trace's hash block of 512"):
        hash_block_contents((1,), 512, 48, 512)
    with pytest.raises(ValueError, match="at most 1048575 are allowed"):
        hash_block_contents((1,), HASH_POSITIONS, 1, 10)
