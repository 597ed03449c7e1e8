"""``scheduler.policy: sglang``: hand-worked tiny scenarios (the answer derived in each
docstring from the rules in simulator/sched/sglang.py), config errors, and an
end-to-end run.

Scenarios drive the scheduler directly, one step per second: ``schedule(t)`` then
``complete(step, t + 1)``; the radix cache's books are checked after every step. Page size
1 and token-id prompts, so hits are exact token counts.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_cases import CONFIG, assert_round_trips, config, config_error, ids, step

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.kv_allocator import Admission
from kvsim.simulator.app.sweep import expand_points, load_sweep, validate_points
from kvsim.simulator.config import load_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.sched.sequence import Status
from kvsim.simulator.sched.sglang import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    SchedulerSGLang,
    SGLangSettings,
)
from kvsim.traces import Request


def make(capacity=200, page=1, **kw):
    kw.setdefault("max_num_batched_tokens", 1000)
    kw.setdefault("max_seq_len", 1024)
    alloc = RadixCacheAllocator(capacity, page)
    ended = []
    s = SchedulerSGLang(alloc, SGLangSettings(watermark=0, **kw), ended.append)
    return s, ended


def req(rid, tokens, out, t=0.0):
    return Request(rid, t, len(tokens), out, token_ids=tuple(tokens))


def cached(s, tokens):
    """Put ``tokens`` in the cache: a request of output 1 runs and finishes in one step."""
    s.add(req(900 + len(s.alloc.tree.sequences()), tokens, 1), 0.0)
    step(s, 0)
    assert not s.has_work


# --- queue order ---------------------------------------------------------------------
@pytest.mark.parametrize("policy, order", [("lpm", [3, 2, 1]), ("fcfs", [1, 2, 3])])
def test_lpm_admits_the_longest_cached_prefix_first(policy, order):
    """(1..8) is cached. A (no hit), B (4 tokens hit), C (8 hit, of 10) wait; one request
    runs at a time (max_num_seqs 1, output 1: each finishes in its prefill step).
    lpm: C, B, A (hits 8 > 4 > 0); fcfs: arrival order."""
    s, _ = make(max_num_seqs=1, schedule_policy=policy)
    cached(s, range(1, 9))
    s.add(req(1, [50, 51, 52, 53, 54, 55], 1), 0.0)
    s.add(req(2, [1, 2, 3, 4, 60, 61], 1), 0.0)
    s.add(req(3, list(range(1, 11)), 1), 0.0)
    seen = [ids(step(s, t).prefill) for t in range(1, 4)]
    assert seen == [[r] for r in order]
    hits = {3: 8, 2: 4, 1: 0}
    assert [s.alloc.prefix_hits] == [sum(hits.values())]


def test_lpm_moves_a_request_sharing_an_uncached_prefix_with_one_ahead_to_the_back():
    """D and E share 40 uncached tokens, F shares nothing. D's hit (0) is under the check
    threshold (32): its prompt is remembered; E's matches 40 >= 32 of D's: deprioritised.
    Order: D, F, E (so E can hit D's prefix once D has computed it)."""
    s, _ = make()
    shared = list(range(100, 140))
    s.add(req(1, shared + [1], 2), 0.0)
    s.add(req(2, shared + [2], 2), 0.0)
    s.add(req(3, list(range(200, 230)), 2), 0.0)
    s.order_queue()
    assert ids(s.waiting) == [1, 3, 2]


def test_lpm_falls_back_to_arrival_order_when_more_than_128_wait():
    s, _ = make()
    cached(s, range(1, 9))
    for i in range(129):  # the last one would hit 8 tokens
        s.add(req(i, [1000 + i, 7] if i < 128 else list(range(1, 11)), 1), 0.0)
    s.order_queue()
    assert ids(s.waiting) == list(range(129))
    s.waiting.pop(0)  # 128 wait: lpm sorts again
    s.order_queue()
    assert ids(s.waiting)[0] == 128


def test_dfs_weight_visits_the_heavier_subtree_first_and_a_nodes_own_requests_last():
    """Cached: X = (1 2 3 4) and Y = (7 8 9 10). Waiting: a1 (X + 20), n1 (no hit),
    b1 (Y + 21), b2 (Y + 22). Y's subtree holds 2 requests, X's 1: b1, b2, a1, then the
    root's own n1. (lpm would keep a1, b1, b2 before n1: equal hits keep queue order.)"""
    s, _ = make(schedule_policy="dfs-weight")
    cached(s, [1, 2, 3, 4])
    cached(s, [7, 8, 9, 10])
    s.add(req(1, [1, 2, 3, 4, 20], 2), 0.0)
    s.add(req(2, [30, 31], 2), 0.0)
    s.add(req(3, [7, 8, 9, 10, 21], 2), 0.0)
    s.add(req(4, [7, 8, 9, 10, 22], 2), 0.0)
    s.order_queue()
    assert ids(s.waiting) == [3, 4, 1, 2]


# --- admission: the reservation --------------------------------------------------------
@pytest.mark.parametrize("conservativeness, admitted", [(1.0, False), (0.3, True)])
def test_the_running_requests_reservation_blocks_admission(conservativeness, admitted):
    """100 slots. R (prompt 10, output 50) ran its prefill: 10 slots held, 49 tokens to go.
    N (prompt 30, output 30) arrives: it needs 30 + 30 = 60 slots. Free + evictable = 90.
    Ratio 0.7: 90 - 0.7 x 49 = 55.7 < 60: blocked (a decode step for R instead).
    Conservativeness 0.3 (ratio 0.21): 60 < 90 - 10.29 = 79.7: admitted."""
    s, _ = make(capacity=100, schedule_conservativeness=conservativeness)
    s.add(req(0, range(10), 50), 0.0)
    step(s, 0)
    s.add(req(1, range(100, 130), 30), 1.0)
    x = step(s, 1)
    assert (ids(x.prefill) == [1]) is admitted
    if not admitted:
        assert ids(x.decode) == [0] and s.blocked is Admission.NO_SPACE
    assert s.init_ratio == pytest.approx(0.7 * conservativeness)


def test_admissions_in_one_step_are_judged_against_the_memory_before_the_step():
    """100 slots, nothing running. A and B (prompt 20, output 20) each need 40; C (prompt
    20, output 1) 21. Against the 100 slots before the step: A (40 < 100), B (40 < 100 - 40),
    C: 21 >= 100 - 80 = 20: blocked. (Counting A's 20 allocated slots a second time would
    block B: 40 >= 80 - 40.)"""
    s, _ = make(capacity=100)
    for i, n in ((0, 20), (1, 20), (2, 1)):
        s.add(req(i, range(100 * i, 100 * i + 20), n), 0.0)
    x = step(s, 0)
    assert ids(x.prefill) == [0, 1] and ids(s.waiting) == [2] and s.blocked is Admission.NO_SPACE


def test_a_new_requests_own_output_is_reserved_in_full_and_clipped():
    """Prompt 10, output 5000 on 5009 slots (its whole KV, 10 + 5000 - 1, fits): it needs
    10 + min(5000, 4096) = 4106 < 5009, admitted (unclipped, 5010 would not be). On 4106
    slots it could never be (admission needs less than the memory left): rejected at once;
    on 4200 it is admissible but its KV never fits: rejected too."""
    s, _ = make(capacity=5009, max_seq_len=8192)
    assert CLIP_MAX_NEW_TOKENS == 4096
    s.add(Request(0, 0.0, 10, 5000), 0.0)
    assert ids(step(s, 0).prefill) == [0]
    s, ended = make(capacity=4106, max_seq_len=8192)
    s.add(Request(0, 0.0, 10, 5000), 0.0)
    assert s.waiting == [] and ended[0].status is Status.REJECTED
    s, ended = make(capacity=4200, max_seq_len=8192)  # admissible, but its 5009 tokens of KV never fit
    s.add(Request(0, 0.0, 10, 5000), 0.0)
    assert s.waiting == [] and "whole cache" in ended[0].reason


def test_the_ratio_decays_once_per_decode_step_down_to_its_floor():
    """init 0.7, floor 0.7 x 0.14 = 0.098, decay (0.7 - 0.098) / 600 per decode step;
    prefill steps do not decay it."""
    s, _ = make()
    s.add(req(0, range(5), 40), 0.0)
    step(s, 0)  # prefill
    assert s.new_token_ratio == INIT_NEW_TOKEN_RATIO
    for t in range(1, 4):
        step(s, t)
    floor = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
    decay = (INIT_NEW_TOKEN_RATIO - floor) / NEW_TOKEN_RATIO_DECAY_STEPS
    assert s.new_token_ratio == pytest.approx(0.7 - 3 * decay) and floor == pytest.approx(0.098)
    s.new_token_ratio = floor + decay / 2
    step(s, 4)
    assert s.new_token_ratio == pytest.approx(floor)


# --- retraction ------------------------------------------------------------------------
def test_retraction_takes_the_fewest_generated_then_the_longest_prompt():
    """50 slots, ratio near 0 (conservativeness 0.01), outputs 20 (C: 15).
    t0 A (prompt 10) prefills; t1 B (prompt 12) prefills (32 < 40 - 0.2); t2-4 A and B
    decode (generated 4 each, KV 13 + 15); t5 C (prompt 5) prefills (20 < 22 - 0.2).
    Decodes t6-t10 take 3 slots each: 2 left; t11 needs 3: retract. By (generated,
    prompt): C has the fewest (6 vs 9); then 2 remain and need 40 free: A and B tie at 9
    generated, B's prompt is longer: B goes; A stays alone. Ratio: min(1, (9 + 20) / 21)."""
    s, ended = make(capacity=50, schedule_conservativeness=0.01)
    s.add(req(0, range(10), 20), 0.0)
    arrivals = {1: req(1, range(100, 112), 20, 1.0), 5: req(2, range(200, 205), 15, 5.0)}
    steps = {}
    t = 0
    while s.has_work and t < 200:
        if t in arrivals:
            s.add(arrivals[t], float(t))
        steps[t] = step(s, t)
        t += 1
    assert [ids(steps[t].prefill) for t in (0, 1, 5)] == [[0], [1], [2]]
    assert all(steps[t].preempted_recompute == 0 for t in range(11))
    x = steps[11]
    assert x.preempted_recompute == 2 and ids(x.decode) == [0]
    # everyone finishes in the end; B and C were recomputed once (ratio 1 then), A never
    assert len(ended) == 3 and all(g.status is Status.FINISHED for g in ended)
    assert {g.request.request_id: g.preemptions for g in ended} == {0: 0, 1: 1, 2: 1}
    assert all(g.recomputed_tokens > 0 for g in ended if g.preemptions)


def test_retraction_ratio_and_queue():
    """The same scenario, stopped at the retraction: C then B rejoin the back of the
    queue, their own KV freed, the ratio raised to min(1, 29 / 21) = 1."""
    s, _ = make(capacity=50, schedule_conservativeness=0.01)
    s.add(req(0, range(10), 20), 0.0)
    for t in range(11):
        if t == 1:
            s.add(req(1, range(100, 112), 20, 1.0), 1.0)
        if t == 5:
            s.add(req(2, range(200, 205), 15, 5.0), 5.0)
        step(s, t)
    assert s.new_token_ratio < 0.01
    x = s.schedule(11.0)
    assert ids(s.waiting) == [2, 1] and x.preempted_recompute == 2
    assert s.new_token_ratio == 1.0
    assert [g.generated for g in s.waiting] == [6, 9] and s.running[0].generated == 9
    assert set(s.alloc.held) == {s.running[0].seq_ids[0]}


# --- chunked prefill, mixed or not -----------------------------------------------------
@pytest.mark.parametrize("mixed", [False, True])
def test_chunked_prefill_caches_each_chunk_and_mixed_steps_keep_decoding(mixed):
    """Chunks of 8. R (prompt 4, output 10) runs; L (prompt 20) arrives at t1: chunks
    8, 8, 4 at t1-t3 (its first token at the end of t3). Each chunk joins the tree at once
    (4 + 8, 4 + 16, 4 + 20 cached tokens). Not mixed: R waits during the chunks; mixed:
    R decodes in the same steps."""
    s, _ = make(chunked_prefill_size=8, enable_mixed_chunk=mixed)
    s.add(req(0, range(4), 10), 0.0)
    step(s, 0)
    s.add(req(1, range(100, 120), 5), 1.0)
    chunks, decodes, tree = [], [], []
    for t in range(1, 4):
        x = step(s, t)
        chunks.append(x.chunks)
        decodes.append(ids(x.decode))
        tree.append(s.alloc.tree.total)
    assert chunks == [[8], [8], [4]]
    assert decodes == ([[0]] * 3 if mixed else [[]] * 3)
    assert tree == [12, 20, 24]  # (R's decoded tokens join the tree only when it finishes)
    g = next(g for g in s.running if g.request.request_id == 1)
    assert g.first_token == 4.0


def test_a_hit_skips_cached_tokens_and_at_least_one_token_is_computed():
    """(0..9) cached; a request with the same 10-token prompt hits 9 (one is computed)."""
    s, _ = make()
    cached(s, range(10))
    s.add(req(1, range(10), 3), 0.0)
    x = step(s, 1)
    assert x.chunks == [1] and x.cached_tokens == 9 and x.prefill[0].cached_tokens == 9


# --- config --------------------------------------------------------------------------
@pytest.mark.parametrize("extra, key", [
    ("scheduler: {schedule_policy: fcfs}", "schedule_policy: allowed only with policy sglang"),
    ("scheduler: {policy: vllm-v1, enable_mixed_chunk: true}", "enable_mixed_chunk: allowed only with policy sglang"),
    ("scheduler: {policy: sglang, long_prefill_token_threshold: 64}", "allowed only with policy vllm-v1"),
    ("scheduler: {policy: sglang}\nallocator: {watermark: 0.01}", "allocator.watermark"),
    ("scheduler: {policy: sglang}\nallocator: {prefix_caching: false}", "allocator.prefix_caching"),
    ("scheduler: {policy: sglang}\nallocator: {kind: contiguous}", "allocator.kind"),
    ("scheduler: {policy: sglang}\npreemption: {mode: swap}", "preemption.mode"),
    ("scheduler: {policy: sglang, batching: request}", "batching"),
    ("scheduler: {policy: sglang, schedule_policy: lof}", "schedule_policy"),
    ("scheduler: {policy: sglang, eviction_policy: lfu}", "renamed allocator.eviction_policy"),
    ("scheduler: {policy: sglang}\nallocator: {eviction_policy: mru}", "allocator.eviction_policy"),
    ("scheduler: {policy: sglang, chunked_prefill_size: 0}", "chunked_prefill_size"),
])
def test_config_errors_are_one_line_naming_the_key(tmp_path, extra, key):
    assert key in config_error(tmp_path, extra)


def test_sglang_config_defaults_and_round_trip(tmp_path):
    cfg, _ = load_config(config(tmp_path, "scheduler: {policy: sglang}\nallocator: {eviction_policy: lfu}"))
    a = cfg.allocator
    assert (a.block_size, a.prefix_caching, a.watermark, cfg.preemption.mode) == (1, True, 0, "recompute")
    assert cfg.max_num_batched_tokens == 16384 and cfg.scheduler.schedule_policy == "lpm"
    assert_round_trips(cfg, tmp_path)


def test_an_sglang_config_runs_end_to_end_and_hits_a_shared_unaligned_prefix(tmp_path):
    """A 37-token shared prefix (not a multiple of 16): the radix cache hits all 37 tokens
    of it for every request after the first; vLLM v1's block cache only 32."""
    text = CONFIG.format(extra="").replace("  num_requests: 60\n", "  num_requests: 60\n  shared_prefix: {tokens: 37}\n")
    p = tmp_path / "c.yaml"
    p.write_text(text + "scheduler: {policy: sglang}\n")
    cfg, base = load_config(p)
    r = run_experiment(cfg, base)
    assert r.summary["completed"] == 60
    cached_tokens = r.requests.sort_values("request_id")["cached_prompt_tokens"].tolist()
    assert cached_tokens[0] == 0 and min(cached_tokens[1:]) >= 37
    p.write_text(text + "scheduler: {policy: vllm-v1}\nallocator: {prefix_caching: true}\n")
    cfg1, _ = load_config(p)
    v1 = run_experiment(cfg1, base).requests.sort_values("request_id")["cached_prompt_tokens"].tolist()
    assert max(v1) == 32


def test_a_hit_locked_at_admission_no_longer_counts_as_evictable_memory():
    """40 slots. (100..109) is cached, unlocked; R (prompt 10, output 29) runs: 10 locked,
    20 free, 10 evictable; ratio ~0 (conservativeness 0.01: R reserves 0.007 x 28 = 0.2).
    N (prompt: (100..109) + 5 more, output 16) hits 10 and needs 5 + 16 = 21. Counting its
    own hit as evictable there would be 29.8; once the hit is locked only 19.8 are left:
    blocked, and its lock let go (the cache holds no lock of N)."""
    s, _ = make(capacity=40, schedule_conservativeness=0.01)
    cached(s, range(100, 110))
    s.add(req(0, range(10), 29), 0.0)
    step(s, 1)
    assert (s.alloc.free_slots, s.alloc.tree.evictable) == (20, 10)
    s.add(req(1, list(range(100, 110)) + [200, 201, 202, 203, 204], 16), 2.0)
    x = step(s, 2)
    assert ids(x.prefill) == [] and ids(x.decode) == [0] and s.blocked is Admission.NO_SPACE
    assert list(s.alloc.held) == [s.running[0].seq_ids[0]] and s.alloc.tree.evictable == 10


# --- random workloads: the books stay exact and every request ends ----------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(st.tuples(st.sampled_from([0, 0, 1, 3]), st.integers(0, 2), st.integers(1, 30), st.integers(1, 25)),
                min_size=1, max_size=14),
       page=st.sampled_from([1, 4]), policy=st.sampled_from(["lpm", "dfs-weight", "fcfs"]),
       chunk=st.sampled_from([None, 8]), mixed=st.booleans(), cons=st.sampled_from([1.0, 0.05]))
