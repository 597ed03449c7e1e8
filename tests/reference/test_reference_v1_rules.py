"""vLLM v1's rules in the reference engine, on tiny cases worked out on paper.

Each case lists, in its docstring, the chunks every step schedules (request: tokens), who is
preempted, when tokens are sampled and which cached blocks are hit or evicted, derived by
hand from the rules (``simulator.reference.vllm.ReferenceV1Replica``,
``policies.reference.paged.ReferenceFreeQueueAllocator``). The test checks the reference
against that derivation, then checks that the fast engine agrees with the reference.

Notation: B is the block size; "end of step k" is the time step k's computation ends (its
start plus its duration in the step table), when its sampled tokens exist.
"""

from __future__ import annotations

import pytest
from ref_cases import base_config
from ref_compare import assert_same

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference.simulation import simulate
from kvsim.simulator.reference.vllm import ReferenceV1Replica
from kvsim.traces import Request


def v1_config(max_len: int, kv_slots: int, block_size: int, budget: int, **scheduler) -> dict:
    cfg = base_config(max_len, kv_slots, 0)
    cfg["allocator"] = {"kind": "paged", "block_size": block_size}
    cfg["scheduler"] = {
        "policy": "vllm-v1",
        "max_num_seqs": 4,
        "max_num_batched_tokens": budget,
        **scheduler,
    }
    return cfg


def run(config: dict, requests: list[Request], monkeypatch):
    """The reference's result, and each step's chunks as [(request id, tokens), ...] with
    the ids of the requests it preempted."""
    chunks, preempted = [], []
    schedule, preempt = ReferenceV1Replica.schedule, ReferenceV1Replica.preempt

    def traced_schedule(self, now):
        preempted.append([])
        step = schedule(self, now)
        if step.chunks:
            chunks.append([(g.request.request_id, n) for g, n in step.chunks])
        elif not step.preempted:
            preempted.pop()  # the engine found nothing to run: not a step
        return step

    def traced_preempt(self, g, step):
        preempted[-1].append(g.request.request_id)
        preempt(self, g, step)

    monkeypatch.setattr(ReferenceV1Replica, "schedule", traced_schedule)
    monkeypatch.setattr(ReferenceV1Replica, "preempt", traced_preempt)
    result = simulate(ExperimentConfig.model_validate(config), requests)
    monkeypatch.undo()
    return result, chunks, preempted


def step_ends(result) -> list[float]:
    steps = result.steps
    return (steps["start_s"] + steps["duration_s"]).tolist()


def test_a_long_prompt_is_chunked_and_mixed_with_a_short_one(monkeypatch):
    """Budget 8 tokens, B = 4, ample memory. r0: 10-token prompt, 3 output tokens; r1: 5-token
    prompt, 2 output tokens; both at t = 0.

    step 0: running none; r0 gets min(10, 8) = 8 (budget 0)         -> [r0: 8]
    step 1: r0 gets its last 2 (budget 6); r1 gets all its 5        -> [r0: 2, r1: 5]
            both catch up with their tokens: both sample their first (TTFT = end of step 1)
    step 2: both decode one token                                   -> [r0: 1, r1: 1]
            r1 has its 2 tokens: finishes at the end of step 2
    step 3: r0 decodes its third                                     -> [r0: 1]
    Step 1 is one mixed prefill step of 7 tokens whose attention pairs are
    2 x 8 + 2 x 3 / 2 (r0's chunk after 8 computed) + 5 x 6 / 2 (r1) = 34.
    """
    config = v1_config(128, 256, 4, 8)
    requests = [Request(0, 0.0, 10, 3), Request(1, 0.0, 5, 2)]
    pairs = []
    schedule = ReferenceV1Replica.schedule

    def shape_spy(self, now):
        step = schedule(self, now)
        pairs.append(step.shape().prefill_attn_pairs)
        return step

    monkeypatch.setattr(ReferenceV1Replica, "schedule", shape_spy)
    result, chunks, _ = run(config, requests, monkeypatch)
    assert chunks == [[(0, 8)], [(0, 2), (1, 5)], [(0, 1), (1, 1)], [(0, 1)]]
    assert pairs[:2] == [8 * 9 / 2, 34.0]
    steps, ends = result.steps, step_ends(result)
    assert steps["prefill_tokens"].tolist() == [8, 7, 0, 0]
    assert steps["decode_tokens"].tolist() == [0, 0, 2, 1]
    r = result.requests.set_index("request_id")
    assert r.loc[0, "first_token_s"] == r.loc[1, "first_token_s"] == ends[1]
    assert (r.loc[1, "finish_s"], r.loc[0, "finish_s"]) == (ends[2], ends[3])
    assert_same(config, requests)


