"""Transforms: rate scaling, windows, clipping, sharing, the ShareGPT filter."""

from __future__ import annotations

import pytest

from kvsim.traces import (
    Request,
    apply_sharing,
    clip_to_max_len,
    renumber,
    scale_rate,
    sharegpt_filter,
    window_by_count,
    window_by_time,
)


def trace(*rows) -> list[Request]:
    """Requests from (arrival_time, prompt, output) rows."""
    return [Request(i, t, p, o) for i, (t, p, o) in enumerate(rows)]


SIMPLE = trace((0.0, 10, 5), (1.0, 20, 5), (2.5, 30, 5), (4.0, 40, 5))


def test_rate_scale_divides_times():
    scaled = list(scale_rate(SIMPLE, 2.0))
    assert [r.arrival_time for r in scaled] == [0.0, 0.5, 1.25, 2.0]
    assert [r.prompt_tokens for r in scaled] == [10, 20, 30, 40]


@pytest.mark.parametrize("factor", [0, -1, float("inf"), float("nan")])
def test_rate_scale_rejects_bad_factors(factor):
    with pytest.raises(ValueError, match="rate scale factor must be a finite number > 0"):
        scale_rate(SIMPLE, factor)


def test_time_window_rebases_and_renumbers():
    window = list(window_by_time(SIMPLE, start_s=1.0, duration_s=2.0))
    # [1.0, 3.0): the requests at 1.0 and 2.5, now at 0.0 and 1.5.
    assert [(r.request_id, r.arrival_time, r.prompt_tokens) for r in window] == [
        (0, 0.0, 20),
        (1, 1.5, 30),
    ]


def test_time_window_stops_reading_at_its_end():
    def endless():
        t = 0.0
        while True:
            yield Request(int(t), t, 1, 1)
            t += 1.0

    assert len(list(window_by_time(endless(), duration_s=10.0))) == 10


def test_count_window():
    assert [r.prompt_tokens for r in window_by_count(SIMPLE, 2)] == [10, 20]
    with pytest.raises(ValueError, match="num_requests must be an integer >= 1"):
        window_by_count(SIMPLE, 0)


def test_window_validation():
    with pytest.raises(ValueError, match="duration_s must be a finite number > 0"):
        window_by_time(SIMPLE, duration_s=0)
    with pytest.raises(ValueError, match="start_s must be a finite number >= 0"):
        window_by_time(SIMPLE, start_s=-1)


def test_clip_cuts_output_first_then_prompt():
    requests = [
        Request(0, 0.0, 100, 10),  # fits: unchanged
        Request(1, 0.0, 100, 50),  # output cut to 28
        Request(2, 0.0, 500, 50, hash_ids=(1, 2, 3, 4), hash_block_tokens=128),
    ]
    clipped = list(clip_to_max_len(requests, 128))
    assert clipped[0] is requests[0]
    assert (clipped[1].prompt_tokens, clipped[1].output_tokens) == (100, 28)
    # Prompt keeps its first 127 tokens (one block of 128) and one output token.
    assert (clipped[2].prompt_tokens, clipped[2].output_tokens) == (127, 1)
    assert clipped[2].hash_ids == (1,)
    assert all(r.prompt_tokens + r.output_tokens <= 128 for r in clipped)


def test_clip_needs_room_for_one_output_token():
    with pytest.raises(ValueError, match="max_seq_len must be an integer >= 2"):
        list(clip_to_max_len(SIMPLE, 1))


def test_sharing_sets_samples_beams_and_prepends_the_prefix():
    shared = list(apply_sharing(SIMPLE, n=4, prefix_id="system", prefix_tokens=64))
    assert [r.prompt_tokens for r in shared] == [74, 84, 94, 104]
    assert {(r.n, r.beam_width, r.prefix_id, r.prefix_tokens) for r in shared} == {
        (4, 1, "system", 64)
    }
    beams = list(apply_sharing(SIMPLE, beam_width=6))
    assert all(
        r.num_seqs == 6 and r.prompt_tokens == s.prompt_tokens for r, s in zip(beams, SIMPLE)
    )


def test_no_sharing_passes_requests_through():
    assert list(apply_sharing(SIMPLE)) == SIMPLE


def test_prefix_with_hash_ids_is_refused():
    requests = [Request(0, 0.0, 600, 5, hash_ids=(1, 2))]
    with pytest.raises(ValueError, match="has hash_ids"):
        list(apply_sharing(requests, prefix_id="p", prefix_tokens=10))


def test_sharing_validation():
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        apply_sharing(SIMPLE, n=0)
    with pytest.raises(ValueError, match="needs both a prefix_id and tokens"):
        apply_sharing(SIMPLE, prefix_id="p")


def test_sharegpt_filter_rules():
    requests = trace(
        (0.0, 3, 100),  # prompt < 4: dropped
        (0.1, 100, 3),  # output < 4: dropped
        (0.2, 1025, 10),  # prompt > 1024: dropped
        (0.3, 1024, 1025),  # total 2049 > 2048: dropped
        (0.4, 4, 4),  # kept
        (0.5, 1024, 1024),  # total 2048: kept
    )
    kept = list(sharegpt_filter(requests))
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in kept] == [
        (0, 4, 4),
        (1, 1024, 1024),
    ]


def test_renumber():
    shuffled = [Request(7, 0.0, 1, 1), Request(3, 1.0, 1, 1)]
    assert [r.request_id for r in renumber(shuffled)] == [0, 1]
