"""The scheduler follows vLLM v0's rules (DESIGN.md "Engine and scheduler")."""

import numpy as np
import pytest

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.simulation import SimulationStalled
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.simulator.sched.sequence import Status
from kvsim.traces import Request


def make_scheduler(num_blocks=8, block_size=4, **limits):
    ended = []
    limits.setdefault("max_seq_len", 4096)
    s = Scheduler(PagedAllocator(num_blocks, block_size), SchedulerSettings(**limits), ended.append)
    return s, ended


def test_admission_is_fcfs_and_prefill_steps_do_not_decode():
    s, _ = make_scheduler(num_blocks=100, watermark=0.0)
    a = s.add(Request(0, 0.0, 8, 5), 0.0)
    b = s.add(Request(1, 0.1, 8, 5), 0.1)
    step = s.schedule(0.2)
    assert step.prefill == [a, b] and step.decode == []
    assert step.shape.prefill_tokens == 16 and step.shape.decode_seqs == 0
    s.complete(step, 0.3)
    step = s.schedule(0.3)
    assert step.prefill == [] and step.decode == [a, b]
    assert step.shape.decode_seqs == 2 and step.shape.decode_context == 2 * 9


def test_batch_limits_stop_admission():
    s, _ = make_scheduler(num_blocks=100, max_num_seqs=2, watermark=0.0)
    for i in range(3):
        s.add(Request(i, 0.0, 8, 5), 0.0)
    assert len(s.schedule(0.0).prefill) == 2
    assert s.blocked == "limits"
    s2, _ = make_scheduler(num_blocks=100, max_num_batched_tokens=20, watermark=0.0)
    for i in range(3):
        s2.add(Request(i, 0.0, 8, 5), 0.0)
    assert s2.schedule(0.0).shape.prefill_tokens == 16


def test_latest_arrived_group_is_preempted_and_recomputed_at_front():
    # 5 blocks of 4 slots: two 8-token prompts take 4; the third prompt needs 2 more, and
    # the next decode needs a new block for each of the two running sequences.
    s, _ = make_scheduler(num_blocks=5, block_size=4, watermark=0.0)
    old = s.add(Request(0, 0.0, 8, 6), 0.0)
    new = s.add(Request(1, 1.0, 8, 6), 1.0)
    waiting = s.add(Request(2, 2.0, 8, 2), 2.0)
    step = s.schedule(2.0)
    assert step.prefill == [old, new]  # request 2 does not fit
    s.complete(step, 2.1)
    step = s.schedule(2.1)
    assert step.preempted == 1 and step.decode == [old]
    assert new.status is Status.WAITING and list(s.waiting) == [new, waiting]
    assert new.recomputed_tokens == 8
    assert new.prompt_len == 8 + 1  # prompt + the one token generated so far, folded in once
    s.complete(step, 2.2)
    assert old.generated == 2 and new.generated == 1


def test_request_level_batching_waits_for_the_whole_batch():
    s, _ = make_scheduler(num_blocks=100, watermark=0.0, request_level_batching=True)
    a = s.add(Request(0, 0.0, 4, 1), 0.0)
    b = s.add(Request(1, 0.0, 4, 3), 0.0)
    step = s.schedule(0.0)
    assert step.prefill == [a, b]
    s.complete(step, 0.1)
    assert a.status is Status.FINISHED
    c = s.add(Request(2, 0.1, 4, 1), 0.1)
    step = s.schedule(0.1)
    assert step.prefill == [] and step.decode == [b]  # c waits although memory is free
    s.complete(step, 0.2)
    s.complete(s.schedule(0.2), 0.3)
    assert b.status is Status.FINISHED
    assert s.schedule(0.3).prefill == [c]


def test_too_long_requests_are_rejected_with_reason():
    s, ended = make_scheduler(num_blocks=8, block_size=4, max_seq_len=100)
    s.add(Request(0, 0.0, 101, 1), 0.0)
    s.add(Request(1, 0.0, 60, 50), 0.0)
    s.add(Request(2, 0.0, 40, 2), 0.0)  # 40 tokens > 8 blocks * 4 slots: never fits
    s.schedule(0.0)
    reasons = {g.request.request_id: g.reason for g in ended}
    assert all(g.status is Status.REJECTED for g in ended)
    assert "context window (model.context_len_tokens)" in reasons[0] and "prompt + output" in reasons[1]
    assert "whole cache" in reasons[2]


def test_every_request_ends_and_finished_ones_generate_their_output(simulate):
    reqs = [Request(i, i * 0.05, 20 + 37 * i % 300, 1 + 53 * i % 120) for i in range(120)]
    reqs.append(Request(120, 7.0, 5000, 3))  # longer than max_seq_len: rejected
    _, df, steps = simulate(reqs, num_blocks=60, block_size=16)
    assert len(df) == len(reqs) and set(df["request_id"]) == set(range(len(reqs)))
    assert set(df["status"]) == {"finished", "rejected"}
    assert df.loc[df.request_id == 120, "status"].item() == "rejected"
    done = df[df.status == "finished"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert steps["preempted_recompute"].sum() > 0, "this load must force preemption"
    # Every token comes from one step: prefill (or re-prefill) emits one, each decode one more.
    prefill = steps["prefill_tokens"] > 0
    emitted = steps["decode_tokens"].sum() + steps.loc[prefill, "batched_requests"].sum()
    assert emitted == df["generated_tokens"].sum() == done["output_tokens"].sum()
    total = steps[list(CLASSES)].sum(axis=1)
    assert np.allclose(total, 60 * 16), "memory classes must sum to capacity at every step"


def test_same_input_gives_identical_results(simulate):
    reqs = [Request(i, i * 0.03, 30 + (i * 13) % 400, 1 + (i * 7) % 150) for i in range(150)]
    _, df1, st1 = simulate(reqs, num_blocks=50)
    _, df2, st2 = simulate(reqs, num_blocks=50)
    assert df1.equals(df2) and st1.equals(st2)


def test_impossible_progress_stops_with_a_clear_message(simulate):
    class NeverRoom(PagedAllocator):
        """An allocator that always says there is no space: nothing can ever run."""

        def check_admit(self, *args, **kwargs):
            return Admission.NO_SPACE

    with pytest.raises(SimulationStalled, match="request 0 .* can never be scheduled"):
        simulate([Request(0, 0.0, 10, 5)], allocator=lambda: NeverRoom(64, 16))
