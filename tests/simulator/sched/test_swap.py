"""Swapping, worked out by hand: transfer time is part of the step, slots are whole blocks,
and a group swapped back in joins a batch that must stay within ``max_num_seqs``."""

from dataclasses import replace

import pytest

from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings, Step
from kvsim.simulator.sched.sequence import Status
from kvsim.traces import Request

# Swap cost of the fake model: 1/4 s per block plus 1/16 s per slot.
PER_BLOCK, PER_SLOT = 0.25, 0.0625


def two_requests():
    return [Request(0, 0.0, 2, 4), Request(1, 0.0, 3, 4)]  # A, B: 4 output tokens each


@pytest.mark.parametrize("macro_steps", [True, False])
def test_swap_out_and_in_are_in_the_step_duration_and_move_whole_blocks(tiny, paged, fake_cost, macro_steps):
    # Paged, block size 2, 5 GPU blocks, swap: A prompt 2, B prompt 3, 4 output tokens each.
    #   step 1 [0,1] prefill: A 1 block, B 2 blocks (last one half full); free 2.
    #   step 2 [1,2] A kv 3 takes a block, B kv 4 fills its own: free 1.
    #   step 3 [2,3] A kv 4 fills, B kv 5 takes a block: free 0.
    #   step 4 at 3: A needs a block, none free -> preempt the latest arrival, B: it holds
    #     3 blocks (kv 5 = 2 + 2 + 1), moved as 3 whole blocks = 6 slots:
    #     s = 3 x 1/4 + 6 x 1/16 = 1.125 s. A appends, its 4th token ends it:
    #     A finishes at 3 + 1 + 1.125 = 5.125 (and frees 3 blocks: 5 free).
    #   step 5 at 5.125: B comes back (3 blocks, 6 slots: another 1.125 s), appends kv 6 in
    #     its half-full block and gets its 4th token: B finishes at 5.125 + 1 + 1.125 = 7.25.
    cost = fake_cost(swap_per_block=PER_BLOCK, swap_per_slot=PER_SLOT, block_size=2)
    out = tiny(two_requests(), paged(5, 2, swap_blocks=8), cost, macro_steps=macro_steps, preemption="swap")
    r, steps = out.requests, out.steps
    assert list(r["status"]) == ["finished", "finished"]
    assert r.loc[0, "finish_s"] == pytest.approx(5.125, rel=1e-12)
    assert r.loc[1, "finish_s"] == pytest.approx(7.25, rel=1e-12)
    assert r.loc[1, "preemptions"] == 1
    assert (r.loc[1, "swapped_out_blocks"], r.loc[1, "swapped_in_blocks"]) == (3, 3)
    assert steps["swap_out_slots"].sum() == 6 and steps["swap_in_slots"].sum() == 6
    assert steps["swap_s"].sum() == pytest.approx(2.25, rel=1e-12)
    assert out.summary["swap_time_s"] == pytest.approx(2.25, rel=1e-12)
    # B's gap across its preemption is one ITL sample: tokens at 1, 2, 3 and 7.25; A's at 1, 2, 3, 5.125.
    assert out.itl.count == 6
    assert out.summary["mean_itl_ms"] == pytest.approx((1 + 1 + 4.25 + 1 + 1 + 2.125) / 6 * 1000, rel=1e-12)
    # TPOT over each request's own tokens: (finish - first token) / (4 - 1).
    assert out.summary["mean_tpot_ms"] == pytest.approx(((5.125 - 1) / 3 + (7.25 - 1) / 3) / 2 * 1000, rel=1e-12)


def test_swap_in_never_exceeds_max_num_seqs():
    """A swapped-out group comes back only when the batch has room for all its sequences.

    In a run from a trace this cannot bind (nothing is admitted while a group is
    swapped out, so running plus swapped sequences never exceed the limit); the rule
    is tested on its own by lowering the limit while a group is out.
    """
    ended = []
    sched = Scheduler(PagedAllocator(64, 2, swap_blocks=64),
                      SchedulerSettings(max_num_seqs=3, max_seq_len=4096, watermark=0.0, preemption="swap"),
                      ended.append)
    g0 = sched.add(Request(0, 0.0, 2, 3), 0.0)  # 1 sequence: finishes after 2 decode steps
    g1 = sched.add(Request(1, 0.0, 2, 4, n=2), 0.0)  # 2 sequences
    step = sched.schedule(0.0)
    assert step.prefill == [g0, g1]
    sched.complete(step, 1.0)
    sched._preempt(g1, Step())  # as memory pressure would: the latest arrival is swapped out
    sched.running.remove(g1)
    assert g1.status is Status.SWAPPED
    sched.limits = replace(sched.limits, max_num_seqs=2)  # g0 (1) + g1 (2) no longer fit together
    now, back_at = 1.0, None
    while sched.has_work:
        step = sched.schedule(now)
        assert step.shape.decode_seqs <= 2
        if step.swap_in_blocks:
            back_at = now
        now += 1.0
        sched.complete(step, now)
    # g0 decodes at 1 and 2 and ends at 3; only then may g1 come back.
    assert g0.finish == 3.0 and back_at == 3.0
    assert g1.status is Status.FINISHED


