"""The defaults a policy inherits when it writes only the basic protocol
(``policies/kv_allocator.py``: ``BasicAllocator``'s optional methods and ``KVAllocator``'s
lockstep ones), checked on the example policy, which overrides none of them.

Why these tests exist: mutation testing found the swap entry points unchecked. A policy
without swap space never reaches them in the engine (``can_swap_out`` says no, so nothing is
swapped out and nothing comes back), so what is observable is (1) that the scheduler really
never calls them, even under ``preemption.mode: swap``, and (2) their message, which is what
a researcher sees when driving a new policy by hand: it must name the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvsim.policies.example_first_fit_paged import FirstFitPagedAllocator
from kvsim.policies.kv_allocator import BasicAllocator, KVAllocator, RunWeights
from kvsim.simulator.cost_model.base import BatchShape, CostModel
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.traces import Request

BASIC_DEFAULTS = ["free_slots", "fork_into", "copy_into", "can_swap_out", "swap_out", "check_swap_in", "swap_in"]
LOCKSTEP_DEFAULTS = ["try_append_all", "resident_kv", "max_advance_all", "advance_all"]


def test_the_example_inherits_every_default():
    # The premise of this file: if the example grew its own version of one of these, the
    # tests below would check the example's code instead of the default.
    for name in BASIC_DEFAULTS:
        assert getattr(FirstFitPagedAllocator, name) is getattr(BasicAllocator, name), name
    for name in LOCKSTEP_DEFAULTS:
        assert getattr(FirstFitPagedAllocator, name) is getattr(KVAllocator, name), name


def holding_two_groups() -> FirstFitPagedAllocator:
    """Block size 4, 5 blocks: group 0 (prompt 6, to 9 tokens) and group 1 (prompt 3, to 4)."""
    a = FirstFitPagedAllocator(num_blocks=5, block_size=4)
    a.admit([0], 6, 9)  # blocks 0, 1 (6 of 8 slots filled)
    a.admit([1], 3, 4)  # block 2 (3 of 4)
    return a


@pytest.mark.parametrize("call", [
    lambda a: a.swap_out([0]),
    lambda a: a.check_swap_in([0], 0),
    lambda a: a.swap_in([0]),
], ids=["swap_out", "check_swap_in", "swap_in"])
def test_without_swap_space_every_swap_entry_point_names_the_policy(call):
    a = holding_two_groups()
    before = a.usage()
    assert not a.can_swap_out([0]) and not a.can_swap_out([1])
    with pytest.raises(NotImplementedError, match="^FirstFitPagedAllocator has no swap space$"):
        call(a)
    assert a.usage() == before and sorted(a.resident()) == [0, 1]  # refused before touching anything
    a.check()


def test_the_lockstep_defaults_go_through_the_basic_protocol():
    a = holding_two_groups()
    assert a.resident_kv() == (2, 6 + 3)  # (sequences, tokens of KV): the decode batch's shape
    assert a.free_slots() == a.usage().free == 2 * 4
    assert a.try_append_all()  # 7 and 4 tokens: inside their last blocks
    assert (a.kv_len(0), a.kv_len(1)) == (7, 4) and a.resident_kv() == (2, 11)
    assert a.try_append_all()  # 8 and 5: sequence 1 crosses into block 3
    assert a.resident_kv() == (2, 13) and a.free_slots() == 4
    assert a.try_append_all()  # 9 and 6: sequence 0 crosses into block 4, the last free one
    assert a.resident_kv() == (2, 15) and a.free_slots() == 0
    assert a.try_append_all() and a.try_append_all()  # 11 and 8: blocks full, none needed
    before = a.usage()
    assert not a.try_append_all()  # sequence 1 needs a block for its 9th token, none is free...
    assert a.resident_kv() == (2, 19) and a.usage() == before  # ...so nobody grew (all or nothing)
    assert a.max_advance_all(1000) == 0  # the engine steps one iteration at a time
    with pytest.raises(NotImplementedError, match="^FirstFitPagedAllocator does not support macro-stepping$"):
        a.advance_all(RunWeights(1, 1.0, 0.0))
    with pytest.raises(NotImplementedError, match="^FirstFitPagedAllocator shares blocks instead of copying$"):
        a.copy_into(0, 1)
    a.check()


def test_the_default_fork_into_reseeds_a_sequence_from_another():
    a = holding_two_groups()
    a.fork_into(0, 1, 9)  # beam search: sequence 1 becomes a copy of sequence 0
    assert a.kv_len(1) == 6 and a.tables[1] == a.tables[0] == [0, 1]
    assert a.usage().token_states == 6 and a.free_slots() == 3 * 4  # block 2 went back
    assert a.try_append([1]) and a.copied_blocks == 1  # copy-on-write of the shared block 1
    # Each now owns its last block: sequence 0 (6 tokens, to 9) reserves 8 - 6 slots, and the
    # re-seeded sequence 1 (7 tokens) reserves 8 - 7, up to the final length it was given.
    assert a.usage().reserved == 2 + 1
    a.check()


@dataclass
class SecondPerStep(CostModel):
    """Every step lasts one second; transfers would be free (there are none here)."""

    def step_time(self, shape: BatchShape) -> float:
        return 1.0

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        return 1.0, 0.0

    def swap_time(self, num_blocks: int, num_slots: int | None = None) -> float:
        return 0.0

    def copy_time(self, num_blocks: int) -> float:
        return 0.0


def run_example(requests: list[Request], num_blocks: int, block_size: int):
    """The example policy in the engine, preemption mode ``swap``; returns (requests by id, step counters)."""
    sim = Simulation(requests, lambda: FirstFitPagedAllocator(num_blocks, block_size), SecondPerStep,
                     SchedulerSettings(max_seq_len=4096, watermark=0.0, preemption="swap"))
    sim.run()
    return sim.request_rows.frame().set_index("request_id"), sim.steps.totals().counters


def test_swap_mode_without_swap_space_recomputes_a_single_sequence_group():
    # Block size 2, 4 blocks; A (id 0) and B (id 1) arrive at 0, prompt 2, 5 output tokens
    # (each ends at 2 + 5 - 1 = 6 stored tokens), 1 s per step:
    #   step 1 (ends t=1): prefill both, 1 block each; first tokens.
    #   step 2 (t=2): both at 2 tokens take a block to store the 3rd: 0 free. Tokens 2.
    #   step 3 (t=3): 4 tokens each, inside their blocks. Tokens 3.
    #   step 4 (t=4): both need a block, none free: B (the later) is preempted; no swap space,
    #                 so it is recomputed (its 4 tokens freed); A takes a block. A's token 4.
    #   step 5 (t=5): B (prompt 2 + 3 generated = 5 tokens, 3 blocks) does not fit in 1 free
    #                 block: A decodes its 5th token and finishes, freeing its 3 blocks.
    #   step 6 (t=6): B re-prefills 5 tokens and samples its 4th; step 7 (t=7): its 5th.
    rows, counters = run_example([Request(0, 0.0, 2, 5), Request(1, 0.0, 2, 5)], num_blocks=4, block_size=2)
    assert list(rows["status"]) == ["finished", "finished"]
    assert list(rows["finish_s"]) == [5.0, 7.0]
    assert list(rows["preemptions"]) == [0, 1]
    assert list(rows["recomputed_tokens"]) == [0, 4]
    assert (counters["preempted_recompute"], counters["preempted_swap"], counters["aborted"]) == (1, 0, 0)


def test_swap_mode_without_swap_space_aborts_a_multi_sequence_group():
    # Block size 2, 6 blocks; D (id 0, one sequence) and C (id 1, n=2) arrive at 0, prompt 2,
    # 5 output tokens. After the prefill D holds 1 block and C's two samples share 1: 4 free.
    # Step 2: all three sequences cross a boundary (3 blocks, 1 free); step 3 fills them;
    # step 4: three blocks needed, one free: C (the later) is preempted. A multi-sequence group
    # cannot be recomputed and there is no swap space: it is aborted, and D goes on alone.
    rows, counters = run_example([Request(0, 0.0, 2, 5), Request(1, 0.0, 2, 5, n=2)], num_blocks=6, block_size=2)
    assert list(rows["status"]) == ["finished", "aborted"]
    assert rows.loc[1, "reason"] == "CPU swap space exhausted (a multi-sequence group cannot be recomputed)"
    assert rows.loc[0, "finish_s"] == 5.0  # prefill + 4 decode steps, never stopped
    assert (counters["preempted_recompute"], counters["preempted_swap"], counters["aborted"]) == (0, 0, 1)
