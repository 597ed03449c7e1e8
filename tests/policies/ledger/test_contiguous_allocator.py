"""Contiguous allocator: the paper's Orca/FasterTransformer baselines and exact accounting.

The property test drives random admit/append/fork/free/swap sequences (and the
lockstep ``try_append_all``/``advance_all``) and keeps its own model of every
sequence (kv_len, final_len, reservation); region sizes, admission answers and
the memory classes are recomputed from that model. The lockstep macro-steps are
also checked against stepping one iteration at a time on a copy.
"""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.kv_allocator import Admission, MemoryUsage, RunWeights, SwapResult
from kvsim.policies.ledger.contiguous_allocator import (
    CONTIGUOUS_PRESETS,
    ContiguousAllocator,
    OutOfSlots,
    contiguous_preset,
)
from kvsim.policies.ledger.reservation import RESERVATION_POLICIES, reservation_slots
from kvsim.policies.ledger.slot_space import PLACEMENTS, make_slot_space

OPT13B_SLOTS = 15_728  # KV slots of OPT-13B on one A100-40GB (vLLM paper, Table 1)


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# --- reservation policies -------------------------------------------------------------------
def test_reservations_follow_the_paper_definitions():
    # prompt 100, 201 output tokens -> 300 stored tokens at the end
    assert reservation_slots("max", 100, 300, 2048) == 2048
    # pow2 rounds the output only: 100 + next_pow2(201) = 100 + 256
    assert reservation_slots("pow2", 100, 300, 2048) == 356
    # the paper's example: a 25-token output gets 32 slots (prompt 10, 34 tokens stored)
    assert reservation_slots("pow2", 10, 34, 2048) == 10 + 32
    assert reservation_slots("pow2", 100, 163, 2048) == 100 + 64  # 64 outputs: already a power
    assert reservation_slots("pow2", 100, 1500, 2000) == 2000  # never past max_seq_len
    assert reservation_slots("oracle", 100, 300, 2048) == 300


def test_reservation_rejects_bad_input_by_name():
    with pytest.raises(ValueError, match="allowed: max, pow2, oracle"):
        reservation_slots("half", 1, 1, 8)
    with pytest.raises(ValueError, match="final_len"):
        reservation_slots("max", 10, 9, 2048)
    with pytest.raises(ValueError, match="prompt_len"):
        reservation_slots("max", 0, 9, 2048)


def test_presets():
    assert set(CONTIGUOUS_PRESETS) == {"orca-max", "orca-pow2", "orca-oracle", "fastertransformer"}
    for name in ("orca-max", "orca-pow2"):
        assert CONTIGUOUS_PRESETS[name].placement == "buddy"  # Orca uses a buddy allocator
    # Oracle on a buddy that hands the rounded-up tail back: otherwise it equals Pow2.
    assert CONTIGUOUS_PRESETS["orca-oracle"].placement == "buddy_exact"
    for name in ("orca-max", "orca-pow2", "orca-oracle"):
        assert not CONTIGUOUS_PRESETS[name].request_level_batching
    ft = contiguous_preset("fastertransformer")
    assert ft.reservation == "max" and ft.request_level_batching
    alloc = ContiguousAllocator.from_preset("orca-pow2", 1024, 512)
    assert (alloc.placement, alloc.reservation, alloc.max_seq_len) == ("buddy", "pow2", 512)
    with pytest.raises(ValueError, match="allowed: orca-max, orca-pow2"):
        contiguous_preset("orca")


def test_constructor_rejects_bad_names():
    with pytest.raises(ValueError, match="allowed: max, pow2, oracle"):
        ContiguousAllocator(100, "buddy", "exact", 64)
    with pytest.raises(ValueError, match="allowed: buddy, buddy_exact, first_fit, best_fit"):
        ContiguousAllocator(100, "next_fit", "max", 64)


# --- the paper's baselines ----------------------------------------------------------------------
@pytest.mark.parametrize("watermark", [0, 157])  # 157 = vLLM's 1% watermark of 15,728
@pytest.mark.parametrize("preset", ["orca-max", "fastertransformer"])
def test_max_reservation_admits_seven_requests_on_opt13b(preset, watermark):
    # 15,728 // 2048 = 7 max-length regions, whatever the prompt length
    alloc = ContiguousAllocator.from_preset(preset, OPT13B_SLOTS, 2048)
    for seq in range(7):
        assert alloc.check_admit(20, 80, 1, watermark) is Admission.OK
        alloc.admit([seq], 20, 80)
    assert alloc.check_admit(20, 80, 1, watermark) is Admission.NO_SPACE
    assert alloc.usage().internal_frag == 7 * (2048 - 80)
    alloc.check()