@pytest.mark.parametrize("limit", [None, 1])
def test_long_prefill_threshold_and_partial_prefill_limit(monkeypatch, limit):
    """Budget 100, long_prefill_token_threshold 4, B = 4. r0: 10-token prompt, r1: 6-token
    prompt, one output token each, both at t = 0.

    No partial-prefill limit: every request gets at most 4 tokens a step.
      step 0: [r0: 4, r1: 4]; step 1: [r0: 4, r1: 2] (r1 samples, finishes); step 2: [r0: 2].
    max_num_partial_prefills 1: r1 would be left mid-prefill (4 < 6) while r0 already is.
      step 0: [r0: 4]        r1 held back (r0 is mid-prefill after this step)
      step 1: [r0: 4]        the same (r0 at 8 of 10)
      step 2: [r0: 2, r1: 4] r0 completes this step, so r1 may be the one partial prefill
      step 3: [r1: 2]        r1 samples and finishes at the end of step 3.
    """
    config = v1_config(128, 256, 4, 100, long_prefill_token_threshold=4)
    config["scheduler"]["max_num_partial_prefills"] = limit
    requests = [Request(0, 0.0, 10, 1), Request(1, 0.0, 6, 1)]
    result, chunks, _ = run(config, requests, monkeypatch)
    ends = step_ends(result)
    r = result.requests.set_index("request_id")
    if limit is None:
        assert chunks == [[(0, 4), (1, 4)], [(0, 4), (1, 2)], [(0, 2)]]
        assert (r.loc[1, "finish_s"], r.loc[0, "finish_s"]) == (ends[1], ends[2])
    else:
        assert chunks == [[(0, 4)], [(0, 4)], [(0, 2), (1, 4)], [(1, 2)]]
        assert r.loc[1, "scheduled_s"] == result.steps["start_s"].iloc[2]
        assert (r.loc[0, "finish_s"], r.loc[1, "finish_s"]) == (ends[2], ends[3])
    assert_same(config, requests)


def test_the_last_admitted_request_is_preempted_and_recomputed_in_one_chunk(monkeypatch):
    """16 slots in 4 blocks of B = 4, budget 16. r0 and r1: 4-token prompts, 6 output tokens
    each, at t = 0 (each finally stores 4 + 6 - 1 = 9 tokens: 3 blocks; both cannot).

    step 0: [r0: 4, r1: 4]      one block each; both sample (5 tokens each)
    steps 1-4: [r0: 1, r1: 1]   each grows to 2 blocks at step 1 (no block left), then fills them
            after step 4 each has 9 tokens, 8 computed
    step 5: r0 needs a third block for its 9th token, none is free: the most recently
            admitted running request, r1, is preempted (its 8 computed tokens discarded, its
            2 blocks freed, it goes to the front of the queue); r0 then gets a block.
            Nobody is admitted after a preemption.  -> [r0: 1]; r0 has 6 tokens: finishes
    step 6: r1 is admitted again with num_tokens 9 (4 prompt + 5 generated) and computes all
            9 in one chunk (a prefill part, 9 recomputed tokens)  -> [r1: 9]
            it samples its 6th token and finishes at the end of step 6; that token's gap
            (ITL) runs from the end of step 4, when r1 sampled its 5th.
    """
    config = v1_config(16, 16, 4, 16)
    requests = [Request(0, 0.0, 4, 6), Request(1, 0.0, 4, 6)]
    result, chunks, preempted = run(config, requests, monkeypatch)
    assert chunks == [[(0, 4), (1, 4)]] + [[(0, 1), (1, 1)]] * 4 + [[(0, 1)], [(1, 9)]]
    assert preempted == [[], [], [], [], [], [1], []]
    ends = step_ends(result)
    r = result.requests.set_index("request_id")
    assert r["preemptions"].tolist() == [0, 1]
    assert r.loc[1, "recomputed_tokens"] == 8
    assert (r.loc[0, "finish_s"], r.loc[1, "finish_s"]) == (ends[5], ends[6])
    steps = result.steps
    assert steps["recompute_tokens"].tolist() == [0] * 6 + [9]
    assert steps["prefill_tokens"].iloc[6] == 9 and steps["preempted_recompute"].iloc[5] == 1
    # r1's gaps: 4 in steps 1-4 (each one step long), then one from the end of step 4 to 6.
    r1_gaps = sorted(gap for gap, _ in result.itl)[-1]
    assert r1_gaps == pytest.approx(ends[6] - ends[4])
    assert_same(config, requests)


