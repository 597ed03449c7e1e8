"""``scheduler.policy: vllm-v1``: hand-worked tiny scenarios (the answer derived in each
docstring from the rules in simulator/sched/vllm_v1.py), config errors, and macro steps
equal to single steps on random workloads.

The scenario tests drive the scheduler directly, one step per second: ``schedule(t)``
then ``complete(step, t + 1)``. Block size 4 throughout, so block counts stay small.
"""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_cases import (
    assert_round_trips,
    assert_same_requests,
    config,
    config_error,
    ids,
    step,
)

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
from kvsim.simulator.config import load_config
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.cost_model.base import causal_attention_pairs
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.simulator.sched.sequence import Status
from kvsim.simulator.sched.vllm_v1 import SchedulerV1, StepV1
from kvsim.traces import Request

B = 4


def make(num_blocks=100, caching=False, **limits):
    """A v1 scheduler over ``num_blocks`` blocks of 4 slots; returns it and the ended groups."""
    limits.setdefault("max_num_batched_tokens", 2048)
    alloc = V1PrefixCacheAllocator(num_blocks, B) if caching else PagedAllocator(num_blocks, B)
    ended = []
    s = SchedulerV1(alloc, SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1", **limits), ended.append)
    return s, ended


def test_budget_splits_a_long_prompt_into_chunks_mixed_with_decodes():
    """Budget 8 tokens. A (prompt 4, output 5) and B (prompt 20, output 2) arrive at 0.

    step 0: nothing runs; A is admitted with 4 tokens (budget 8 -> 4), B with the 4 left:
            prefill 2 seqs, 8 tokens, pairs 10 + 10. A samples its first token; B is at 4/20.
    step 1: A decodes (KV after: 5); B gets min(16, 7) = 7 tokens after 4 cached-by-itself:
            pairs 7*4 + 28 = 56. B at 11.
    step 2: A decodes (6); B 7 more (pairs 7*11 + 28 = 105), at 18.
    step 3: A decodes (7); B the last 2 (pairs 2*18 + 3 = 39): B catches up and samples (TTFT 4 s).
    step 4: both decode (A: 8, B: 21): B has its 2 tokens, A its 5 -> both finish at 5 s.
    Token gaps: A's 4 of 1 s, B's 1 of 1 s.
    """
    s, ended = make(max_num_batched_tokens=8)
    s.add(Request(0, 0.0, 4, 5), 0.0)
    s.add(Request(1, 0.0, 20, 2), 0.0)
    shapes = []
    for t in range(5):
        x = step(s, t)
        shapes.append((ids(x.prefill), x.chunks, ids(x.decode), x.shape.prefill_tokens,
                       x.shape.prefill_attn_pairs, x.shape.decode_seqs, x.shape.decode_context))
    assert shapes == [
        ([0, 1], [4, 4], [], 8, 20.0, 0, 0),
        ([1], [7], [0], 7, 56.0, 1, 5),
        ([1], [7], [0], 7, 105.0, 1, 6),
        ([1], [2], [0], 2, 39.0, 1, 7),
        ([], [], [0, 1], 0, 0.0, 2, 8 + 21),
    ]
    assert causal_attention_pairs(7, 4) == 56.0  # the convention the shapes above use
    assert [(g.request.request_id, g.first_token, g.finish, g.generated) for g in ended] == \
        [(0, 1.0, 5.0, 5), (1, 4.0, 5.0, 2)]
    assert (s.itl.count, s.itl.total) == (5, 5.0)
    assert not s.has_work


def test_long_prefill_token_threshold_caps_each_request_per_step():
    """Threshold 3, budget 100: A (prompt 10, output 1) gets 3, 3, 3, 1 tokens in four steps
    and samples (and finishes, one output token) at the end of the fourth; B (prompt 2,
    output 1), admitted in the first step after A, is under the cap and finishes at once."""
    s, ended = make(long_prefill_token_threshold=3, max_num_batched_tokens=100)
    s.add(Request(0, 0.0, 10, 1), 0.0)
    s.add(Request(1, 0.0, 2, 1), 0.0)
    chunks = [step(s, t).chunks for t in range(4)]
    assert chunks == [[3, 2], [3], [3], [1]]
    assert [(g.request.request_id, g.finish) for g in ended] == [(1, 1.0), (0, 4.0)]


def test_max_num_partial_prefills_holds_back_a_second_partial_prefill():
    """Threshold 8, limit 1 partial prefill. A and B (prompt 20, output 1 each).

    step 0: A gets 8 (left mid-prefill: 1 partial); B would be left mid-prefill too -> waits.
    step 1: A 8 more (16/20, still partial) -> B waits.
    step 2: A's last 4 complete it (0 partial after the step) -> B is admitted with 8.
    Without the limit B is admitted in step 0.
    """
    s, _ = make(long_prefill_token_threshold=8, max_num_partial_prefills=1)
    for i in range(2):
        s.add(Request(i, 0.0, 20, 1), 0.0)
    assert [(ids(x.prefill), x.chunks) for x in (step(s, t) for t in range(3))] == \
        [([0], [8]), ([0], [8]), ([0, 1], [4, 8])]
    free, _ = make(long_prefill_token_threshold=8)
    for i in range(2):
        free.add(Request(i, 0.0, 20, 1), 0.0)
    assert step(free, 0).chunks == [8, 8]


@pytest.mark.parametrize("reserve", [True, False])
def test_reserve_full_isl_needs_blocks_for_the_whole_sequence(reserve):
    """5 blocks of 4, threshold 4. A (prompt 16) is admitted with 4 tokens: 1 block, 4 free.
    B (prompt 20 = 5 blocks) needs 1 block for its first chunk of 4: with reserve_full_isl it
    must find all 5 free and waits (blocked: no space); without, it is admitted."""
    s, _ = make(num_blocks=5, long_prefill_token_threshold=4, reserve_full_isl=reserve)
    s.add(Request(0, 0.0, 16, 1), 0.0)
    s.add(Request(1, 0.0, 20, 1), 0.0)
    x = step(s, 0)
    if reserve:
        assert ids(x.prefill) == [0] and ids(s.waiting) == [1] and s.alloc.num_free_blocks == 4
    else:
        assert ids(x.prefill) == [0, 1] and not s.waiting and s.alloc.num_free_blocks == 3


def test_recompute_preempts_the_last_admitted_to_the_front_and_it_rehits_its_own_blocks():
    """6 blocks of 4, prefix caching on. A and B (prompt 8, output 9 each) are admitted in
    step 0 (A first), 2 blocks each; they sample token 1 (KV 8). C (prompt 4) arrives at 2 s
    and waits: step 2 leaves no free block (A, B hold 3 blocks each, KV 9..).

    step 5: KV 12 -> 13 needs a 4th block each; the queue is empty, so A's allocation
            preempts the last admitted, B: its blocks go to the free queue last block first
            [B2, B1, B0] (all full: identities ("u", 1, 0..2)); A takes the head B2 (evicting
            its identity: 1 eviction). B is at the FRONT of the queue, before C; nothing is
            admitted in a step that preempted.
    A decodes to its 9th token in step 8 (finishing at 9 s) and frees A3, A2, A1, A0.
    step 9: B returns with num_tokens 8 + 5 = 13: its blocks 0 and 1 are still cached (hit 8
            tokens, B2 was evicted), so it computes 5 tokens (all recompute) after 8 cached,
            and samples its 6th token at 10 s: a gap of 5 s since its 5th (at 5 s).
    Token gaps by then: A's 8 of 1 s, B's 4 of 1 s and that 5 s one.
    """
    s, ended = make(num_blocks=6, caching=True)
    s.add(Request(0, 0.0, 8, 9), 0.0)
    s.add(Request(1, 0.0, 8, 9), 0.0)
    x = step(s, 0)
    assert ids(x.prefill) == [0, 1]
    for t in range(1, 5):
        if t == 2:
            s.add(Request(2, 2.0, 4, 1), 2.0)
        step(s, t)
    assert ids(s.waiting) == [2] and s.alloc.num_free_blocks == 0
    x = step(s, 5)
    assert x.preempted_recompute == 1 and ids(x.decode) == [0] and not x.prefill
    assert ids(s.waiting) == [1, 2] and s.alloc.evictions == 1
    b = s.waiting[0]
    assert b.preemptions == 1 and b.generated == 5 and b.recomputed_tokens == 12
    for t in range(6, 9):
        assert not step(s, t).prefill  # B needs 4 blocks (13 tokens), 2 are free: it waits
    assert ids(ended) == [0] and ended[0].finish == 9.0
    x = step(s, 9)
    assert ids(x.prefill) == [1, 2] and x.chunks == [5, 4]
    assert x.cached_tokens == 8 and x.recompute_tokens == 5
    assert x.shape.prefill_attn_pairs == causal_attention_pairs(5, 8) + causal_attention_pairs(4, 0)
    assert b.cached_tokens == 8 and b.generated == 6
    assert (s.itl.count, s.itl.total) == (13, 17.0)


def test_hit_is_capped_one_token_short_of_the_sequence():
    """Prefix caching, two requests whose whole 8-token prompt is a shared prefix (2 full
    blocks). The first computes both blocks; the second, admitted after, may hit at most
    (8 - 1) // 4 = 1 block: it computes the last 4 tokens itself (to sample from them)."""
    s, _ = make(caching=True)
    s.add(Request(0, 0.0, 8, 3, prefix_id="p", prefix_tokens=8), 0.0)
    step(s, 0)
    s.add(Request(1, 1.0, 8, 3, prefix_id="p", prefix_tokens=8), 1.0)
    x = step(s, 1)
    assert ids(x.prefill) == [1] and x.cached_tokens == 4 and x.chunks == [4]
    assert s.alloc.prefix_hits == 1


def test_a_shared_prefix_block_in_use_costs_no_free_block():
    """4 blocks. A (prompt 9 = 2 full shared blocks + 1 token, output 3) holds 3 blocks; 1 is
    free. B (the same 9-token prompt) arrives at 1 s and hits both shared blocks, which A
    holds: it needs ceil(9/4) - 2 = 1 block for its whole sequence and 1 for its chunk of 1
    token (after 8 cached): the free one. Counting the hit blocks as needed (3) would make
    it wait until A finishes."""
    s, _ = make(num_blocks=4, caching=True)
    s.add(Request(0, 0.0, 9, 3, prefix_id="p", prefix_tokens=8), 0.0)
    step(s, 0)
    s.add(Request(1, 1.0, 9, 2, prefix_id="p", prefix_tokens=8), 1.0)
    x = step(s, 1)
    assert ids(x.decode) == [0] and ids(x.prefill) == [1]
    assert x.cached_tokens == 8 and x.chunks == [1] and s.alloc.num_free_blocks == 0


def test_multi_sequence_requests_are_rejected_with_the_reason():
    s, ended = make()
    s.add(Request(0, 0.0, 8, 3, n=2), 0.0)
    s.add(Request(1, 0.0, 8, 3, beam_width=3), 0.0)
    assert [g.status for g in ended] == [Status.REJECTED] * 2
    assert all(g.reason.startswith("vllm-v1 runs one sequence per request") for g in ended)
    assert "n=2" in ended[0].reason and "beam_width=3" in ended[1].reason
    assert not s.waiting


def test_a_request_larger_than_the_cache_is_rejected_at_arrival():
    """2 blocks of 4 = 8 slots: prompt 6 + output 4 ends at 9 KV tokens (3 blocks)."""
    s, ended = make(num_blocks=2)
    s.add(Request(0, 0.0, 6, 4), 0.0)
    s.add(Request(1, 0.0, 6, 3), 0.0)
    assert ids(ended) == [0] and "whole cache (8)" in ended[0].reason and ids(s.waiting) == [1]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=2, max_size=12), st.booleans(),
       st.sampled_from([0, 6]), st.integers(2, 12))
