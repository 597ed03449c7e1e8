"""Rules of simulator/decoding.py that mutation testing found unchecked: the clamp of a beam's
parent rank when rounding leaves the last cumulative weight below a draw, the parallel
samples' lengths (only several independent samples are drawn; clipped to [1, room left]),
which requests name prefix blocks, and the block contents of negative hash ids and of token
ids at and above 2**31 (token ids are unsigned 32-bit)."""

from __future__ import annotations

import math
import struct

import numpy as np

from kvsim.simulator.decoding import (
    HASH_POSITIONS,
    _parent_cdf,
    beam_parent_counts,
    hash_block_contents,
    prefix_contents,
    sample_targets,
    token_block_contents,
)
from kvsim.traces import Request

BELOW_ONE = math.nextafter(1.0, 0.0)  # the largest uniform draw in [0, 1)


def test_a_draw_above_the_rounded_last_weight_picks_the_last_beam():
    """Seven equal weights sum to 0.9999999999999998 in floating point: a draw just below 1
    lies above every cumulative weight and must still pick the last beam."""
    assert _parent_cdf(7, 0.0)[-1] < BELOW_ONE
    assert beam_parent_counts(0.0, [BELOW_ONE] * 7) == [0, 0, 0, 0, 0, 0, 7]
    assert beam_parent_counts(0.0, [0.0] * 6 + [BELOW_ONE]) == [6, 0, 0, 0, 0, 0, 1]


def request(**fields) -> Request:
    return Request(request_id=0, arrival_time=0.0, **fields)


def test_one_sample_keeps_the_trace_s_output_length_and_several_are_drawn():
    rng = np.random.default_rng(7)
    assert sample_targets(request(prompt_tokens=10, output_tokens=50), "independent", rng, 1000) == [50]
    many = sample_targets(request(prompt_tokens=10, output_tokens=50, n=8), "independent", rng, 1000)
    assert len(many) == 8 and len(set(many)) > 1


def test_drawn_lengths_are_clipped_to_one_token_and_to_the_room_left():
    rng = np.random.default_rng(3)
    full = request(prompt_tokens=100, output_tokens=500, n=6)
    assert sample_targets(full, "independent", rng, max_total=100) == [1] * 6  # no room: 1 token
    assert sample_targets(full, "independent", rng, max_total=103) == [3] * 6  # 3 tokens of room
    short = request(prompt_tokens=10, output_tokens=1, n=60)
    assert min(sample_targets(short, "independent", rng, max_total=1000)) == 1


def test_the_answer_s_blocks_are_named_only_when_asked_for():
    req = request(prompt_tokens=4, output_tokens=4, token_ids=(1, 2, 3, 4), output_token_ids=(5, 6, 7, 8))
    assert len(prefix_contents(req, 2)) == 2
    assert len(prefix_contents(req, 2, with_output=False)) == 2
    assert len(prefix_contents(req, 2, with_output=True)) == 4


def test_prefix_tokens_without_a_prefix_id_name_no_block():
    assert prefix_contents(request(prompt_tokens=64, output_tokens=1, prefix_tokens=32), 16) == []
    assert len(prefix_contents(request(prompt_tokens=64, output_tokens=1, prefix_id="s", prefix_tokens=32), 16)) == 2


def test_negative_hash_ids_keep_their_sign():
    got = hash_block_contents((-3, 5), 32, 16, 64)
    assert list(got) == [-3 * HASH_POSITIONS, -3 * HASH_POSITIONS + 1, 5 * HASH_POSITIONS, 5 * HASH_POSITIONS + 1]


def test_token_ids_above_2_to_the_31_are_unsigned_32_bit():
    top = 2**32 - 1
    got = token_block_contents((2**31, top), 1)
    assert list(got) == [struct.pack("=I", 2**31), struct.pack("=I", top)]