@pytest.mark.parametrize("reserve", [True, False])
def test_reserve_full_isl_waits_for_blocks_for_the_whole_prompt(monkeypatch, reserve):
    """16 slots in 4 blocks of B = 4, budget 4. r0: 8-token prompt, 2 output tokens; r1:
    12-token prompt, 1 output token; both at t = 0.

    step 0: [r0: 4]    step 1: [r0: 4] (r0 samples: 9 tokens, 2 blocks held)
    step 2: r0 decodes and takes a third block (1 free), 3 tokens of budget left for r1:
      reserve_full_isl: r1's whole prompt needs 3 blocks > 1 free: not admitted.
          -> [r0: 1]; r0 finishes and frees its 3 blocks;
             steps 3, 4, 5: [r1: 4] each; r1 is scheduled at the start of step 3.
      without it: r1's first 3 tokens need 1 block = 1 free: admitted.
          -> [r0: 1, r1: 3]; steps 3, 4: [r1: 4]; step 5: [r1: 1]; scheduled at step 2.
    Either way r1 samples its token at the end of step 5.
    """
    config = v1_config(16, 16, 4, 4, reserve_full_isl=reserve)
    requests = [Request(0, 0.0, 8, 2), Request(1, 0.0, 12, 1)]
    result, chunks, _ = run(config, requests, monkeypatch)
    head = [[(0, 4)], [(0, 4)]]
    if reserve:
        assert chunks == head + [[(0, 1)], [(1, 4)], [(1, 4)], [(1, 4)]]
    else:
        assert chunks == head + [[(0, 1), (1, 3)], [(1, 4)], [(1, 4)], [(1, 1)]]
    r = result.requests.set_index("request_id")
    assert r.loc[1, "scheduled_s"] == result.steps["start_s"].iloc[3 if reserve else 2]
    assert r.loc[1, "finish_s"] == step_ends(result)[5]
    assert_same(config, requests)


