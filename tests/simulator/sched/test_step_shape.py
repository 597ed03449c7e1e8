"""What the cost model is asked: prompt tokens found in the prefix cache are not computed,
but the new tokens still attend to them (their attention pairs are in the step shape)."""

import pytest

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model.base import causal_attention_pairs
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings, Step
from kvsim.traces import Request


@pytest.mark.parametrize("prompt, cached, new, pairs", [
    (12, 8, 4, 42),  # 2 cached blocks of 4; 4 new tokens attend to 8 + 1..4 keys: 4 x 8 + 10 = 42
    (8, 7, 1, 8),  # the whole prompt is cached: the hit is capped at prompt - 1, 1 x 7 + 1 = 8
])
def test_cached_prefix_tokens_are_attended_to_but_not_computed(tiny, paged, fake_cost, prompt, cached, new, pairs):
    # Prefix caching, block size 4; both requests share an 8-token prefix. Step time:
    # 1 s + 1/16 s per computed prompt token + 1/256 s per attention pair.
    #   step 1 [0, d1]: R0's 12 tokens, 12 x 13 / 2 = 78 pairs: d1 = 1 + 12/16 + 78/256 = 2.0546875.
    #   R1 arrives at 0.5; step 2 prefills it alone: d2 = 1 + new/16 + pairs/256.
    #   step 3 decodes both (1 s): their 2nd and last tokens.
    assert causal_attention_pairs(new, cached) == pairs
    cost = fake_cost(per_prefill_token=1 / 16, per_pair=1 / 256)
    reqs = [Request(0, 0.0, 12, 2, prefix_id="p", prefix_tokens=8),
            Request(1, 0.5, prompt, 2, prefix_id="p", prefix_tokens=8)]
    out = tiny(reqs, paged(16, 4, prefix_caching=True), cost)
    d1 = 1 + 12 / 16 + 78 / 256
    d2 = 1 + new / 16 + pairs / 256
    shape = cost.shapes[1]  # R1's prefill
    assert (shape.prefill_seqs, shape.prefill_tokens, shape.prefill_attn_pairs) == (1, new, pairs)
    assert (shape.decode_seqs, shape.decode_context) == (0, 0)
    r = out.requests
    assert r.loc[1, "cached_prompt_tokens"] == cached and r.loc[0, "cached_prompt_tokens"] == 0
    assert r.loc[1, "first_token_s"] == pytest.approx(d1 + d2, rel=1e-12)
    assert list(r["finish_s"]) == pytest.approx([d1 + d2 + 1] * 2, rel=1e-12)
    steps = out.steps
    assert list(steps.loc[steps.prefill_tokens > 0, "prefill_tokens"]) == [12, new]
    assert steps["cached_tokens"].sum() == cached == out.summary["cached_prompt_tokens"]


def test_decode_shape_reads_every_context_token(tiny, paged, fake_cost):
    # Two requests, prompts 3 and 5, 3 output tokens each, 1/64 s per context token read.
    #   step 1 [0,1] prefill both; step 2 reads 4 + 6 = 10 tokens: 1 + 10/64;
    #   step 3 reads 5 + 7 = 12: 1 + 12/64. Both end at 3 + 22/64.
    cost = fake_cost(per_context=1 / 64)
    out = tiny([Request(0, 0.0, 3, 3), Request(1, 0.0, 5, 3)], paged(16, 4), cost, macro_steps=False)
    assert [(s.decode_seqs, s.decode_context) for s in cost.shapes[1:]] == [(2, 10), (2, 12)]
    assert list(out.requests["finish_s"]) == pytest.approx([3 + 22 / 64] * 2, rel=1e-12)


def test_admission_counts_cached_blocks_as_already_there(tiny, paged):
    # 4 blocks of 4, prefix caching, 1 s per step. R0: prompt 11 (3 blocks, the first 2
    # an 8-token shared prefix), 2 tokens. R1 (at 0.5): the same prefix, prompt 11, 1 token.
    #   step 1 [0,1] R0's prefill: 3 blocks, 1 free.
    #   step 2 at 1: R1 needs 3 blocks, 2 of them cached and held by R0: 1 new block fits.
    #     Its prefill [1,2] computes 3 tokens; its only token ends it at 2.
    #   step 3 [2,3] R0's 2nd token ends it at 3.
    reqs = [Request(0, 0.0, 11, 2, prefix_id="p", prefix_tokens=8),
            Request(1, 0.5, 11, 1, prefix_id="p", prefix_tokens=8)]
    out = tiny(reqs, paged(4, 4, prefix_caching=True))
    r = out.requests
    assert list(r["finish_s"]) == [3.0, 2.0]
    assert r.loc[1, "cached_prompt_tokens"] == 8


def test_recomputed_prefills_add_up_without_their_cached_prefix():
    # Two groups preempted by recomputation after 2 tokens come back in one prefill step:
    # g0 (prompt 12 with an 8-token cached prefix) recomputes 14 - 8 = 6 tokens, g1
    # (prompt 6, nothing cached) 6 + 2 = 8: 14 recomputed tokens, 8 cached.
    sched = Scheduler(PagedAllocator(64, 4, prefix_caching=True),
                      SchedulerSettings(max_seq_len=4096, watermark=0.0, preemption="recompute"), lambda g: None)
    g0 = sched.add(Request(0, 0.0, 12, 8, prefix_id="p", prefix_tokens=8), 0.0)
    g1 = sched.add(Request(1, 0.0, 6, 8), 0.0)
    sched.complete(sched.schedule(0.0), 1.0)
    sched.complete(sched.schedule(1.0), 2.0)
    for g in (g1, g0):  # as memory pressure would: the latest arrival first
        sched._preempt(g, Step())
        sched.running.remove(g)
    step = sched.schedule(2.0)
    assert step.prefill == [g0, g1]
    assert (step.recompute_tokens, step.cached_tokens, step.shape.prefill_tokens) == (14, 8, 14)
