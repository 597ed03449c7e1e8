"""Swap vs recompute (DESIGN.md "Preemption"), with a bounded CPU swap pool."""

import random

import pytest

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import (
    GPUS,
    MODELS,
    BatchShape,
    RooflineCostModel,
    causal_attention_pairs,
)
from kvsim.traces import Request


def heavy(count=200, seed=0, **extra):
    rng = random.Random(seed)
    return [Request(i, i * 0.01, rng.randint(50, 400), rng.randint(50, 400), **extra) for i in range(count)]


def test_every_swapped_block_comes_back_or_is_freed(simulate):
    allocs = []

    def make():
        allocs.append(PagedAllocator(80, 16, swap_blocks=200))
        return allocs[-1]

    _, df, steps = simulate(heavy(), allocator=make, preemption="swap")
    assert steps["preempted_swap"].sum() > 0
    assert (df["status"] == "finished").all()
    assert (df["swapped_out_blocks"] == df["swapped_in_blocks"]).all()
    a = allocs[0]
    assert a.pool.num_free == 80 and a.cpu_pool.num_free == 200
    a.check()


def test_no_admission_while_anything_is_swapped(simulate):
    _, _, steps = simulate(heavy(), num_blocks=80, swap_blocks=200, preemption="swap")
    prefill_steps = steps[steps["prefill_tokens"] > 0]
    assert len(prefill_steps) > 0 and (steps["swapped"] > 0).any()
    assert (prefill_steps["swapped"] == 0).all()
    assert (prefill_steps["preempted_swap"] == 0).all()


def test_swap_space_exhausted_falls_back_to_recompute(simulate):
    _, df, steps = simulate(heavy(), num_blocks=80, swap_blocks=0, preemption="swap", swap_fallback="recompute")
    assert steps["preempted_swap"].sum() == 0 and steps["preempted_recompute"].sum() > 0
    assert (df["status"] == "finished").all() and df["recomputed_tokens"].sum() > 0


def test_swap_space_exhausted_aborts_with_reason(simulate):
    _, df, steps = simulate(heavy(), num_blocks=80, swap_blocks=0, preemption="swap", swap_fallback="abort")
    aborted = df[df.status == "aborted"]
    assert len(aborted) == steps["aborted"].sum() > 0
    assert (aborted["reason"] == "CPU swap space exhausted").all()
    assert set(df["status"]) == {"finished", "aborted"}


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_single_sequence_groups_recompute_and_multi_sequence_groups_swap(simulate, mode):
    reqs = heavy(60, seed=1, n=3) + [Request(1000 + i, 0.6 + i * 0.01, 200, 300) for i in range(60)]
    reqs.sort(key=lambda r: r.arrival_time)
    reqs = [Request(i, r.arrival_time, r.prompt_tokens, r.output_tokens, n=r.n) for i, r in enumerate(reqs)]
    _, df, steps = simulate(reqs, num_blocks=120, swap_blocks=400, preemption=mode)
    assert steps["preempted_swap"].sum() > 0 and steps["preempted_recompute"].sum() > 0
    # Samples hold different tokens after the prompt: their groups are swapped, never recomputed.
    assert (df.loc[df.swapped_out_blocks > 0, "num_seqs"] == 3).all()
    assert (df.loc[df.recomputed_tokens > 0, "num_seqs"] == 1).all()
    assert (df.status == "finished").all()


def test_multi_sequence_group_without_swap_space_is_aborted_with_reason(simulate):
    reqs = heavy(40, seed=4, n=2)
    _, df, _ = simulate(reqs, num_blocks=60, swap_blocks=0, preemption="recompute")
    aborted = df[df.status == "aborted"]
    assert len(aborted) > 0
    assert aborted["reason"].str.contains("cannot be recomputed").all()


def test_swapped_groups_come_back_oldest_first():
    from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings

    s = Scheduler(PagedAllocator(30, 4, swap_blocks=60), SchedulerSettings(max_seq_len=4096, watermark=0.0,
                                                                           preemption="swap"), lambda g: None)
    for i in range(4):
        s.add(Request(i, i * 0.1, 4, 30, n=2), i * 0.1)
    now = 1.0
    for _ in range(200):  # bounded: the memory runs out within a few dozen steps
        step = s.schedule(now)
        now += 0.01
        s.complete(step, now)
        if len(s.swapped) >= 2:
            break
    order = [g.request.request_id for g in s.swapped]
    assert len(order) >= 2
    assert order == sorted(order)  # victims are the latest arrivals, but the queue is by arrival


def test_group_wider_than_max_num_seqs_is_rejected_not_stalled(simulate):
    _, df, _ = simulate([Request(0, 0.0, 10, 5, n=8), Request(1, 0.1, 10, 5)], max_num_seqs=4)
    assert df.set_index("request_id").loc[0, "status"] == "rejected"
    assert "max_num_seqs" in df.set_index("request_id").loc[0, "reason"]
    assert df.set_index("request_id").loc[1, "status"] == "finished"


def test_recompute_pays_the_prefill_again(simulate):
    # Two requests; in 12 blocks of 16 the later one is preempted once and recomputed.
    reqs = [Request(0, 0.0, 64, 120), Request(1, 0.001, 64, 60)]
    _, tight, steps = simulate(reqs, num_blocks=12, block_size=16, preemption="recompute", watermark=0.0)
    _, ample, _ = simulate(reqs, num_blocks=200, block_size=16, preemption="recompute", watermark=0.0)
    victim = tight[tight.request_id == 1].iloc[0]
    assert victim.preemptions == 1 and tight.preemptions.sum() == 1
    redo = steps[steps.recompute_tokens > 0]
    assert len(redo) == 1
    # Its prompt plus the tokens generated before preemption are prefilled again.
    assert redo.recompute_tokens.iloc[0] == victim.recomputed_tokens + 1
    cost = RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])
    t = redo.recompute_tokens.iloc[0]
    prefill_s = cost.step_time(BatchShape(prefill_seqs=1, prefill_tokens=t, prefill_attn_pairs=causal_attention_pairs(t)))
    delay = victim.finish_s - ample[ample.request_id == 1].iloc[0].finish_s
    assert delay >= prefill_s


def test_overlapping_swaps_with_compute_never_slows_a_step(simulate):
    from kvsim.simulator.engine.simulation import Simulation
    from kvsim.simulator.sched.scheduler import SchedulerSettings

    reqs = heavy(150, seed=3)
    finish = {}
    for overlap in (False, True):
        sim = Simulation(reqs, lambda: PagedAllocator(80, 16, swap_blocks=300),
                         lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"]),
                         SchedulerSettings(max_seq_len=4096, preemption="swap"), overlap_swap=overlap)
        sim.run()
        steps = sim.steps.frame()
        swapping = steps[steps.swap_s > 0]
        assert len(swapping) > 0
        # A step lasts at least its transfer: its own swap-ins are needed by its compute.
        assert (swapping.duration_s >= swapping.swap_s - 1e-12).all()
        finish[overlap] = sim.request_rows.frame()["finish_s"].max()
    assert finish[True] < finish[False]  # max(compute, transfer) < compute + transfer
