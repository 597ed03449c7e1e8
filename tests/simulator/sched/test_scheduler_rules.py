"""vLLM v0 scheduler rules its other tests leave open: why a group was aborted, how many
were aborted in one step, what beams copy when nothing is shared, what may cut a run of
identical decode steps (one engine row), and why a too-long request was rejected.

Memory is a paged pool of block size 1 (one slot per token), 1 s per step, no swap space,
no watermark. A sequence's KV holds prompt + output - 1 tokens when it ends (the last
token is sampled, never stored).

The abort workload (``ABORTS``):
  r0: t=0, 1 sequence, prompt 2, output 6.    r1: t=0, 2 samples, prompt 1, output 3.
  r2: t=1.5, 1 sequence, prompt 1, output 5.
  step 1 [0,1] prefill r0, r1: blocks 2 + 1 (the samples share the prompt block) = 3.
  step 2 [1,2] decode r0 (+1) and both samples (+1 each): 6.
  step 3 [2,3] prefill r2 (arrived at 1.5): 7 of 8.
  step 4 [3,4] decode, oldest first: r0 takes the 8th block. r1 needs 2, none is free: the
          latest arrival, r2, is preempted; swapping fails (no swap space). Its 1 block
          frees, still 1 short for r1, so r1 itself is preempted next, in the same step.
"""

from __future__ import annotations

import pytest

from kvsim.traces import Request

ABORTS = [Request(0, 0.0, 2, 6), Request(1, 0.0, 1, 3, n=2), Request(2, 1.5, 1, 5)]
SWAP_FULL = "CPU swap space exhausted"


def test_with_abort_as_the_fallback_both_are_aborted_in_one_step(tiny, paged):
    """swap_fallback=abort: r2 and then r1 are aborted in step 4 (two in one step, and the
    reason is the plain one: abort was asked for, whatever the group's size)."""
    out = tiny(ABORTS, paged(8, 1), preemption="swap", swap_fallback="abort")
    r = out.requests
    assert list(r["status"]) == ["finished", "aborted", "aborted"]
    assert list(r["reason"][1:]) == [SWAP_FULL, SWAP_FULL]
    assert list(r["finish_s"][1:]) == [3.0, 3.0]  # ended when step 4 was scheduled
    aborting = out.steps[out.steps["aborted"] > 0]
    assert list(aborting["aborted"]) == [2] and list(aborting["start_s"]) == [3.0]
    assert out.summary["aborted"] == 2 and out.summary["abort_reasons"] == {SWAP_FULL: 2}


def test_a_multi_sequence_group_that_cannot_swap_is_aborted_and_says_why(tiny, paged):
    """swap_fallback=recompute: r2 (one sequence) falls back to recomputation; r1 (two
    samples holding different tokens) cannot be recomputed, so it is aborted, and the reason
    says both halves: swap space was exhausted, and recomputation was not an option.

    What follows for r2 (r1's 3 blocks are free; r0 holds 4):
      step 5 [4,5] re-prefill r2's prompt + 1 generated token: 2 blocks, 6 used.
      step 6 [5,6] decode r0 (5) and r2 (3): 8 used.
      step 7 [6,7] r0 needs a block: r2, the latest, is recomputed again (its 3 blocks);
              r0 appends (6).
      step 8 [7,8] r2's 4-token re-prefill does not fit beside r0's 6: r0 decodes alone,
              its 6th token ends it at 8.
      step 9 [8,9] prefill r2 (4 blocks); step 10 [9,10] its 5th token ends it at 10.
    r2 recomputed 1 token (its prompt) and then 3.
    """
    out = tiny(ABORTS, paged(8, 1), preemption="swap", swap_fallback="recompute")
    r = out.requests
    assert r.loc[1, "status"] == "aborted"
    assert r.loc[1, "reason"] == SWAP_FULL + " (a multi-sequence group cannot be recomputed)"
    assert list(r["finish_s"]) == [8.0, 3.0, 10.0]
    assert r.loc[2, "status"] == "finished" and r.loc[2, "preemptions"] == 2
    assert r.loc[2, "recomputed_tokens"] == 1 + 3
    step4 = out.steps[out.steps["start_s"] == 3.0].iloc[0]
    assert (step4["aborted"], step4["preempted_recompute"], step4["preempted_swap"]) == (1, 1, 0)


