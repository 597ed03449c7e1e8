"""TTFT, TPOT, ITL and E2E when a request runs as several sequences (samples or beams)."""

import numpy as np
import pytest

from kvsim.simulator.decoding import sample_targets
from kvsim.traces import Request


@pytest.mark.parametrize("group", [{"n": 2}, {"beam_width": 2}])
@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_latencies_of_a_two_sequence_group(tiny, paged, contiguous, group, allocator):
    # A: one sequence, prompt 4, output 4, at t=0. B: two sequences, prompt 4, output 3, at 0.5.
    # 1 s per step.
    #   step 1 [0,1] prefill A (its 1st token). B arrives.
    #   step 2 [1,2] prefill B alone (both sequences' 1st token); A does not decode.
    #   step 3 [2,3] decode A, B1, B2; step 4 [3,4] again: B's 3rd tokens end it at 4.
    #   step 5 [4,5] A's 4th token ends it at 5.
    # TTFT: A 1, B 2 - 0.5 = 1.5. E2E: A 5, B 3.5.
    # TPOT (per sequence of the group): A (5-1)/3 = 4/3, B (4-2)/2 = 1.
    # ITL, one sample per sequence and gap: A 2 (1 -> 3), 1, 1; B1 1, 1; B2 1, 1:
    #   7 samples, mean 8/7. Output tokens: 4 + 2 x 3 = 10 in 5 s.
    make = paged(64, 4) if allocator == "paged" else contiguous(64, "first_fit", "oracle")
    out = tiny([Request(0, 0.0, 4, 4), Request(1, 0.5, 4, 3, **group)], make)
    r, s = out.requests, out.summary
    assert list(r["first_token_s"]) == [1.0, 2.0]
    assert list(r["finish_s"]) == [5.0, 4.0]
    assert list(r["generated_tokens"]) == [4, 3] and list(r["total_output_tokens"]) == [4, 6]
    assert s["mean_ttft_ms"] == pytest.approx((1 + 1.5) / 2 * 1000)
    assert s["mean_e2el_ms"] == pytest.approx((5 + 3.5) / 2 * 1000)
    assert s["mean_tpot_ms"] == pytest.approx((4 / 3 + 1) / 2 * 1000)
    assert out.itl.count == 7
    assert s["mean_itl_ms"] == pytest.approx(8 / 7 * 1000)
    assert s["median_itl_ms"] == pytest.approx(1000, rel=1e-3)  # histogram buckets: 0.1% wide
    assert s["p99_itl_ms"] == pytest.approx(2000, rel=1e-3)
    assert s["output_throughput"] == pytest.approx(10 / 5)
    assert s["normalized_latency_s_per_token"] == pytest.approx((5 / 4 + 3.5 / 3) / 2)


def test_samples_of_different_lengths_end_the_group_at_the_longest(tiny, paged):
    # Three samples whose lengths the scheduler draws ("independent", seed 0): 4, 6 and 1
    # tokens (the same draw is repeated here). 1 s per step: the prefill gives every
    # sample its 1st token at 1 s, each decode step one more token to each live sample.
    #   sample 3 ends at once; sample 1 at 4 s; sample 2, the longest, at 6 s: the group's E2E.
    #   ITL: (4 - 1) + (6 - 1) + 0 = 8 gaps of 1 s. TPOT: (6 - 1) / (6 - 1) = 1 s.
    #   Output tokens: 4 + 6 + 1 = 11.
    req = Request(0, 0.0, 4, 5, n=3)
    lengths = sample_targets(req, "independent", np.random.default_rng(0), 4096)
    assert lengths == [4, 6, 1]
    out = tiny([req], paged(64, 4), sample_lengths="independent", seed=0)
    r = out.requests.loc[0]
    assert (r["generated_tokens"], r["total_output_tokens"], r["finish_s"]) == (6, 11, 6.0)
    assert out.itl.count == 8 and out.summary["mean_itl_ms"] == pytest.approx(1000.0)
    assert out.summary["mean_tpot_ms"] == pytest.approx(1000.0)
    assert out.summary["output_throughput"] == pytest.approx(11 / 6)
    # Each sample is admitted with its own final length (prompt + its output - 1 = 7, 9, 4),
    # which splits its allocated slots into reserved and internal fragmentation. Block size 4:
    #   t=0-1 prefill: the shared full prompt block, 4 tokens.
    #   t=1-4 samples 1, 2 decode (kv 5, 6, 7), each in a block of its own (8 slots):
    #         reserved (7 - kv) + (8 - kv) = 5, 3, 1; internal: sample 1's slot 8 = 1 each step.
    #   t=4-6 sample 2 alone: kv 8 (no waste), then kv 9 in a new block: internal 12 - 9 = 3.
    steps = out.steps
    seconds = {c: float((steps[c] * steps["duration_s"]).sum()) for c in ("token_states", "reserved", "internal_frag")}
    assert seconds == pytest.approx({"token_states": 4 + 6 + 8 + 10 + 8 + 9, "reserved": 5 + 3 + 1,
                                     "internal_frag": 1 + 1 + 1 + 0 + 3})


def test_two_samples_of_different_lengths_each_reserve_to_their_own_end(tiny, paged):
    # n=2, prompt 4, lengths drawn 3 and 4 (seed 0): final lengths 6 and 7; block size 4.
    #   t=0-1 the shared full prompt block: 4 tokens.
    #   t=1-2 kv 5 each in a block of its own: reserved (6-5) + (7-5) = 3, past the ends (8-6) + (8-7) = 3.
    #   t=2-3 kv 6: reserved 0 + 1, internal 3; the 3-token sample ends at 3.
    #   t=3-4 the other alone, kv 7: reserved 0, internal 8 - 7 = 1; it ends at 4.
    req = Request(0, 0.0, 4, 3, n=2)
    assert sample_targets(req, "independent", np.random.default_rng(0), 4096) == [3, 4]
    out = tiny([req], paged(64, 4), sample_lengths="independent", seed=0)
    assert out.requests.loc[0, "finish_s"] == 4.0
    steps = out.steps
    seconds = {c: float((steps[c] * steps["duration_s"]).sum()) for c in ("token_states", "reserved", "internal_frag")}
    assert seconds == pytest.approx({"token_states": 4 + 6 + 8 + 7, "reserved": 3 + 1, "internal_frag": 3 + 3 + 1})