def test_random_workloads_keep_exact_books_and_finish(reqs, page, policy, chunk, mixed, cons):
    """Small cache (96 slots), shared prompt heads, bursts and gaps: after every step the
    radix cache's classes sum to capacity with exact lock counts; no request is lost, and
    every one finishes. (Conservativeness 0.05 overcommits memory: retractions.)"""
    s, ended = make(capacity=96, page=page, schedule_policy=policy, chunked_prefill_size=chunk,
                    enable_mixed_chunk=mixed, max_num_seqs=4, max_num_batched_tokens=40,
                    schedule_conservativeness=cons)
    arrivals, t_arr = [], 0
    for i, (gap, head, extra, out) in enumerate(reqs):
        t_arr += gap
        arrivals.append((t_arr, req(i, [1000 * head + j for j in range(12)] + [5000 + 100 * i + j for j in range(extra)],
                                    out, float(t_arr))))
    t = 0
    while (arrivals or s.has_work) and t < 2000:
        while arrivals and arrivals[0][0] <= t:
            s.add(arrivals.pop(0)[1], float(t))
        step(s, t)
        t += 1
    assert not arrivals and not s.has_work and len(ended) == len(reqs)
    assert all(g.status is Status.FINISHED for g in ended)
    assert s.alloc.held == {} and s.alloc.tree.total == s.alloc.tree.evictable


@pytest.mark.parametrize("sweep, points", [("sweep_mooncake.yaml", 4), ("sweep_fewshot.yaml", 8)])
def test_the_shipped_comparison_sweeps_are_valid(sweep, points):
    """configs/sglang_vs_vllm: every point (vLLM v1 and SGLang at page 1 and 16, mixed or
    not) resolves to a valid config, before anything runs."""
    spec = load_sweep(Path(__file__).parents[3] / "configs" / "sglang_vs_vllm" / sweep)
    pts = expand_points(spec)
    assert len(pts) == points
    validate_points(spec, pts)
