"""The seven memory classes of DESIGN.md ("Memory accounting"), worked out by hand.

Each step's row holds the classes at the step (after its appends), weighted by the
step's duration; with the fake cost model every step lasts 1 s, so a class's
slot-seconds are the sum of its per-step values and can be counted on paper.
"""

import pytest

from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.traces import Request


def slot_seconds(steps, column):
    """A class's integral over the run (slot-seconds)."""
    return float((steps[column] * steps["duration_s"]).sum())


def three_requests(c_prompt):
    """A finishes at once and leaves a hole; B runs on; C waits for space."""
    return [
        Request(0, 0.0, 3, 1),  # A: final length 3
        Request(1, 0.0, 3, 6),  # B: final length 3 + 6 - 1 = 8
        Request(2, 0.0, c_prompt, 1),  # C: final length = its prompt
    ]


@pytest.mark.parametrize("macro_steps", [True, False])
def test_external_fragmentation_is_positive_when_no_hole_fits(tiny, contiguous, macro_steps):
    # first_fit, oracle reservation (region = final length), capacity 14 slots:
    #   t=0  A -> [0,3), B -> [3,11); free [11,14) = 3 < C's 5: C waits, NO_SPACE (stranded).
    #        step 1 [0,1]: prefill A and B. A's one token is its last: A ends at 1.
    #   t=1  free [0,3) + [11,14) = 6 >= 5 but the largest hole is 3: C is FRAGMENTED.
    #        B decodes t=1..6 (kv 4,5,6,7,8), ends at 6 with 6 tokens; C waits all along.
    #   t=6  all free: C -> [0,5), prefill [6,7], ends at 7. Nothing waits: idle 14 - 5 = 9.
    # Slot-seconds (each step 1 s):
    #   external_frag = 6 x 5 = 30      stranded_free = 3 x 1 = 3     idle_free = 9 x 1 = 9
    #   token_states  = (3+3) + (4+5+6+7+8) + 5 = 41
    #   reserved      = (8-3) + (4+3+2+1+0) + 0 = 15      internal_frag = 0
    #   total = 98 = 14 slots x 7 s
    out = tiny(three_requests(5), contiguous(14, "first_fit", "oracle"), macro_steps=macro_steps)
    r, steps = out.requests, out.steps
    assert list(r["finish_s"]) == [1.0, 6.0, 7.0]
    assert r.loc[2, "scheduled_s"] == 6.0
    expected = {"token_states": 41, "reserved": 15, "internal_frag": 0, "allocator_frag": 0, "external_frag": 30,
                "stranded_free": 3, "idle_free": 9}
    for c in CLASSES:
        assert slot_seconds(steps, c) == pytest.approx(expected[c], abs=1e-9), c
    assert out.summary["mem_external_frag_perc"] == pytest.approx(30 / 98 * 100)
    assert out.summary["mem_stranded_free_perc"] == pytest.approx(3 / 98 * 100)


def test_free_space_too_small_is_stranded_not_external(tiny, contiguous):
    # Same, but C needs 7 slots: the 6 free slots at t=1 are too few in total, so
    # they are stranded (the paper's "& others"), never external fragmentation.
    #   stranded = 3 x 1 (step 1) + 6 x 5 (B's decodes) = 33; C starts at 6, idle 14 - 7 = 7.
    out = tiny(three_requests(7), contiguous(14, "first_fit", "oracle"))
    steps = out.steps
    assert (steps["external_frag"] == 0).all()
    assert slot_seconds(steps, "stranded_free") == pytest.approx(33)
    assert slot_seconds(steps, "idle_free") == pytest.approx(7)
    assert out.summary["mem_external_frag_perc"] == 0.0


def test_paged_allocation_has_no_external_fragmentation(tiny, paged):
    # Paged, block size 1, 8 blocks; C's prompt is 6 tokens:
    #   t=0  A (3) and B (3) admitted, free 2 < 6: C waits (stranded 2). A ends at 1 (free 5).
    #   t=1..6  B decodes (kv 4..8): free 4,3,2,1,0, all stranded (any free block serves).
    #   t=6  C admitted (6 blocks), ends at 7: idle 2.
    #   stranded = 2 + (4+3+2+1+0) = 12; idle = 2; token_states = 6 + (4+5+6+7+8) + 6 = 42
    out = tiny(three_requests(6), paged(8, 1))
    steps = out.steps
    assert (steps["waiting"] > 0).any()
    assert (steps["external_frag"] == 0).all()
    assert slot_seconds(steps, "stranded_free") == pytest.approx(12)
    assert slot_seconds(steps, "idle_free") == pytest.approx(2)
    assert slot_seconds(steps, "token_states") == pytest.approx(42)


def test_paged_internal_fragmentation_is_the_unused_tail_of_the_last_block(tiny, paged):
    # One request, prompt 3, output 3 (final length 5), block size 4, 4 blocks (16 slots):
    #   step 1 [0,1] prefill: 1 block, 3 tokens; slot 4 will hold its own token: reserved 1.
    #   step 2 [1,2] kv 4: block full, reserved 0.
    #   step 3 [2,3] kv 5: a second block; slots 6..8 are past the final length: internal 3.
    #   token_states = 3+4+5 = 12, reserved 1, internal_frag 3, idle = 12+12+8 = 32 (sum 48 = 16 x 3)
    out = tiny([Request(0, 0.0, 3, 3)], paged(4, 4))
    steps = out.steps
    expected = {"token_states": 12, "reserved": 1, "internal_frag": 3, "allocator_frag": 0, "external_frag": 0,
                "stranded_free": 0, "idle_free": 32}
    for c in CLASSES:
        assert slot_seconds(steps, c) == pytest.approx(expected[c], abs=1e-9), c
    assert out.requests.loc[0, "finish_s"] == 3.0


def test_pow2_over_reserves_and_the_buddy_rounds_the_reservation_up(tiny, contiguous):
    # Same request on a buddy allocator with pow2 reservation: final length 5; pow2 asks for
    # the prompt + its 3 output tokens rounded up to 4 = 7 slots, and the buddy places that in
    # a power of two: 8 slots.
    #   internal_frag = 7 - 5 = 2 at each of 3 steps = 6 (the reservation policy's waste)
    #   allocator_frag = 8 - 7 = 1 at each of 3 steps = 3 (the buddy's rounding)
    #   reserved = (5-3) + (5-4) + (5-5) = 3; token_states = 3+4+5 = 12; idle = 8 x 3 = 24
    out = tiny([Request(0, 0.0, 3, 3)], contiguous(16, "buddy", "pow2"))
    steps = out.steps
    expected = {"token_states": 12, "reserved": 3, "internal_frag": 6, "allocator_frag": 3, "external_frag": 0,
                "stranded_free": 0, "idle_free": 24}
    for c in CLASSES:
        assert slot_seconds(steps, c) == pytest.approx(expected[c], abs=1e-9), c
    assert out.summary["kv_cache_usage_perc"] == pytest.approx((12 + 3 + 6 + 3) / 48 * 100)
    assert out.summary["mem_allocator_frag_perc"] == pytest.approx(3 / 48 * 100)