def test_requests_that_can_never_fit():
    small = ContiguousAllocator(1000, "first_fit", "oracle", 2048)
    assert small.check_admit(900, 1100, 1, 0) is Admission.NEVER  # longer than the cache
    assert small.check_admit(400, 600, 2, 0) is Admission.NEVER  # two copies exceed it
    assert small.check_admit(400, 600, 1, 0) is Admission.OK
    assert small.check_admit(400, 600, 1, 500) is Admission.NEVER  # only inside the watermark
    # a max-length region larger than the cache
    assert ContiguousAllocator(1000, "buddy", "max", 2048).check_admit(5, 6, 1, 0) is (
        Admission.NEVER
    )
    orca_max = ContiguousAllocator.from_preset("orca-max", OPT13B_SLOTS, 2048)
    assert orca_max.check_admit(2000, 2100, 1, 0) is Admission.NEVER  # past max_seq_len
    assert orca_max.check_admit(5, 6, 8, 0) is Admission.NEVER  # 8 x 2048 > 15,728
    # buddy: 12,000 slots fit in total, but no top block (largest 8192) holds one region
    assert (
        ContiguousAllocator(OPT13B_SLOTS, "buddy", "oracle", 16384).check_admit(10, 12_000, 1, 0)
        is Admission.NEVER
    )
    assert (
        ContiguousAllocator(OPT13B_SLOTS, "first_fit", "oracle", 16384).check_admit(
            10, 12_000, 1, 0
        )
        is Admission.OK
    )


@pytest.mark.parametrize("placement", ["first_fit", "best_fit"])
def test_fragmentation_is_told_apart_from_lack_of_space(placement):
    alloc = ContiguousAllocator(100, placement, "oracle", 100)
    for seq in range(3):
        alloc.admit([seq], 10, 30)  # regions [0,30) [30,60) [60,90); hole [90,100)
    alloc.free(1)  # holes of 30 and 10: 40 free slots
    assert alloc.check_admit(10, 35, 1, 0) is Admission.FRAGMENTED
    assert alloc.check_admit(10, 20, 2, 0) is Admission.FRAGMENTED  # 40 free, one 20 fits
    assert alloc.check_admit(10, 30, 1, 0) is Admission.OK
    assert alloc.check_admit(10, 30, 1, 11) is Admission.NO_SPACE  # 40 - 11 < 30
    assert alloc.check_admit(10, 45, 1, 0) is Admission.NO_SPACE
    with pytest.raises(OutOfSlots):
        alloc.admit([7], 10, 35)
    alloc.check()


def test_buddy_fragmentation():
    alloc = ContiguousAllocator(16, "buddy", "oracle", 16)
    for seq in range(4):
        alloc.admit([seq], 2, 4)  # four 4-slot regions at 0, 4, 8, 12
    alloc.free(1)
    alloc.free(3)  # 8 free slots, but as two 4-blocks with live buddies
    assert alloc.check_admit(2, 8, 1, 0) is Admission.FRAGMENTED
    alloc.free(2)  # 8..16 merges
    assert alloc.check_admit(2, 8, 1, 0) is Admission.OK


def test_first_fit_and_best_fit_place_differently():
    where = {}
    for placement in ("first_fit", "best_fit"):
        alloc = ContiguousAllocator(100, placement, "oracle", 100)
        for seq, final in enumerate((10, 30, 10, 5, 10)):  # at 0, 10, 40, 50, 55
            alloc.admit([seq], 1, final)
        alloc.free(1)  # hole of 30 at 10
        alloc.free(3)  # hole of 5 at 50
        alloc.admit([9], 1, 5)
        where[placement] = alloc.region(9)
    assert where == {"first_fit": (10, 5), "best_fit": (50, 5)}


