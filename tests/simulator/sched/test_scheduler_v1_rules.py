"""Rules of the vllm-v1 scheduler (``simulator/sched/vllm_v1.py``) that its other tests leave
open, written for the survivors of its mutation campaign (mutation/README.md).

- When a run of decode steps may be advanced at once (``run_length``): only while the head
  of the waiting queue is certain to stay blocked, judged with the token budget the running
  requests leave and the fewest blocks any shorter prefix hit could need.
- What the cache tiers are told about each block: its chain parent (the block before it in
  the request that named it), for write-through stores, after-hits stores and the blocks a
  load brings back (which a write-back tier stores when the GPU evicts them again).

Blocks of 4 tokens throughout.
"""

from __future__ import annotations

import random

import pytest

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator, block_identities
from kvsim.policies.tiers.cache_tier import CacheTier
from kvsim.policies.tiers.tier_stack import Level, TierLink, TierStack
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.simulator.sched.sequence import Status
from kvsim.simulator.sched.vllm_v1 import SchedulerV1
from kvsim.traces import Request

B = 4


def ids(groups) -> list[int]:
    return [g.request.request_id for g in groups]


def blocked_head(budget: int, max_num_seqs: int = 256, gpu_blocks: int = 8, reserve_full_isl: bool = False,
                 threshold: int = 0, h_prompt: int = 28, h_prefix: bool = True):
    """An 8-block GPU (32 slots; or ``gpu_blocks``). P (prompt 13, its first 12 tokens the shared prefix p0,
    output 1) runs first (chunked by the budget) and finishes: its 3 full blocks stay
    cached and free, its 4th (1 token) is freed uncached. Then four decoders D1..D4 (prompt
    1, output 20) are admitted together: each takes one never-used block (4 left free: P's
    3 cached blocks and its uncached one; on 7 blocks the uncached one goes too: 3 free). Then H (prompt 28 with prefix p0, output 1;
    ``reserve_full_isl`` off) arrives while the four decode. Returns the scheduler and the
    step in which H was refused (scheduled, not completed)."""
    alloc = V1PrefixCacheAllocator(gpu_blocks, B)
    s = SchedulerV1(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                             max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                             reserve_full_isl=reserve_full_isl,
                                             long_prefill_token_threshold=threshold), lambda g: None)
    s.add(Request(0, 0.0, 13, 1, prefix_id="p0", prefix_tokens=12), 0.0)
    t = 0
    while s.has_work:
        s.complete(s.schedule(float(t)), float(t + 1))
        t += 1
    for i in range(1, 5):
        s.add(Request(i, float(t), 1, 20), float(t))
    x = s.schedule(float(t))
    assert ids(x.prefill) == [1, 2, 3, 4] and alloc.num_free_blocks == gpu_blocks - 4
    s.complete(x, float(t + 1))
    t += 1
    h = Request(5, float(t), h_prompt, 1, prefix_id="p0", prefix_tokens=12) if h_prefix else \
        Request(5, float(t), h_prompt, 1)
    s.add(h, float(t))
    x = s.schedule(float(t))
    assert ids(x.decode) == [1, 2, 3, 4] and not x.prefill
    return s, x


def test_no_run_while_a_shorter_hit_could_let_the_head_in():
    """Budget 16: the decoders take 4 tokens, 12 are left. H hits P's 3 cached blocks (12
    tokens) and would compute 12 more: blocks_for(24) = 6 blocks, 4 free: refused (no space).
    Its hit may only shrink while the decoders take blocks (they evict cached ones); with no
    hit it would need blocks_for(min(28, 12)) = 3 <= 4 free blocks. So the scheduler cannot be
    sure H stays blocked: no run of decode steps (``run_length`` 0). (Judging with the budget
    16 + 4 instead of 16 - 4 needs blocks_for(20) = 5 > 4 and claims a run of 6 steps.)"""
    s, x = blocked_head(16)
    assert s.blocked is not None and s.blocked != "limits"
    assert s.run_length(x, 10) == 0


def test_a_run_when_the_batch_is_full():
    """The same, with max_num_seqs 4: H is refused by the limit, which holds while the four
    decode, so the decode steps run at once: after this step's (each decoder's KV at 2 of
    its block's 4 slots) come 6 more: KV 3 and 4 fit, 5..8 need a second block each (4, all
    free), 9 would need a third. (Treating the full batch as room for H gives 0.)"""
    s, x = blocked_head(16, max_num_seqs=4)
    assert s.blocked == "limits"
    assert s.run_length(x, 10) == 6
    assert s.run_length(x, 4) == 4