def test_prefix_hits_capped_and_the_freed_tail_evicted_first(monkeypatch):
    """16 slots in 4 blocks of B = 4, prefix caching; one output token each, requests far
    apart (each ends before the next arrives). Names: p0, p1, p2 = the blocks of the shared
    prefix "p" (12 tokens); the free queue starts [0, 1, 2, 3], head first.

    r0 (t=0): 12 tokens, all prefix p. Looks up (12 - 1) // 4 = 2 blocks: misses. Takes
        blocks 0, 1, 2, which are full after its step: cached as p0, p1, p2. It finishes
        and frees them last block first: queue [3, 2, 1, 0].
    r1 (t=1): 8 tokens of its own. Looks up 1 block: misses. Takes the head: 3 (uncached)
        and 2 (p2: evicted, 1). Its two full blocks get its own names. Freed: [1, 0, 2, 3].
    r2 (t=2): 13 tokens, the first 12 prefix p. Looks up 3 blocks: p0 (block 0) and p1
        (block 1) hit, p2 was evicted: hit = 8 tokens, 5 computed. The hits leave the queue
        ([2, 3]); its 2 fresh blocks are 2 and 3 (r1's: evicted, 2 and 3). Its block 2 holds
        prefix tokens 8-11, full: cached as p2 again. Freed: [3, 2, 1, 0].
    r3 (t=3): 12 tokens, all prefix p: p0, p1, p2 are all cached, but a hit is capped at
        num_tokens - 1 = 11 tokens, i.e. 2 blocks: hit = 8 tokens, 4 computed in block 3
        (the head; uncached: no eviction); the queue is [2]. Freed last block first, its
        blocks 3, 1, 0 join the tail: [2, 3, 1, 0].
    Had a request freed its blocks first to last, r1 would have evicted p0 and r2 hit nothing.
    Lookups 2 + 1 + 3 + 2 = 8, hits 0 + 0 + 2 + 2 = 4, evictions 3.
    """
    config = v1_config(16, 16, 4, 16)
    config["allocator"]["prefix_caching"] = True
    requests = [
        Request(0, 0.0, 12, 1, prefix_id="p", prefix_tokens=12),
        Request(1, 1.0, 8, 1),
        Request(2, 2.0, 13, 1, prefix_id="p", prefix_tokens=12),
        Request(3, 3.0, 12, 1, prefix_id="p", prefix_tokens=12),
    ]
    result, chunks, _ = run(config, requests, monkeypatch)
    assert chunks == [[(0, 12)], [(1, 8)], [(2, 5)], [(3, 4)]]
    assert result.requests["cached_prompt_tokens"].tolist() == [0, 0, 8, 8]
    alloc = result.allocators[0]
    assert (alloc.prefix_lookups, alloc.prefix_hits, alloc.evictions) == (8, 4, 3)
    assert list(alloc.free_queue) == [2, 3, 1, 0]
    assert_same(config, requests)


def test_token_ids_name_blocks_by_their_tokens(monkeypatch):
    """B = 4, prefix caching, one output token each, far apart. Prompts as token ids:
    r0 = 1 2 3 4 | 5 6 7 8 | 9;  r1 = 1 2 3 4 | 5 6 7 0 | 9;  r2 = 1 2 3 4 | 5 6 7 8 | 0 0.
    r1 agrees with r0 on the first block only: hit 4 tokens. r2 agrees on both full blocks
    of r0: hit 8. (A change inside block j changes it and every later block: a chain.)
    """
    config = v1_config(64, 64, 4, 64)
    config["allocator"]["prefix_caching"] = True
    requests = [
        Request(0, 0.0, 9, 1, token_ids=(1, 2, 3, 4, 5, 6, 7, 8, 9)),
        Request(1, 1.0, 9, 1, token_ids=(1, 2, 3, 4, 5, 6, 7, 0, 9)),
        Request(2, 2.0, 10, 1, token_ids=(1, 2, 3, 4, 5, 6, 7, 8, 0, 0)),
    ]
    result, chunks, _ = run(config, requests, monkeypatch)
    assert result.requests["cached_prompt_tokens"].tolist() == [0, 4, 8]
    assert chunks == [[(0, 9)], [(1, 5)], [(2, 2)]]
    assert_same(config, requests)


def test_what_v1_cannot_run_is_rejected_on_arrival():
    """Under v1 a request with 2 samples is rejected (vLLM v1 fans samples out into separate
    requests), and so is one whose final 16 + 2 - 1 = 17 tokens need 5 blocks of 4 where the
    cache of 18 slots has 4 whole blocks (its 18 tokens are within max_seq_len 18); both end
    at their arrival time. The 16 + 1 request stores 16 tokens at most: it runs."""
    config = v1_config(18, 18, 4, 32)
    requests = [Request(0, 0.5, 4, 3, n=2), Request(1, 0.7, 16, 2), Request(2, 0.9, 16, 1)]
    result = simulate(ExperimentConfig.model_validate(config), requests)
    r = result.requests.set_index("request_id")
    assert r["status"].tolist() == ["rejected", "rejected", "finished"]
    assert r.loc[0, "reason"].startswith("vllm-v1 runs one sequence per request")
    assert "whole cache" in r.loc[1, "reason"]
    assert (r.loc[0, "finish_s"], r.loc[1, "finish_s"]) == (0.5, 0.7)
    assert_same(config, requests)