def test_classes_of_one_orca_pow2_sequence():
    # prompt 100, 201 output tokens: 300 tokens at the end; pow2 reserves 100 + 256, and the
    # buddy allocator places that in a region of 512: 356 - 300 = 56 slots of over-reservation
    # (internal), 512 - 356 = 156 of the buddy's rounding (allocator)
    alloc = ContiguousAllocator.from_preset("orca-pow2", OPT13B_SLOTS, 2048)
    alloc.admit([0], 100, 300)
    u = alloc.usage()
    assert (u.token_states, u.reserved, u.internal_frag, u.allocator_frag, u.free) == (100, 200, 56, 156, 15_216)
    for _ in range(5):
        assert alloc.try_append([0])
    u = alloc.usage()
    assert (u.token_states, u.reserved, u.internal_frag, u.allocator_frag) == (105, 195, 56, 156)


def test_a_sequence_outgrowing_its_reservation_turns_rounding_into_tokens():
    """Past its final length and its reservation (into the buddy's rounding), each token
    takes a slot from ``allocator_frag``; the classes still sum to capacity."""
    alloc = ContiguousAllocator.from_preset("orca-pow2", OPT13B_SLOTS, 2048)
    alloc.admit([0], 100, 101)  # 2 output tokens: reserves 100 + 2, region 128
    u = alloc.usage()
    assert (u.reserved, u.internal_frag, u.allocator_frag) == (1, 1, 26)
    for _ in range(4):  # 104 tokens: past final (101) and reservation (102)
        assert alloc.try_append([0])
    u = alloc.usage()
    assert (u.token_states, u.reserved, u.internal_frag, u.allocator_frag) == (104, 0, 0, 24)
    alloc.check()


def test_oracle_on_plain_buddy_rounds_but_buddy_exact_does_not():
    rounded = ContiguousAllocator(OPT13B_SLOTS, "buddy", "oracle", 2048)
    exact = ContiguousAllocator(OPT13B_SLOTS, "buddy_exact", "oracle", 2048)
    for alloc in (rounded, exact):
        alloc.admit([0], 100, 300)
    assert rounded.region(0)[1] == 512 and (rounded.usage().internal_frag, rounded.usage().allocator_frag) == (0, 212)
    assert exact.region(0)[1] == 300 and (exact.usage().internal_frag, exact.usage().allocator_frag) == (0, 0)


def test_a_full_region_cannot_grow_and_appends_are_all_or_nothing():
    alloc = ContiguousAllocator(100, "first_fit", "oracle", 100)
    alloc.admit([0], 5, 5)  # region of 5, already full
    alloc.admit([1], 3, 10)
    assert not alloc.try_append([1, 0])
    assert (alloc.kv_len(0), alloc.kv_len(1)) == (5, 3)
    assert alloc.try_append([1])
    assert alloc.kv_len(1) == 4 and alloc.usage().token_states == 9


def test_a_sequence_running_past_its_final_len_counts_tokens_not_frag():
    alloc = ContiguousAllocator(64, "buddy", "oracle", 64)
    alloc.admit([0], 3, 5)  # asks for 5, a region of 8
    for _ in range(3):
        assert alloc.try_append([0])  # kv 6 > final 5
    u = alloc.usage()
    assert (u.token_states, u.reserved, u.internal_frag, u.allocator_frag) == (6, 0, 0, 2)
    alloc.check()


def test_samples_and_forks_hold_their_own_copies():
    alloc = ContiguousAllocator(OPT13B_SLOTS, "best_fit", "oracle", 2048)
    assert not alloc.shares_memory and alloc.block_size == 1
    alloc.admit([0, 1], 50, 80)  # two samples, each with its own prompt copy
    assert alloc.usage().token_states == 100 and alloc.usage().reserved == 60
    alloc.try_append([0])
    alloc.fork(0, 2, 90)  # a beam: copies 51 tokens into a region of 90
    assert alloc.kv_len(2) == 51 and alloc.region(2)[1] == 90
    assert alloc.usage().token_states == 50 + 51 + 51
    offsets = {alloc.region(s)[0] for s in (0, 1, 2)}
    assert len(offsets) == 3
    alloc.check()