def test_a_run_when_the_decoders_take_the_whole_budget():
    """Budget 4: P is computed in 4 chunks (4, 4, 4, 1 tokens); then the four decoders take
    the whole budget, 0 tokens are left for H: it stays blocked (limits), and the 6 decode
    steps of the test above run at once. (A budget of 0 judged as room gives 0.)"""
    s, x = blocked_head(4)
    assert s.blocked == "limits"
    assert s.run_length(x, 10) == 6


def test_a_run_when_the_whole_sequence_can_never_fit():
    """With ``reserve_full_isl`` H must find blocks for all of its 28 tokens: 7 blocks, more
    than the 4 free, which only shrink while the four decode: the 6 decode steps run at
    once. (Giving up on the judgement whenever a block is free gives 0.)"""
    s, x = blocked_head(16, reserve_full_isl=True)
    assert s.blocked is not None and s.blocked != "limits"
    assert s.run_length(x, 10) == 6


@pytest.mark.parametrize("gpu_blocks, threshold, run", [(8, 0, 6), (10, 0, 6), (8, 8, 0), (7, 8, 0), (7, 12, 0),
                                                        (7, 1, 0)])
def test_the_chunk_cap_a_shorter_hit_would_get(gpu_blocks, threshold, run):
    """Budget 32: the decoders leave 28 tokens, all of H's. H hits P's 3 cached blocks.

    - 8 blocks (4 free), no threshold: H needs blocks_for(28) = 7 whatever its hit (the cap,
      28, covers its whole sequence): blocked, the 6 decode steps run at once.
    - 10 blocks (6 free: P's 4 and 2 never used): 7 > 6, blocked; a run of 6 again (KV 5
      takes 4 blocks, KV 9 would need 4 more, 2 are left).
    - threshold 8 (the cap, as it is under the budget): H's chunk after its hit, 12 + 8
      tokens, needs 5 blocks > 4, but with no hit 8 tokens need 2: no run; on 7 blocks (3
      free) the same, 2 <= 3; threshold 12 on 7 blocks: 3 blocks, exactly the 3 free.
    - threshold 1 on 7 blocks: 12 + 1 tokens need 4 blocks > 3; 1 token with no hit needs 1.
    (A cap of the budget where the threshold is set, or of the threshold where it is 0 or 1,
    and a held count starting at 1, each give another answer in one of these.)"""
    s, x = blocked_head(32, gpu_blocks=gpu_blocks, threshold=threshold)
    assert s.blocked is not None and s.blocked != "limits" and not x.prefill
    assert s.run_length(x, 10) == run


def test_a_run_when_a_head_without_hits_needs_one_block_more_than_is_free():
    """``reserve_full_isl`` and an H of 20 tokens that shares nothing: 5 blocks, 4 free (the
    decoders leave 12 tokens, 3 blocks, so its first chunk alone would fit): blocked for
    good, the 6 decode steps run at once. (Subtracting a held block where there is no hit
    makes 4 <= 4 and no run.)"""
    s, x = blocked_head(16, reserve_full_isl=True, h_prompt=20, h_prefix=False)
    assert s.blocked is not None and s.blocked != "limits" and not x.prefill
    assert s.run_length(x, 10) == 6


