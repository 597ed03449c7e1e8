"""Copy-on-write for parallel samples: the copies count when deciding whether a group can
ever fit, and the copy time is part of the step that makes it."""

import pytest

from kvsim.traces import Request


@pytest.mark.parametrize("num_blocks, status", [(3, "rejected"), (4, "finished")])
def test_copies_count_in_the_can_it_ever_fit_check(tiny, paged, num_blocks, status):
    # n=2 samples, prompt 6, output 3 (final length 8), block size 4:
    #   the prompt takes 2 shared blocks, the last one half full; the first decode step
    #   copies it for a sample before writing (the admission bound counts one copy per
    #   sample, as try_append reserves them): peak = 2 + 2 x (2 - 2) + 2 = 4 blocks.
    #   With 3 blocks the group can never run: rejected at once, with the reason.
    #   With 4 it runs; only one copy is made (the last holder keeps the original).
    out = tiny([Request(0, 0.0, 6, 3, n=2)], paged(num_blocks, 4))
    r = out.requests
    assert r.loc[0, "status"] == status
    if status == "rejected":
        assert r.loc[0, "reason"] == f"needs more KV slots than the whole cache ({num_blocks * 4})"
        assert len(out.steps) == 0
    else:
        assert out.steps["cow_copies"].sum() == 1 == out.summary["cow_copies"]


def test_a_rejected_head_does_not_hold_back_the_queue(tiny, paged):
    # The same group on 3 blocks is rejected at t=0; the request behind it (prompt 2,
    # 2 tokens, 1 block) is admitted in that same first step: tokens at 1 and 2.
    out = tiny([Request(0, 0.0, 6, 3, n=2), Request(1, 0.0, 2, 2)], paged(3, 4))
    r = out.requests
    assert list(r["status"]) == ["rejected", "finished"]
    assert r.loc[1, "first_token_s"] == 1.0 and r.loc[1, "finish_s"] == 2.0


def test_copy_time_is_part_of_the_step(tiny, paged, fake_cost):
    # Same group, plenty of blocks, 1/2 s per block copied:
    #   step 1 [0,1] prefill; step 2 copies 1 block: 1 + 1/2, ends at 2.5;
    #   step 3 [2.5, 3.5]: the 3rd token; the group ends at 3.5.
    cost = fake_cost(copy_per_block=0.5)
    out = tiny([Request(0, 0.0, 6, 3, n=2)], paged(8, 4), cost)
    assert out.requests.loc[0, "finish_s"] == 3.5
    assert list(out.steps["duration_s"]) == [1.0, 1.5, 1.0]