def test_swap_out_and_in():
    alloc = ContiguousAllocator(1000, "first_fit", "oracle", 1000, swap_capacity_slots=150)
    alloc.admit([0], 100, 200)
    alloc.admit([1], 100, 200)
    alloc.admit([2], 50, 60)
    assert alloc.can_swap_out([0]) and not alloc.can_swap_out([0, 1])  # 200 > 150
    assert alloc.swap_out([0]) == SwapResult(blocks=1, slots=100)
    assert alloc.free_slots() == 740 and alloc.swap_used_slots == 100
    assert alloc.kv_len(0) == 100
    assert not alloc.can_swap_out([1])  # 100 + 100 > 150
    assert alloc.can_swap_out([2])  # 100 + 50 fills the swap space exactly
    assert alloc.check_swap_in([0], 0) is Admission.OK
    assert alloc.check_swap_in([0], 701) is Admission.NO_SPACE
    assert alloc.swap_in([0]) == SwapResult(blocks=1, slots=100)
    assert alloc.region(0)[1] == 200 and alloc.swap_used_slots == 0
    alloc.check()


# --- random use ------------------------------------------------------------------------------------
def expected_region(placement: str, reserve: int) -> int:
    return pow2_at_least(reserve) if placement == "buddy" else reserve


def expected_reserve(policy: str, stored_len: int, final_len: int, max_seq_len: int) -> int:
    if policy == "max":
        return max_seq_len
    if policy == "pow2":  # the stored tokens plus the output still to come, rounded up
        return min(stored_len + pow2_at_least(final_len - stored_len + 1), max_seq_len)
    return final_len