def test_a_swapped_group_that_can_never_return_is_aborted_and_the_next_one_returns(tiny, paged):
    # Paged, block size 2, 4 GPU blocks, 16 CPU blocks, swap, 1 s per step.
    #   A: prompt 1, output 8.  B: 2 samples, prompt 2, output 3.  C: prompt 1, output 2.
    #   step 1 [0,1] prefill: A, B (1 shared block), C: 1 block each, free 1.
    #   step 2 at 1: B's samples each take a block (2 > 1 free): A appends; B cannot, so the
    #     latest, C, is swapped out (1 block); then B fits. free 0.
    #   step 3 at 2: A takes a block, none free: B is swapped out (3 blocks). free 2.
    #   step 4 at 3: A decodes; B would need its 3 blocks + 1 per sample = 5 > 4 blocks:
    #     it can never come back and is aborted at 3, with the reason. C comes back in the
    #     same step (1 block) and its 2nd token ends it at 4.
    #   A decodes every step from 4 on: its 8th token ends it at 8.
    reqs = [Request(0, 0.0, 1, 8), Request(1, 0.0, 2, 3, n=2), Request(2, 0.0, 1, 2)]
    out = tiny(reqs, paged(4, 2, swap_blocks=16), preemption="swap")
    r = out.requests
    assert list(r["status"]) == ["finished", "aborted", "finished"]
    assert r.loc[1, "reason"] == "swapped-out group can no longer fit in GPU memory"
    assert list(r["finish_s"]) == [8.0, 3.0, 4.0]
    assert (r.loc[1, "swapped_out_blocks"], r.loc[1, "swapped_in_blocks"]) == (3, 0)
    assert out.steps["swap_in_blocks"].sum() == 1 and out.steps["swap_out_blocks"].sum() == 4
    assert out.alloc.cpu_pool.num_free == 16 and out.alloc.pool.num_free == 4


def swapped_pair(max_num_seqs):
    """A scheduler running g0 with g1 (2 blocks of 2) and g2 (3 blocks) swapped out."""
    sched = Scheduler(PagedAllocator(64, 2, swap_blocks=64),
                      SchedulerSettings(max_num_seqs=3, max_seq_len=4096, watermark=0.0, preemption="swap"),
                      lambda g: None)
    groups = [sched.add(Request(i, 0.0, p, 8), 0.0) for i, p in enumerate([2, 4, 6])]
    sched.complete(sched.schedule(0.0), 1.0)
    for g in groups[1:]:
        sched._preempt(g, Step())  # as memory pressure would, latest first
        sched.running.remove(g)
    sched.limits = replace(sched.limits, max_num_seqs=max_num_seqs)
    return sched, groups


def test_groups_swapped_in_together_add_up_in_the_step():
    sched, (_, g1, g2) = swapped_pair(max_num_seqs=3)
    step = sched.schedule(1.0)
    assert g1.status is Status.RUNNING and g2.status is Status.RUNNING
    assert (step.swap_in_blocks, step.swap_in_slots) == (2 + 3, (2 + 3) * 2)
    assert step.shape.decode_seqs == 3


def test_each_group_swapped_in_counts_against_max_num_seqs():
    # g0 runs (1 sequence); with a limit of 2, g1 comes back and g2 must wait.
    sched, (_, g1, g2) = swapped_pair(max_num_seqs=2)
    step = sched.schedule(1.0)
    assert g1.status is Status.RUNNING and g2.status is Status.SWAPPED
    assert step.shape.decode_seqs == 2


def test_contiguous_swaps_move_the_used_span():
    # Contiguous regions are moved as their stored tokens, not whole blocks: a sequence
    # of prompt 5 that decoded once holds 6 tokens in its region of 16 slots (max reservation).
    sched = Scheduler(ContiguousAllocator(64, "first_fit", "max", 16, swap_capacity_slots=64),
                      SchedulerSettings(max_seq_len=16, watermark=0.0, preemption="swap"), lambda g: None)
    g = sched.add(Request(0, 0.0, 5, 4), 0.0)
    sched.complete(sched.schedule(0.0), 1.0)
    sched.complete(sched.schedule(1.0), 2.0)
    step = Step()
    sched._preempt(g, step)
    assert (step.swap_out_blocks, step.swap_out_slots) == (1, 6)