def test_the_lockstep_step_equals_the_request_by_request_step(lengths, caching, threshold, steps):
    """Scheduling the running requests in one all-or-nothing allocation (every decoder's
    slot through the lockstep path, chunks on top) gives the very step, budget and
    memory that going request by request gives, whenever it applies."""
    s, _ = make(num_blocks=60, caching=caching, max_num_batched_tokens=24, long_prefill_token_threshold=threshold,
                max_num_seqs=8)
    for i, (p, o) in enumerate(lengths):
        s.add(Request(i, 0.0, p, o, prefix_id="p", prefix_tokens=8), 0.0)
    for t in range(steps):
        if s.running:
            a, b = copy.deepcopy(s), copy.deepcopy(s)
            sa, sb = StepV1(), StepV1()
            left = a._schedule_in_lockstep(sa, 24)
            if left is not None:
                assert b._schedule_running(sb, 24) == left
                assert (ids(sa.prefill), sa.chunks, ids(sa.decode), sa.shape) == \
                    (ids(sb.prefill), sb.chunks, ids(sb.decode), sb.shape)
                assert a.alloc.usage() == b.alloc.usage()
                assert a.alloc.num_free_blocks == b.alloc.num_free_blocks
        step(s, t)


# --- config --------------------------------------------------------------------------
@pytest.mark.parametrize("extra, key", [
    ("scheduler: {long_prefill_token_threshold: 64}", "long_prefill_token_threshold"),
    ("scheduler: {max_num_partial_prefills: 2}", "max_num_partial_prefills"),
    ("scheduler: {reserve_full_isl: false}", "reserve_full_isl"),
    ("scheduler: {policy: vllm-v1}\npreemption: {mode: swap}", "preemption.mode"),
    ("scheduler: {policy: vllm-v1}\npreemption: {mode: auto}", "preemption.mode"),
    ("scheduler: {policy: vllm-v1}\nallocator: {watermark: 0.01}", "allocator.watermark"),
    ("scheduler: {policy: vllm-v1, batching: request}", "batching"),
    ("scheduler: {policy: vllm-v1}\nallocator: {kind: contiguous}", "allocator.kind"),
    ("scheduler: {policy: vllm-v1}\nallocator: {kind: contiguous, preset: orca-max}", "allocator.kind"),
    ("scheduler: {policy: vllm-v1, max_num_partial_prefills: 0}", "max_num_partial_prefills"),
    ("scheduler: {policy: vllm-v1, long_prefill_token_threshold: -1}", "long_prefill_token_threshold"),
    ("scheduler: {policy: vllm-v2}", "scheduler.policy"),
])
def test_config_errors_are_one_line_naming_the_key(tmp_path, extra, key):
    assert key in config_error(tmp_path, extra)