@pytest.mark.parametrize("reservation", RESERVATION_POLICIES)
@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(8, 400),
    max_seq_len=st.integers(4, 128),
    swap_cap=st.integers(0, 300),
    steps=st.integers(0, 40),
    data=st.data(),
)
def test_random_use_keeps_every_invariant(
    placement, reservation, capacity, max_seq_len, swap_cap, steps, data
):
    alloc = ContiguousAllocator(capacity, placement, reservation, max_seq_len, swap_cap)
    running: dict[int, list[int]] = {}  # seq -> [kv_len, final_len, reserve]
    swapped: dict[int, list[int]] = {}
    next_id = 0

    def used() -> int:
        return sum(expected_region(placement, r) for _, _, r in running.values())

    def admission(reserves: list[int], watermark: int) -> Admission:
        needed = sum(expected_region(placement, r) for r in reserves)
        fresh = make_slot_space(placement, capacity)
        if needed > capacity - watermark or None in [fresh.allocate(r) for r in reserves]:
            return Admission.NEVER
        if capacity - used() - watermark < needed:
            return Admission.NO_SPACE
        trial = copy.deepcopy(alloc.space)  # can the regions really be placed, in order?
        if None in [trial.allocate(r) for r in reserves]:
            return Admission.FRAGMENTED
        return Admission.OK

    for _ in range(steps):
        op = data.draw(
            st.sampled_from(
                ["admit", "append", "append_all", "advance", "fork", "free", "out", "in"]
            )
        )
        if op == "admit":
            prompt = data.draw(st.integers(1, 64))
            final = prompt + data.draw(st.integers(1, 64)) - 1
            n = data.draw(st.integers(1, 3))
            wm = data.draw(st.sampled_from([0, 0, 3]))
            reserve = expected_reserve(reservation, prompt, final, max_seq_len)
            want = Admission.NEVER if reserve < final else admission([reserve] * n, wm)
            assert alloc.check_admit(prompt, final, n, wm) is want
            if want is Admission.OK:
                ids = list(range(next_id, next_id + n))
                next_id += n
                alloc.admit(ids, prompt, final)
                for s in ids:
                    running[s] = [prompt, final, reserve]
        elif op == "append" and running:
            group = data.draw(st.lists(st.sampled_from(sorted(running)), min_size=1, unique=True))
            fits = all(running[s][0] < expected_region(placement, running[s][2]) for s in group)
            assert alloc.try_append(group) == fits
            if fits:
                for s in group:
                    running[s][0] += 1
        elif op == "append_all":
            fits = all(kv < expected_region(placement, r) for kv, _, r in running.values())
            before = alloc.usage()
            assert alloc.try_append_all() == fits
            if fits:
                for seq in running.values():
                    seq[0] += 1
            else:
                assert alloc.usage() == before
        elif op == "advance":
            limit = data.draw(st.integers(0, 30))
            room = [
                max(kv, min(final, expected_region(placement, r))) - kv
                for kv, final, r in running.values()
            ]
            k = alloc.max_advance_all(limit)
            assert k == min([limit, *room])
            k = data.draw(st.integers(0, k))
            lengths = {s: alloc.kv_len(s) for s in [*running, *swapped]}
            alloc.advance_all(RunWeights(k, 0.5, 0.25))
            for s in running:
                assert alloc.kv_len(s) == lengths[s] + k
                running[s][0] += k
            for s in swapped:
                assert alloc.kv_len(s) == lengths[s]
        elif op == "fork" and running:
            parent = data.draw(st.sampled_from(sorted(running)))
            kv = running[parent][0]
            final = kv + data.draw(st.integers(0, 20))
            reserve = expected_reserve(reservation, kv, final, max_seq_len)
            before = alloc.usage()
            try:
                alloc.fork(parent, next_id, final)
            except ValueError:
                assert reserve < final  # a child longer than its reservation is refused
                assert alloc.usage() == before
            except OutOfSlots:
                assert reserve >= final and alloc.usage() == before
            else:
                running[next_id] = [kv, final, reserve]
            next_id += 1
        elif op == "free" and (running or swapped):
            seq = data.draw(st.sampled_from(sorted(running) + sorted(swapped)))
            alloc.free(seq)
            running.pop(seq, None)
            swapped.pop(seq, None)
        elif op == "out" and running:
            group = data.draw(st.lists(st.sampled_from(sorted(running)), min_size=1, unique=True))
            moved = sum(running[s][0] for s in group)
            cpu = sum(v[0] for v in swapped.values())
            assert alloc.can_swap_out(group) == (cpu + moved <= swap_cap)
            if cpu + moved <= swap_cap:
                assert alloc.swap_out(group) == SwapResult(blocks=len(group), slots=moved)
                for s in group:
                    swapped[s] = running.pop(s)
        elif op == "in" and swapped:
            group = data.draw(st.lists(st.sampled_from(sorted(swapped)), min_size=1, unique=True))
            want = admission([swapped[s][2] for s in group], 0)
            assert alloc.check_swap_in(group, 0) is want
            if want is Admission.OK:
                moved = sum(swapped[s][0] for s in group)
                assert alloc.swap_in(group) == SwapResult(blocks=len(group), slots=moved)
                for s in group:
                    running[s] = swapped.pop(s)

        # --- invariants, recomputed from the model --------------------------------------------
        alloc.check()
        spans = []
        token_states = reserved = internal = rounding = 0
        for s, (kv, final, reserve) in running.items():
            offset, size = alloc.region(s)
            assert size == expected_region(placement, reserve)
            if placement == "buddy":
                assert size & (size - 1) == 0 and offset % size == 0
            assert alloc.kv_len(s) == kv
            spans.append((offset, size))
            target = max(kv, min(final, size))
            asked = max(reserve, target)  # what it asked for, or has grown to
            token_states += kv
            reserved += target - kv
            internal += asked - target
            rounding += size - asked
        spans.sort()
        for (a, sa), (b, _) in zip(spans, spans[1:]):
            assert a + sa <= b, "regions overlap"
        assert all(o >= 0 and o + s <= capacity for o, s in spans)
        for s, (kv, _, _) in swapped.items():
            assert alloc.kv_len(s) == kv
        assert alloc.swap_used_slots == sum(v[0] for v in swapped.values())
        u = alloc.usage()
        free = capacity - used()
        assert (u.token_states, u.reserved, u.internal_frag, u.allocator_frag, u.free) == (
            token_states,
            reserved,
            internal,
            rounding,
            free,
        )
        assert alloc.free_slots() == free
        assert min(u.token_states, u.reserved, u.internal_frag, u.allocator_frag, u.free) >= 0
        assert u.token_states + u.reserved + u.internal_frag + u.allocator_frag + u.free == capacity
        if placement != "buddy":  # only a plain buddy rounds
            assert u.allocator_frag == 0

    for seq in data.draw(st.permutations(sorted(running) + sorted(swapped))):
        alloc.free(seq)
    alloc.check()
    assert alloc.free_slots() == capacity and alloc.swap_used_slots == 0
    assert alloc.usage().free == capacity
    if placement.startswith("buddy"):
        assert alloc.space.holes() == make_slot_space(placement, capacity).holes()
    else:
        assert alloc.space.holes() == [(0, capacity)]


# --- lockstep macro-steps ---------------------------------------------------------------------------
LOCKSTEP_CASES = [("buddy", "max"), ("buddy_exact", "oracle"), ("first_fit", "pow2")]