def test_a_hit_held_by_a_running_request_costs_no_block_at_any_length():
    """9 blocks. P (prompt 13, its first 12 tokens the prefix p0, output 20) and three
    decoders (prompt 1, output 20) are admitted together and keep running: P holds p0's 3
    blocks and a 4th, the decoders one each: 2 free. H (prompt 28 with p0) hits the 3 held
    blocks (no free block for them) and the 4 running leave 12 tokens: 12 + 12 tokens need 6
    blocks, 3 of them held: 3 > 2, refused. A hit of h held blocks needs blocks_for(4h + 12)
    - h = 3 whatever h: H stays blocked, and the decode steps run at once: 2 (P's KV 15 and
    16 fill its 4th block, the decoders' 3 and 4 theirs). (Counting the held blocks one hit
    block short, h - 1 for h, gives 3 - 1 = 2 <= 2 and no run.)"""
    alloc = V1PrefixCacheAllocator(9, B)
    s = SchedulerV1(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                             max_num_batched_tokens=16, reserve_full_isl=False), lambda g: None)
    s.add(Request(0, 0.0, 13, 20, prefix_id="p0", prefix_tokens=12), 0.0)
    for i in range(1, 4):
        s.add(Request(i, 0.0, 1, 20), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    s.add(Request(5, 1.0, 28, 1, prefix_id="p0", prefix_tokens=12), 1.0)
    x = s.schedule(1.0)
    assert ids(x.decode) == [0, 1, 2, 3] and not x.prefill and alloc.num_free_blocks == 2
    assert s.blocked is not None and s.blocked != "limits"
    assert s.run_length(x, 10) == 2


def test_more_decode_steps_after_a_run_only_when_everyone_decodes():
    """``continue_length`` (after a run's finishes were retired): nothing at all, or a request
    mid-prefill, gives 0. A (prompt 4, output 6) and B (prompt 4, output 10), threshold 2:
    steps 0 and 1 compute their prompts in chunks of 2 (mid-prefill after step 0: no run),
    step 2 decodes both (token 2 each): 4 more identical steps follow it, the last A's
    finish (its tokens 3 to 6). Once step 2 is complete the same 4 steps can continue (a
    run of 2 when the limit is 2, of 1 when it is 1). Step 5 (A's token 5) is followed by one
    more, step 6 by none: A finishes in it."""
    s = SchedulerV1(PagedAllocator(100, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                              long_prefill_token_threshold=2), lambda g: None)
    assert s.continue_length(20) == 0
    s.add(Request(0, 0.0, 4, 6), 0.0)
    s.add(Request(1, 0.0, 4, 10), 0.0)
    x = s.schedule(0.0)
    assert x.chunks == [2, 2]
    s.complete(x, 1.0)
    assert not s.waiting and s.continue_length(20) == 0
    s.complete(s.schedule(1.0), 2.0)
    x = s.schedule(2.0)
    assert ids(x.decode) == [0, 1] and not x.prefill
    assert s.run_length(x, 20) == 4
    assert s.run_length(x, 1) == 1
    s.complete(x, 3.0)
    assert s.continue_length(20) == 4 and s.continue_length(2) == 2 and s.continue_length(1) == 1
    for t in (3, 4):
        s.complete(s.schedule(float(t)), float(t + 1))
    x = s.schedule(5.0)
    assert s.run_length(x, 20) == 1
    s.complete(x, 6.0)
    x = s.schedule(6.0)
    assert ids(x.decode) == [0, 1] and s.run_length(x, 20) == 0


def test_no_run_while_one_token_of_budget_is_left():
    """Budget 5 on 7 blocks: the decoders leave 1 token; H, hitting P's 3 cached blocks (the
    only free ones), needs blocks_for(12 + 1) = 4 > 3: refused. With a shorter hit one token
    needs one block: not certain to stay blocked, no run. (Counting a budget of 1 as none
    gives a run of 2: KV 3 and 4 fit, 5 needs 4 blocks.)"""
    s, x = blocked_head(5, gpu_blocks=7)
    assert s.blocked is not None and s.blocked != "limits"
    assert s.run_length(x, 10) == 0


def test_a_preempted_request_waits_at_the_front_of_the_queue():
    """Recompute preemption (module docstring, 1.): two requests of prompt 4 and output 8 on
    3 blocks, no prefix cache. Step 0 admits both: 4 tokens each, one full block each, 1
    free. At step 1 each needs a second block for its first decode: the first takes the free
    one, the second (the last admitted) finds none and preempts itself: its block freed, back
    to the front of the waiting queue, WAITING again, its 4 computed tokens to redo."""
    s = SchedulerV1(PagedAllocator(3, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1"),
                    lambda g: None)
    a = s.add(Request(0, 0.0, 4, 8), 0.0)
    b = s.add(Request(1, 0.0, 4, 8), 0.0)
    s.add(Request(2, 0.0, 8, 1), 0.0)  # waits behind them: needs 2 blocks, 1 is free
    x = s.schedule(0.0)
    assert ids(x.prefill) == [0, 1] and s.blocked is not None
    s.complete(x, 1.0)
    x = s.schedule(1.0)
    assert x.preempted_recompute == 1 and ids(x.decode) == [0]
    assert ids(s.waiting) == [1, 2] and s.running == [a] and s.blocked == "preempted"
    assert b.status is Status.WAITING and a.status is Status.RUNNING
    assert (b.preemptions, b.recomputed_tokens, s.alloc.num_free_blocks) == (1, 4, 1)
    assert s.run_length(x, 10) == 0  # a step that preempted is followed step by step


def test_the_last_running_request_is_reached_with_one_token_of_budget():
    """Budget 2, 3 blocks: A and B (prompt 1, output 8) take one block each and decode a
    token a step. At step 4 both need a second block and one is free: request by request,
    A takes it (1 token of budget left), then B, reached with that last token, finds none
    and preempts itself (the running list is walked to its end)."""
    s = SchedulerV1(PagedAllocator(3, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                            max_num_batched_tokens=2), lambda g: None)
    s.add(Request(0, 0.0, 1, 8), 0.0)
    s.add(Request(1, 0.0, 1, 8), 0.0)
    for t in range(4):
        x = s.schedule(float(t))
        assert not x.preempted
        s.complete(x, float(t + 1))
    x = s.schedule(4.0)
    assert ids(x.decode) == [0] and x.preempted_recompute == 1 and ids(s.waiting) == [1]
    assert x.shape.decode_context == 5


def test_a_threshold_of_one_token_holds_every_step():
    """``long_prefill_token_threshold`` 1: a prompt of 3 is computed a token a step, also
    once it runs (the request-by-request and the lockstep paths), while a second request
    decodes beside it."""
    s = SchedulerV1(PagedAllocator(100, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                              long_prefill_token_threshold=1), lambda g: None)
    s.add(Request(0, 0.0, 1, 10), 0.0)
    s.add(Request(1, 0.0, 3, 1), 0.0)
    seen = []
    for t in range(4):
        x = s.schedule(float(t))
        assert s.blocked is None  # nothing waits (both admitted at step 0)
        seen.append((ids(x.prefill), x.chunks, ids(x.decode)))
        s.complete(x, float(t + 1))
    assert seen == [([0, 1], [1, 1], []), ([1], [1], [0]), ([1], [1], [0]), ([], [], [0])]


def test_a_threshold_of_one_token_holds_when_memory_runs_short():
    """The same cap on the request-by-request path (taken when the blocks do not all fit):
    3 blocks, threshold 1, no full-sequence reserve. A (prompt 8) computes a token a step,
    B (prompt 1, output 8) decodes beside it; each holds one block, 1 is free. At step 4 both
    reach their 5th token and need a second block: A, first, takes its 1 token (and the free
    block), B finds none and preempts itself."""
    s = SchedulerV1(PagedAllocator(3, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                            long_prefill_token_threshold=1, reserve_full_isl=False),
                    lambda g: None)
    s.add(Request(0, 0.0, 8, 1), 0.0)
    s.add(Request(1, 0.0, 1, 8), 0.0)
    for t in range(4):
        x = s.schedule(float(t))
        assert not x.preempted and x.chunks == [1] * len(x.prefill)
        s.complete(x, float(t + 1))
    x = s.schedule(4.0)
    assert (ids(x.prefill), x.chunks, ids(x.decode), x.preempted_recompute) == ([0], [1], [], 1)


def test_a_recomputed_head_needs_blocks_for_its_generated_tokens_too():
    """The scenario above, one step on: B (prompt 4, 1 token generated before its preemption)
    is the head; with ``reserve_full_isl`` it needs blocks for its 4 + 1 = 5 tokens, 2 blocks,
    and 1 is free: blocked while A decodes alone, so A's 5 remaining steps run at once (its
    tokens 4..8 at KV 7..11; the third block it needs at KV 9 is the free one). (Counting 4 - 1
    = 3 tokens, one block, the head could get in: no run.)"""
    s = SchedulerV1(PagedAllocator(3, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1"),
                    lambda g: None)
    s.add(Request(0, 0.0, 4, 8), 0.0)
    b = s.add(Request(1, 0.0, 4, 8), 0.0)
    for t in range(2):
        s.complete(s.schedule(float(t)), float(t + 1))
    x = s.schedule(2.0)
    assert ids(x.decode) == [0] and not x.preempted and s.blocked is not None and s.waiting[0] is b
    assert s.alloc.num_free_blocks == 1
    assert s.run_length(x, 20) == 5


def test_a_second_partial_prefill_is_held_back_by_the_limits():
    """Threshold 8, at most 1 request left mid-prefill: A (prompt 20) takes 8 and is left
    mid-prefill; B (prompt 20) would be left so too: it waits, blocked by the limits. With
    at most 2, the third waits."""
    s = SchedulerV1(PagedAllocator(100, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                              long_prefill_token_threshold=8,
                                                              max_num_partial_prefills=1), lambda g: None)
    s.add(Request(0, 0.0, 20, 1), 0.0)
    s.add(Request(1, 0.0, 20, 1), 0.0)
    x = s.schedule(0.0)
    assert (ids(x.prefill), x.chunks, ids(s.waiting), s.blocked) == ([0], [8], [1], "limits")
    # at most 2: A and B are left mid-prefill, C would be the third
    s = SchedulerV1(PagedAllocator(100, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1",
                                                              long_prefill_token_threshold=8,
                                                              max_num_partial_prefills=2), lambda g: None)
    for i in range(3):
        s.add(Request(i, 0.0, 20, 1), 0.0)
    x = s.schedule(0.0)
    assert (ids(x.prefill), x.chunks, ids(s.waiting), s.blocked) == ([0, 1], [8, 8], [2], "limits")


def test_a_load_that_finds_no_room_stops_admission_for_space():
    """3 GPU blocks; R (prompt 7, output 2) runs and holds 2, 1 is free. H's prefix p0 (8
    tokens, 2 blocks) is in a CPU tier, ready: H (prompt 9) would load 2 blocks into 1 free
    block: it waits, blocked for space (not for the batch limits), and nothing loads."""
    tiers = TierStack([Level(CacheTier("t0", 10, "lru"), TierLink(1000.0, 1.0), "write-through", 0)], B, 100.0)
    s = SchedulerV1(V1PrefixCacheAllocator(3, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1"),
                    lambda g: None, tiers)
    s.add(Request(0, 0.0, 7, 2), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    h = s.add(Request(1, 1.0, 9, 1, prefix_id="p0", prefix_tokens=8), 1.0)
    keys = list(h.prefix)
    tiers.levels[0].tier.store(keys, [None, keys[0]], 0.0, [0, 0])
    x = s.schedule(1.0)
    assert ids(x.decode) == [0] and not x.prefill and not s.loading
    assert list(s.waiting) == [h] and s.blocked is Admission.NO_SPACE


def test_a_loaded_request_counts_its_lookups_again_when_it_is_readmitted():
    """A request's lookup and hits are counted when its load starts, not again at the
    admission the load leads to; but once admitted it is an ordinary request: preempted and
    admitted again, that admission counts its (T - 1) // 4 lookups and its hit blocks.
    7 GPU blocks, a CPU tier written through: r0 computes prefix p0 (16 tokens), r1 (prefix
    p1) evicts part of it, r3 (1 token, 16 out) runs on, r2 (13 tokens with p0, 8 out) loads
    what it lacks from the tier, is admitted, then preempted by memory pressure and admitted
    again (each step checked)."""
    tiers = TierStack([Level(CacheTier("t0", 100, "lru"), TierLink(1000.0, 1.0), "write-through", 0)], B, 1000.0)
    s = SchedulerV1(V1PrefixCacheAllocator(7, B), SchedulerSettings(
        max_seq_len=1024, watermark=0, policy="vllm-v1", max_num_batched_tokens=64, reserve_full_isl=False),
        lambda g: None, tiers)
    pending = [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
               Request(1, 5.0, 17, 1, prefix_id="p1", prefix_tokens=16),
               Request(3, 9.0, 1, 16), Request(2, 10.0, 13, 8, prefix_id="p0", prefix_tokens=12)]
    groups, readmitted = {}, 0
    for t in range(200):
        s.finish_loads(float(t))
        for r in [r for r in pending if r.arrival_time <= t]:
            groups[r.request_id] = s.add(r, float(t))
            pending.remove(r)
        g2 = groups.get(2)
        before = (g2 is not None and g2.status.name == "WAITING" and g2.preemptions == 1,
                  s.alloc.prefix_lookups, s.alloc.prefix_hits)
        x = s.schedule(float(t))
        if before[0] and g2 in x.prefill:  # the admission after its preemption
            readmitted += 1
            assert s.alloc.prefix_lookups - before[1] == (g2.prompt_len - 1) // B
            assert s.alloc.prefix_hits - before[2] == g2.cached_tokens // B > 0
        if not x.empty:
            s.complete(x, float(t + 1))
        if not pending and not s.has_work:
            break
    assert readmitted == 1 and groups[2].loaded_tokens == 8 and groups[2].status.name == "FINISHED"


def test_construction_errors_word_for_word():
    """vllm-v1 runs on the paged allocator only, with vLLM v1's prefix cache when caching,
    and cache tiers need that cache."""
    limits = SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1")
    tiers = TierStack([Level(CacheTier("t0", 10, "lru"), TierLink(1000.0, 1.0), "write-through", 0)], B, 100.0)
    for alloc, tier, message in (
            (ContiguousAllocator(64, "first_fit", "max", 32), None,
             "scheduler policy vllm-v1 needs the paged allocator (allocator.kind: paged)"),
            (PagedAllocator(16, B, prefix_caching=True), None,
             "scheduler policy vllm-v1 needs vLLM v1's prefix cache (V1PrefixCacheAllocator)"),
            (PagedAllocator(16, B), tiers,
             "cache tiers need the v1 prefix cache (allocator.prefix_caching: true)")):
        with pytest.raises(ValueError) as e:
            SchedulerV1(alloc, limits, lambda g: None, tier)
        assert str(e.value) == message


def test_sequences_are_numbered_in_arrival_order_and_nothing_blocks_at_first():
    """One sequence per request, numbered 0, 1, 2, ... as requests arrive (a rejected one
    takes its number too); before any step nothing waits, so nothing is blocked."""
    s = SchedulerV1(PagedAllocator(4, B), SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1"),
                    lambda g: None)
    assert s.blocked is None and s.now == 0.0
    groups = [s.add(Request(i, 0.0, p, 1), 0.0) for i, p in enumerate((4, 100, 4))]  # 100 tokens: too big
    assert [g.seq_ids for g in groups] == [[0], [1], [2]] and groups[1].status is Status.REJECTED


# --- what the tiers are told: each block's chain parent -------------------------------------------


def run_with_tiers(seed: int, top_write: str) -> list[tuple[object, object, object]]:
    """Fourteen requests drawn from ``seed`` (arrivals 0..20 s, prompts 9..32 tokens whose
    first 8 are one of three shared prefixes, outputs 1..10, priorities 0..2) on a 12-block
    GPU, budget 16 tokens a step (prompts are chunked, decoders are preempted and recomputed),
    over two tiers: t0 (6 blocks, ``top_write``, N = 1, leaf-only ``priority`` eviction,
    which keeps parents) above t1 (40 blocks, write-back). Returns every (key, parent the
    tier holds, the block's true parent) seen in a tier after any step that disagree."""
    rng = random.Random(seed)
    tiers = TierStack([Level(CacheTier("t0", 6, "priority"), TierLink(1000.0, 1.0), top_write, 1),
                       Level(CacheTier("t1", 40, "lru"), TierLink(1000.0, 1.0), "write-back", 0)], B, 100.0)
    s = SchedulerV1(V1PrefixCacheAllocator(12, B), SchedulerSettings(
        max_seq_len=1024, watermark=0, policy="vllm-v1", max_num_batched_tokens=16), lambda g: None, tiers)
    pending = [Request(i, float(rng.randint(0, 20)), rng.randint(1, 24) + 8, rng.randint(1, 10),
                       prefix_id=f"p{rng.randint(0, 2)}", prefix_tokens=8, priority=rng.randint(0, 2))
               for i in range(14)]
    groups, seen = {}, set()
    for t in range(400):
        s.finish_loads(float(t))
        for r in [r for r in pending if r.arrival_time <= t]:
            groups[r.request_id] = s.add(r, float(t))
            pending.remove(r)
        x = s.schedule(float(t))
        if not x.empty:
            s.complete(x, float(t + 1))
        for level in tiers.levels:
            seen.update((key, parent) for key, (parent, _) in level.tier.meta.items())
        if not pending and not s.has_work:
            break
    assert not pending and not s.has_work
    true_parent = {}
    for rid, g in groups.items():
        r = g.request
        keys = list(block_identities(g.prefix, rid, 0, (r.prompt_tokens + r.output_tokens) // B + 1))
        true_parent.update((k, keys[i - 1] if i else None) for i, k in enumerate(keys))
    return [(k, p, true_parent.get(k, "?")) for k, p in seen if true_parent.get(k, "?") != p]


@pytest.mark.parametrize("seed, top_write", [(7, "write-back"), (0, "write-through-after-hits"),
                                             (0, "write-through")])
def test_every_tier_entry_names_its_blocks_true_parent(seed, top_write):
    """The rule, checked on every entry of every tier after every step: a block's parent is
    the identity of the block before it in its request (None for the first), whether the
    block reached the tier by a write-through store of a prefill chunk (a chunk's first block
    after the request's own blocks has an own-identity parent), an after-hits store of a
    GPU hit, or a write-back of a block a load had brought back (its parent is the block
    before the load's first, a GPU hit of the request's own or shared blocks). The three
    cases were drawn to cover each path (loads with a hit under write-back, hits of a
    recomputed request's own blocks under after-hits)."""
    assert run_with_tiers(seed, top_write) == []