@pytest.mark.parametrize("key", ["n", "beam_width"])
def test_samples_or_beams_in_the_config_are_an_error_under_v1(tmp_path, key):
    message = config_error(tmp_path, "scheduler: {policy: vllm-v1}", [f"workload.{key}=2"])
    assert f"workload.{key} (2)" in message and "one sequence per request" in message


def test_v1_config_defaults_and_round_trip(tmp_path):
    """Unset, the watermark is 0 and preemption recompute under v1; the resolved config
    (every key written out) loads again; v0's defaults are untouched."""
    cfg, _ = load_config(config(tmp_path, "scheduler: {policy: vllm-v1, long_prefill_token_threshold: 64}"))
    assert cfg.allocator.watermark == 0 and cfg.preemption.mode == "recompute"
    assert cfg.max_num_batched_tokens == 2048  # v1 chunks prompts: vLLM's budget, not the context (4096)
    assert cfg.scheduler.reserve_full_isl is True and cfg.scheduler.max_num_partial_prefills is None
    assert_round_trips(cfg, tmp_path)
    v0, _ = load_config(config(tmp_path, ""))
    assert v0.scheduler.policy == "vllm-v0" and v0.allocator.watermark == 0.01 and v0.preemption.mode == "auto"
    assert v0.max_num_batched_tokens == 4096