def test_a_preempted_request_waits_at_the_front_and_nobody_is_admitted_that_step(monkeypatch):
    """16 slots in 4 blocks of B = 4, budget 5, reserve_full_isl off. r0 and r1: 4-token
    prompts, 6 output tokens, at t = 0; r2: 1 token, 1 output token, arrives at t = 0.035
    (during step 3, when no block is free).

    step 0: [r0: 4, r1: 1]   r1 gets the budget's last token (one block each)
    step 1: [r0: 1, r1: 3]   r0 takes a 2nd block; r1 completes its prompt and samples
    steps 2-4: [r0: 1, r1: 1]   r1 takes a 2nd block in step 2: none left; r2 waits
    step 5: r0's 9th token needs a 3rd block: r1 (admitted last) is preempted (7 computed
            tokens discarded; its 2 blocks free), r0 takes one. 1 block and 4 tokens of
            budget are left, enough for a 4-token chunk of r1, but nobody is admitted in
            a step that preempted.   -> [r0: 1]; r0 finishes. Queue: [r1, r2].
    step 6: r1 first (the front): min(8, 5) = 5 tokens   -> [r1: 5]
    step 7: [r1: 3, r2: 1]   both sample; r2 finishes
    step 8: [r1: 1]          r1 finishes
    """
    config = v1_config(16, 16, 4, 5, reserve_full_isl=False)
    requests = [Request(0, 0.0, 4, 6), Request(1, 0.0, 4, 6), Request(2, 0.035, 1, 1)]
    result, chunks, preempted = run(config, requests, monkeypatch)
    starts = result.steps["start_s"].tolist()
    assert starts[3] < 0.035 < starts[4], "r2 must arrive during step 3"
    assert chunks == (
        [[(0, 4), (1, 1)], [(0, 1), (1, 3)]]
        + [[(0, 1), (1, 1)]] * 3
        + [[(0, 1)], [(1, 5)], [(1, 3), (2, 1)], [(1, 1)]]
    )
    assert preempted[5] == [1] and sum(map(len, preempted)) == 1
    r = result.requests.set_index("request_id")
    assert r.loc[1, "recomputed_tokens"] == 7
    assert result.steps["recompute_tokens"].tolist() == [0] * 6 + [5, 3, 0]  # chunk by chunk
    assert_same(config, requests)


def test_two_copies_of_a_block_computed_at_once_keep_the_first_cached(monkeypatch):
    """20 slots in 5 blocks of B = 4, prefix caching, one output token each. r0 and r1 (t=0)
    both start with the 8-token prefix p (blocks p0, p1); r2 (t=1): 12 tokens of its own;
    r3 (t=2): 9 tokens starting with p.

    step 0: [r0: 8, r1: 8]: both miss (blocks are cached when full, after the step).
        r0 holds blocks 0, 1 and registers them as p0, p1; r1 holds 2, 3 with the same
        content: the first copies stay the cached ones, 2 and 3 stay unnamed. Both finish:
        queue [4, 1, 0, 3, 2].
    r2 takes 4, 1 (p1 evicted), 0 (p0 evicted); freed: [3, 2, 0, 1, 4].
    r3 looks up p0: evicted, although r1's copy (block 2) is still in the queue, unnamed:
        no hit; it takes 3, 2 and 0 (r2's own first block: evicted).
    Lookups 1 + 1 + 2 + 2 = 6, hits 0, evictions 3. (Had the later copy been cached,
    r3 would hit blocks 2 and 3: 8 tokens.)
    """
    config = v1_config(20, 20, 4, 64)
    config["allocator"]["prefix_caching"] = True
    requests = [
        Request(0, 0.0, 8, 1, prefix_id="p", prefix_tokens=8),
        Request(1, 0.0, 8, 1, prefix_id="p", prefix_tokens=8),
        Request(2, 1.0, 12, 1),
        Request(3, 2.0, 9, 1, prefix_id="p", prefix_tokens=8),
    ]
    result, chunks, _ = run(config, requests, monkeypatch)
    assert chunks == [[(0, 8), (1, 8)], [(2, 12)], [(3, 9)]]
    assert result.requests["cached_prompt_tokens"].tolist() == [0, 0, 0, 0]
    alloc = result.allocators[0]
    assert (alloc.prefix_lookups, alloc.prefix_hits, alloc.evictions) == (6, 0, 3)
    assert_same(config, requests)