def random_state(data, placement: str, reservation: str) -> ContiguousAllocator:
    """An allocator with a few running sequences (some appended past their final_len, some
    regions full) and a few swapped out, built through the public API only."""
    max_seq_len = 64
    alloc = ContiguousAllocator(512, placement, reservation, max_seq_len, swap_capacity_slots=200)
    seq = 0
    for _ in range(data.draw(st.integers(0, 6))):
        prompt = data.draw(st.integers(1, 40))
        final = prompt + data.draw(st.integers(0, 20))
        n = data.draw(st.integers(1, 2))
        if alloc.check_admit(prompt, final, n, 0) is Admission.OK:
            alloc.admit(list(range(seq, seq + n)), prompt, final)
            seq += n
    for _ in range(data.draw(st.integers(0, 4))):
        running = sorted(alloc._base)
        if not running:
            break
        group = data.draw(st.lists(st.sampled_from(running), min_size=1, unique=True))
        for _ in range(data.draw(st.integers(1, 12))):  # may outgrow final_len or fill a region
            alloc.try_append(group)
        for _ in range(data.draw(st.integers(0, 3))):
            alloc.try_append_all()
    running = sorted(alloc._base)
    if running and data.draw(st.booleans()):
        group = data.draw(st.lists(st.sampled_from(running), min_size=1, max_size=2, unique=True))
        if alloc.can_swap_out(group):
            alloc.swap_out(group)
    alloc.check()
    return alloc


def lockstep_append_within_targets(alloc: ContiguousAllocator) -> bool:
    """One ``try_append_all``, judged only from ``usage()``: did it succeed with every new
    token filling a reserved slot (no sequence outgrowing its final_len)?"""
    n = alloc.resident_kv()[0]
    before = alloc.usage()
    if not alloc.try_append_all():
        return False
    after = alloc.usage()
    return after.internal_frag == before.internal_frag and after.reserved == before.reserved - n


@pytest.mark.parametrize(("placement", "reservation"), LOCKSTEP_CASES)
@settings(max_examples=40, deadline=None)
@given(
    first=st.floats(1e-3, 1.0),
    slope=st.floats(0.0, 1e-2),
    data=st.data(),
)
def test_advance_all_integrals_match_stepping_one_iteration_at_a_time(
    placement, reservation, first, slope, data
):
    alloc = random_state(data, placement, reservation)
    k = data.draw(st.integers(0, alloc.max_advance_all(60)))
    stepped = copy.deepcopy(alloc)
    sums = dict.fromkeys(("capacity", "token_states", "reserved", "internal_frag", "free"), 0.0)
    allocated = 0.0
    for i in range(1, k + 1):
        assert stepped.try_append_all()
        u = stepped.usage()
        seconds = first + slope * (i - 1)
        for name in sums:
            sums[name] += getattr(u, name) * seconds
        allocated += (u.capacity - u.free) * seconds
    got = alloc.advance_all(RunWeights(k, first, slope))
    assert isinstance(got, MemoryUsage)
    for name, want in [*sums.items(), ("unshared", allocated)]:
        assert math.isclose(getattr(got, name), want, rel_tol=1e-9, abs_tol=1e-9), name
    # and both end in the same state
    alloc.check()
    assert alloc.usage() == stepped.usage()
    assert alloc.resident_kv() == stepped.resident_kv()
    for s in [*alloc._base, *alloc._swapped]:
        assert alloc.kv_len(s) == stepped.kv_len(s)


@pytest.mark.parametrize(("placement", "reservation"), LOCKSTEP_CASES)
@settings(max_examples=40, deadline=None)
@given(limit=st.integers(-2, 80), data=st.data())
def test_max_advance_all_is_the_longest_run_of_lockstep_appends(
    placement, reservation, limit, data
):
    alloc = random_state(data, placement, reservation)
    brute = copy.deepcopy(alloc)
    k = 0
    while k < limit and lockstep_append_within_targets(brute):
        k += 1
    assert alloc.max_advance_all(limit) == k
    alloc.check()


def test_advance_all_beyond_max_advance_all_is_refused():
    alloc = ContiguousAllocator(64, "first_fit", "oracle", 64)
    alloc.admit([0], 3, 6)
    assert alloc.max_advance_all(10) == 3
    before = alloc.usage()
    with pytest.raises(ValueError, match="at most 3"):
        alloc.advance_all(RunWeights(4, 1.0, 0.0))
    assert alloc.usage() == before and alloc.kv_len(0) == 3