def test_a_v1_config_runs_end_to_end_with_prefix_caching(tmp_path):
    cfg, base = load_config(config(tmp_path, "scheduler: {policy: vllm-v1, max_num_batched_tokens: 4096}\n"
                                             "allocator: {prefix_caching: true}"))
    result = run_experiment(cfg, base)
    assert result.summary["completed"] == 60
    assert result.steps["prefill_tokens"].sum() > 0


# --- macro steps ---------------------------------------------------------------------
@st.composite
def workloads(draw):
    count = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 2.0]), min_size=count, max_size=count))
    prefix = draw(st.booleans())
    reqs, t = [], 0.0
    for i, gap in enumerate(gaps):
        t += gap
        extra = {"prefix_id": f"p{draw(st.integers(0, 2))}", "prefix_tokens": 64} if prefix else {}
        reqs.append(Request(i, t, draw(st.integers(1, 300)), draw(st.integers(1, 200)), **extra))
    return reqs


def simulate(reqs, caching, macro, **limits):
    make_alloc = (lambda: V1PrefixCacheAllocator(45, 16)) if caching else (lambda: PagedAllocator(45, 16))
    sim = Simulation(reqs, make_alloc, lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"]),
                     SchedulerSettings(max_seq_len=1024, watermark=0, policy="vllm-v1", **limits),
                     macro_steps=macro)
    sim.run()
    return sim.request_rows.frame(), sim.steps.totals(), sim.replicas[0].scheduler


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.sampled_from([64, 256, 2048]), st.sampled_from([4, 256]),
       st.sampled_from([0, 32]), st.sampled_from([None, 1, 2]), st.booleans())
def test_macro_steps_equal_single_steps_under_v1(reqs, caching, budget, max_seqs, threshold, partial, reserve):
    kw = dict(max_num_batched_tokens=budget, max_num_seqs=max_seqs, long_prefill_token_threshold=threshold,
              max_num_partial_prefills=partial, reserve_full_isl=reserve)
    one, t_one, s_one = simulate(reqs, caching, False, **kw)
    many, t_many, s_many = simulate(reqs, caching, True, **kw)
    assert_same_requests(one, many, ("status", "generated_tokens", "preemptions", "recomputed_tokens",
                                     "cached_prompt_tokens"))
    assert s_one.itl.count == s_many.itl.count
    assert s_many.itl.total == pytest.approx(s_one.itl.total, rel=1e-9, abs=1e-12)
    assert getattr(s_one.alloc, "evictions", 0) == getattr(s_many.alloc, "evictions", 0)
    s_many.alloc.check()