@pytest.mark.parametrize("width", [2, 3])
def test_beams_without_sharing_copy_the_best_beam_into_every_dead_one(tiny, contiguous, width):
    """Contiguous regions share nothing: a dead beam's region is overwritten with its new
    parent's KV. With a huge concentration every new beam descends from the best one, so
    at each decode step width - 1 beams die and each gets a copy of the best beam's KV.

    Prompt 4, output 3: the prefill samples token 1; decode step 1 copies kv_len 4 slots into
    each of the width - 1 dead beams, step 2 copies 5 slots each (token 1 was stored in
    step 1); token 3 ends the group. Copies: (width - 1) x (4 + 5).
    """
    out = tiny([Request(0, 0.0, 4, 3, beam_width=width)], contiguous(64, "first_fit", "oracle"),
               beam_concentration=1e9)
    assert out.requests.loc[0, "status"] == "finished"
    assert list(out.steps["cow_copies"]) == [0, (width - 1) * 4, (width - 1) * 5]
    assert out.summary["cow_copies"] == (width - 1) * 9


@pytest.mark.parametrize("width", [2, 3])
def test_once_the_beams_end_the_rest_decodes_as_one_run(tiny, contiguous, width):
    """Beams fork at every step, so no run of identical decode steps is possible while a
    beam group is running; once it ends, the scheduler must know none is left.

    r0: beams, prompt 4, output 2. r1: one sequence, prompt 4, output 10. 1 s per step.
      step 1 [0,1] prefill both (token 1 each).
      step 2 [1,2] decode both: token 2 ends r0's beams.
      steps 3-10 [2,10] r1 alone, tokens 3..10: identical steps, one engine row.
    Rows: 3 (not 10), iterations 1 + 1 + 8 = 10; r1 ends at 10.
    """
    out = tiny([Request(0, 0.0, 4, 2, beam_width=width), Request(1, 0.0, 4, 10)],
               contiguous(128, "first_fit", "oracle"), beam_concentration=1e9)
    assert list(out.requests["finish_s"]) == [2.0, 10.0]
    assert out.summary["num_steps"] == 10
    assert out.summary["engine_rows"] == 3


def test_a_preempted_group_does_not_cut_the_runs_of_the_others(tiny, paged):
    """A group dropped for recomputation leaves its old finish entry behind; the run that
    follows is bounded by the groups still running, not by that stale entry.

    Paged, 8 blocks of 1 slot, recompute. r0: prompt 2, output 7 (ends holding 8 blocks).
    r1: prompt 1, output 6. Both at t=0; 1 s per step.
      step 1 prefill both (3 blocks); steps 2-3 decode both (5, then 7 blocks): one row.
      step 4: r0 takes the 8th block; r1 cannot append and is dropped (3 tokens recomputed).
      steps 5-7: r0 alone (its re-prefill of 4 tokens does not fit beside r0's 5, 6, 7
              blocks), tokens 5-7; r0 ends at 7: one row, although r1 had it kept running
              would have ended at step 6.
      step 8 re-prefill r1 (1 + 3 tokens); steps 9-10 its tokens 5, 6: one row; ends at 10.
    Rows: 1, 2-3, 4, 5-7, 8, 9-10 = 6.
    """
    out = tiny([Request(0, 0.0, 2, 7), Request(1, 0.0, 1, 6)], paged(8, 1))
    r = out.requests
    assert list(r["finish_s"]) == [7.0, 10.0]
    assert list(r["preemptions"]) == [0, 1] and r.loc[1, "recomputed_tokens"] == 3
    assert out.summary["num_steps"] == 10
    assert list(out.steps["start_s"]) == [0.0, 1.0, 3.0, 4.0, 7.0, 8.0]


def test_requests_longer_than_the_model_are_rejected_with_the_length_that_was_too_long(tiny, paged):
    """max_seq_len 16 (the model's context window, prompt and output together):
      r0: prompt 17: the prompt alone is too long.
      r1: prompt 16, output 1: the prompt fits exactly, prompt + output = 17 does not.
      r2: prompt 15, output 1: 16 tokens, runs (prefill at [0, 1] gives its only token).
    """
    out = tiny([Request(0, 0.0, 17, 1), Request(1, 0.0, 16, 1), Request(2, 0.0, 15, 1)],
               paged(64, 4), max_seq_len=16)
    r = out.requests
    assert list(r["status"]) == ["rejected", "rejected", "finished"]
    assert r.loc[0, "reason"] == "prompt of 17 tokens exceeds the context window (model.context_len_tokens) 16"
    assert r.loc[1, "reason"] == "prompt + output = 17 tokens exceeds the context window (model.context_len_tokens) 16"
    assert r.loc[2, "finish_s"] == 1.0