def test_lockstep_with_nothing_running():
    alloc = ContiguousAllocator(64, "buddy", "max", 32)
    assert alloc.try_append_all()
    assert alloc.max_advance_all(7) == 7 and alloc.max_advance_all(-1) == 0
    got = alloc.advance_all(RunWeights(3, 2.0, 1.0))  # 2 + 3 + 4 = 9 seconds
    assert (got.capacity, got.free, got.token_states, got.unshared) == (64 * 9, 64 * 9, 0, 0)
    assert alloc.resident_kv() == (0, 0)


def test_resident_kv_follows_the_clock_and_new_arrivals():
    alloc = ContiguousAllocator(256, "first_fit", "oracle", 256, swap_capacity_slots=20)
    alloc.admit([0], 10, 40)
    alloc.advance_all(RunWeights(5, 1.0, 0.0))
    alloc.admit([1], 7, 20)  # arrives after the clock moved
    assert alloc.resident_kv() == (2, 15 + 7)
    assert alloc.try_append_all()
    assert (alloc.kv_len(0), alloc.kv_len(1)) == (16, 8)
    alloc.fork(1, 2, 30)
    assert alloc.kv_len(2) == 8
    alloc.copy_into(1, 2)
    assert alloc.copied_blocks == 16  # the fork's 8 and the copy's 8
    alloc.swap_out([0])
    assert alloc.swap_used_slots == 16 and alloc.resident_kv() == (2, 16)
    alloc.advance_all(RunWeights(3, 1.0, 0.0))
    alloc.swap_in([0])
    assert alloc.resident_kv() == (3, 16 + 11 + 11)
    assert alloc.try_append_all()
    assert [alloc.kv_len(s) for s in (0, 1, 2)] == [17, 12, 12]
    alloc.check()


def test_try_append_all_within_targets_never_takes_the_per_sequence_path(monkeypatch):
    alloc = ContiguousAllocator.from_preset("orca-pow2", 16_384, 512)
    # final_len 100..127; pow2 reserves prompt + 128 (91 outputs rounded up): regions of 256
    for seq in range(28):
        alloc.admit([seq], 10 + seq, 100 + seq)
    assert alloc.max_advance_all(1000) == 90  # sequence 0: 100 - 10

    def per_sequence(seq_ids):
        raise AssertionError("lockstep append took the per-sequence path")

    monkeypatch.setattr(alloc, "try_append", per_sequence)
    for _ in range(90):
        assert alloc.try_append_all()
    assert alloc.kv_len(0) == 100 and alloc.kv_len(27) == 127
    monkeypatch.undo()
    assert alloc.try_append_all()  # sequence 0 outgrows its final_len: the per-sequence path
    u = alloc.usage()
    assert alloc.kv_len(0) == 101 and u.token_states == sum(range(10, 38)) + 28 * 91
    assert u.reserved == 0 and u.internal_frag + u.allocator_frag == 28 * 256 - u.token_states
    assert u.internal_frag == 28 * 37  # each reserved prompt + 128 and holds 101 + seq tokens: 37 unused
    alloc.check()


@pytest.mark.parametrize(("placement", "reservation"), LOCKSTEP_CASES)
def test_try_append_all_changes_nothing_when_a_region_is_full(placement, reservation):
    alloc = ContiguousAllocator(512, placement, reservation, 64)
    alloc.admit([0], 5, 9)
    alloc.admit([1], 3, 20)
    region = alloc.region(0)[1]
    while alloc.kv_len(0) < region:  # fill sequence 0's region, past its final_len
        assert alloc.try_append([0])
    assert not alloc.try_append([0])
    before = alloc.usage()
    lengths = (alloc.kv_len(0), alloc.kv_len(1))
    assert not alloc.try_append_all()
    assert alloc.usage() == before
    assert (alloc.kv_len(0), alloc.kv_len(1)) == lengths == (region, 3)
    assert alloc.resident_kv() == (2, region + 3) and alloc.max_advance_all(5) == 0
    alloc.check()
    alloc.free(0)  # the full region leaves: the rest grows again
    assert alloc.try_append_all() and alloc.kv_len(1) == 4
