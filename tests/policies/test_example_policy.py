"""The example policy (``policies.example_first_fit_paged``): a policy that writes only the
basic protocol runs in the engine and agrees with the reference engine on everything.

This is the promise the split interface makes to a researcher: write the nine basic
methods in one small file, inherit the lockstep defaults, get correct (if slower)
results. The differential test below is the proof, on random workloads with forks
(parallel samples, beams), copy-on-write and preemption.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "reference"))  # ref_cases, ref_compare

import ref_compare  # noqa: E402
from ref_cases import BLOCK_SIZES, base_config, workloads  # noqa: E402

from kvsim.policies.example_first_fit_paged import FirstFitPagedAllocator  # noqa: E402
from kvsim.policies.kv_allocator import Admission, BasicAllocator, KVAllocator  # noqa: E402


def test_the_basic_protocol_is_small():
    """A new policy has nine methods to write; the lockstep protocol has defaults."""
    assert sorted(BasicAllocator.__abstractmethods__) == sorted(
        ["check_admit", "admit", "try_append", "fork", "free", "resident", "kv_len", "usage", "check"])
    assert not KVAllocator.__abstractmethods__ - BasicAllocator.__abstractmethods__
    assert FirstFitPagedAllocator.max_advance_all is KVAllocator.max_advance_all  # the example writes none


def test_hand_worked_fork_copy_and_classes():
    """Block size 4, prompt 5 tokens, two samples to 7 tokens: blocks [a, b] shared, b holds 1."""
    a = FirstFitPagedAllocator(num_blocks=6, block_size=4)
    assert a.check_admit(5, 7, 2, watermark_slots=0) is Admission.OK
    assert a.check_admit(5, 30, 2, watermark_slots=0) is Admission.NEVER  # 2 + 2 * (8 - 2) + 2 > 6
    a.admit([0, 1], 5, 7)
    u = a.usage()
    # 5 tokens held once; the shared, partly filled last block is nobody's reservation.
    assert (u.token_states, u.reserved, u.internal_frag, u.free, u.unshared) == (5, 0, 3, 16, 16)
    assert sorted(a.resident()) == [0, 1] and a.tables[0] == [0, 1]  # the lowest blocks first
    assert a.try_append([0])  # copy-on-write: seq 0 gets its own copy of block 1
    assert a.copied_blocks == 1 and a.tables[0] == [0, 2] and a.tables[1] == [0, 1]
    u = a.usage()
    # Blocks 0 (4 tokens), 1 (1: seq 1's own now), 2 (2: seq 0's copy); three free. Seq 0
    # reserves 1 more slot (final 7), seq 1 two; block 2's last slot is past seq 0's final.
    assert (u.token_states, u.reserved, u.internal_frag, u.free) == (7, 3, 2, 12)
    assert a.try_append_all() and a.resident_kv() == (2, 13)  # the lockstep defaults
    a.check()
    a.free(1)
    assert a.free_blocks[0] == 1 and a.usage().free == 16  # block 0 is still seq 0's
    a.check()


def test_no_swap_space_by_default():
    a = FirstFitPagedAllocator(num_blocks=4, block_size=2)
    a.admit([0], 3, 5)
    assert not a.can_swap_out([0])
    with pytest.raises(NotImplementedError, match="no swap space"):
        a.swap_out([0])


@st.composite
def example_cases(draw):
    """Paged configs without swap space or prefix cache (what the example supports), small
    caches so groups are preempted; workloads with samples, beams and plain requests."""
    max_len = draw(st.sampled_from([128, 256]))
    kv_slots = draw(st.integers(max_len, 4 * max_len))
    cfg = base_config(max_len, kv_slots, 0)
    B = draw(st.sampled_from([b for b in BLOCK_SIZES if b <= kv_slots]))
    cfg["allocator"] = {"kind": "paged", "block_size": B, "watermark": draw(st.sampled_from([0.0, 0.1]))}
    max_num_seqs = draw(st.sampled_from([2, 4, 256]))
    cfg["scheduler"] = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max(max_len, max_num_seqs)}
    cfg["preemption"] = {"mode": draw(st.sampled_from(["recompute", "auto"])),
                         "swap_fallback": draw(st.sampled_from(["recompute", "abort"]))}
    cfg["decoding"] = {"beam_concentration": draw(st.sampled_from([0.0, 3.0]))}
    cfg["seed"] = draw(st.integers(0, 3))
    return cfg, draw(workloads(max_len, False, max_count=10))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(example_cases())
def test_the_example_policy_agrees_with_the_reference_engine(case):
    cfg, requests = case
    built: list[KVAllocator] = []
    paged_factory = ref_compare.make_allocator_factory

    def example_factory(config):
        paged = paged_factory(config)  # the capacity the configured paged allocator gets

        def make() -> KVAllocator:
            p = paged()
            built.append(FirstFitPagedAllocator(p.pool.num_blocks, p.block_size))
            return built[-1]
        return make

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_compare, "make_allocator_factory", example_factory)
        diffs = ref_compare.differences(cfg, requests)
    assert built, "the engine ran the example policy"
    assert diffs == [], "\n".join(diffs[:12])
    for a in built:
        a.check()
