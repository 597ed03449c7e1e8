"""Rules of the SGLang scheduler (``simulator/sched/sglang.py``) that its other tests
leave open, written for the survivors of its mutation campaign (mutation/README.md): the
rejections at arrival word for word and at their boundaries, the construction errors, and
the new-token ratio's constants. Pages of one token unless said otherwise.
"""

from __future__ import annotations

from array import array

import pytest

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.simulator.sched.sequence import Status
from kvsim.simulator.sched.sglang import SchedulerSGLang, SGLangSettings
from kvsim.traces import Request


def make(capacity=200, page=1, **kw):
    kw.setdefault("max_num_batched_tokens", 1000)
    kw.setdefault("max_seq_len", 1024)
    ended = []
    s = SchedulerSGLang(RadixCacheAllocator(capacity, page), SGLangSettings(watermark=0, **kw), ended.append)
    return s, ended


def test_a_request_beyond_the_context_window_is_rejected_naming_both_numbers():
    """Context window 20: prompt 15 + output 5 = 20 fits (waits); + output 6 = 21 does not."""
    s, ended = make(max_seq_len=20)
    s.add(Request(0, 0.0, 15, 5), 0.0)
    s.add(Request(1, 0.0, 15, 6), 0.0)
    assert [g.request.request_id for g in s.waiting] == [0]
    assert ended[0].status is Status.REJECTED
    assert ended[0].reason == ("prompt + output = 21 tokens exceeds the context window "
                               "(model.context_len_tokens) 20")


def test_a_request_the_cache_can_never_hold_is_rejected_at_its_boundaries():
    """50 slots. Admission needs prompt + clipped output < the memory, and the whole KV
    (prompt + output - 1) must fit: prompt 30 + output 19 = 49 < 50 and 48 <= 50: waits;
    output 20: 50 is not < 50: rejected. With more than 4096 output tokens only the KV test
    can refuse: 10 + 4096 = 4106 < 4200 slots, but 10 + 4190 - 1 = 4199 <= 4200 waits, while
    10 + 4192 - 1 = 4201 > 4200 is rejected."""
    s, ended = make(capacity=50)
    s.add(Request(0, 0.0, 30, 19), 0.0)
    s.add(Request(1, 0.0, 30, 20), 0.0)
    assert [g.request.request_id for g in s.waiting] == [0]
    assert [(g.request.request_id, g.reason) for g in ended] == [(1, "needs more KV slots than the whole cache (50)")]
    s, ended = make(capacity=4200, max_seq_len=8192)
    s.add(Request(0, 0.0, 10, 4190), 0.0)
    s.add(Request(1, 0.0, 10, 4191), 0.0)  # KV 4200: fits exactly
    s.add(Request(2, 0.0, 10, 4192), 0.0)
    assert [g.request.request_id for g in s.waiting] == [0, 1]
    assert [(g.request.request_id, g.reason) for g in ended] == [(2, "needs more KV slots than the whole cache (4200)")]


def test_several_samples_are_rejected_with_the_reason():
    s, ended = make()
    s.add(Request(0, 0.0, 5, 5, n=2), 0.0)
    assert ended[0].status is Status.REJECTED and not s.waiting
    assert ended[0].reason == ("sglang runs one sequence per request (n=2, beam_width=1): "
                               "SGLang runs parallel samples as separate requests")


def test_construction_errors_word_for_word():
    with pytest.raises(ValueError) as e:
        SchedulerSGLang(PagedAllocator(10, 4), SGLangSettings(), lambda g: None)
    assert str(e.value) == "scheduler policy sglang needs the radix cache (RadixCacheAllocator)"
    with pytest.raises(ValueError) as e:
        make(schedule_policy="random")
    assert str(e.value) == "schedule_policy must be one of lpm, dfs-weight, fcfs, got 'random'"


@pytest.mark.parametrize("conservativeness, init, floor", [(1.0, 0.7, 0.098), (0.5, 0.35, 0.049),
                                                            (2.0, 1.0, 0.14), (10.0, 1.0, 0.14)])
def test_the_new_token_ratio_s_constants(conservativeness, init, floor):
    """SGLang's: initial ratio 0.7 x schedule_conservativeness, at most 1; floor 0.14 x the
    initial; decay (initial - floor) / 600 a decode step."""
    s, _ = make(schedule_conservativeness=conservativeness)
    assert s.init_ratio == pytest.approx(init) and s.new_token_ratio == s.init_ratio
    assert s.min_ratio == pytest.approx(floor)
    assert s.ratio_decay == pytest.approx((init - floor) / 600)


def test_retraction_stops_once_twenty_tokens_per_remaining_request_fit_exactly():
    """83 slots, conservativeness 0.01 (the reservation is negligible): A (prompt 5), B (6)
    and C (23), outputs 40, prefill one a step at 0, 1, 2 (each judged against the memory
    before its step) and decode together from 3. After 16 decode steps (generated 17 each)
    3 slots are left, after 17 only 1: at 19 the 3 tokens do not fit. C goes first (ties on
    generated: the longest prompt), freeing its 39 tokens: 40 available = 20 x 2 remaining,
    which is enough (the loop retracts while fewer than that are available): A and B stay.
    The ratio: min(1, (17 + 17 + 20 x 2) / (40 + 40 + 1)) = 74 / 81."""
    s, _ = make(capacity=83, schedule_conservativeness=0.01)
    for rid, (first, n) in enumerate(((0, 5), (100, 6), (200, 23))):
        s.add(Request(rid, 0.0, n, 40, token_ids=tuple(range(first, first + n))), 0.0)
    for t in range(19):
        x = s.schedule(float(t))
        s.complete(x, float(t + 1))
        assert x.preempted_recompute == 0
    assert s.alloc.available() == 1 and [g.gen_base for g in s.running] == [17, 17, 17]
    x = s.schedule(19.0)
    assert x.preempted_recompute == 1
    assert [g.request.request_id for g in x.decode] == [0, 1]
    assert [g.request.request_id for g in s.waiting] == [2]
    assert s.new_token_ratio == 74 / 81


def test_sglang_plans_no_runs_of_steps():
    """SGLang's scheduler forms every step itself (module docstring, "Speed"): the engine's
    fast path is never offered a run, and a run handed to it anyway is refused by name."""
    s, _ = make()
    s.add(Request(0, 0.0, 5, 10), 0.0)
    x = s.schedule(0.0)
    assert s.run_length(x, 100) == 0 and s.continue_length(100) == 0
    with pytest.raises(NotImplementedError) as e:
        s.complete_run(None, 1.0)
    assert str(e.value) == "sglang runs no macro-steps"


def test_a_last_request_without_a_slot_and_no_load_to_wait_for_stops_the_run_by_name():
    """Retraction keeps the last running request (there is nothing left to free). If its
    next token still finds no slot (here another holder takes the cache's last 35 slots
    behind the scheduler's back), the step raises, naming the request, as SGLang would abort
    it out of memory."""
    s, _ = make(capacity=40)
    s.add(Request(7, 0.0, 5, 10, token_ids=(1, 2, 3, 4, 5)), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    other = tuple(range(100, 135))
    s.alloc.open(999, other, 35, 35)
    assert s.alloc.extend(999, 35) and s.alloc.available() == 0
    with pytest.raises(RuntimeError) as e:
        s.schedule(1.0)
    assert str(e.value) == ("sglang: no KV slot for request 7's next token "
                            "(SGLang would abort it out of memory)")


def test_a_request_retracted_twice_counts_both_retractions_and_all_the_kv_it_dropped():
    """400 slots, conservativeness 0.1 (initial ratio 0.07): five requests overcommit the
    memory. At 68 the two with the fewest generated tokens, 0 (prompt 15, 58 generated:
    72 tokens of KV, the last token's not yet computed) and 2, are retracted; 0 comes back
    at 230 (computing 73 tokens again) beside request 1, whose growth the ratio
    under-reserved: at 279 0 is retracted again, now holding 121 tokens. Its counters add
    up both: 2 retractions, 72 + 121 recomputed tokens. Every request finishes."""
    s, ended = make(capacity=400, max_seq_len=2048, schedule_conservativeness=0.1)
    workload = [(4, 0, 39, 92), (3, 1, 7, 147), (1, 5, 9, 275), (2, 5, 23, 140), (0, 10, 15, 119)]
    dropped = []
    t = 0
    while t < 400 and (workload or s.has_work):
        while workload and workload[0][1] <= t:
            rid, arrival, prompt, out = workload.pop(0)
            s.add(Request(rid, float(arrival), prompt, out, token_ids=tuple(range(1000 * rid, 1000 * rid + prompt))),
                  float(t))
        kv = {g.request.request_id: s.alloc.kv_len(g.seq_ids[0]) for g in s.running}
        x = s.schedule(float(t))
        if x.preempted_recompute and 0 in kv and all(g.request.request_id != 0 for g in s.running):
            dropped.append((t, kv[0]))
        if not x.empty:
            s.complete(x, float(t + 1))
        t += 1
    assert dropped == [(68, 72), (279, 121)]
    assert {g.request.request_id: (g.preemptions, g.recomputed_tokens) for g in ended} == {
        4: (0, 0), 3: (0, 0), 2: (1, 83), 1: (0, 0), 0: (2, 193)}
    assert all(g.status is Status.FINISHED for g in ended)


def test_mixed_steps_decode_when_the_slots_left_are_exactly_enough_and_keep_the_ratio():
    """enable_mixed_chunk, chunks of 8, 27 slots, conservativeness 0.01 (ratio 0.007). R
    (prompt 4, output 10) prefills at 0. L (prompt 20, output 1) at 1 needs 20 + 1 < 23
    available less R's reservation and its next token (0.06 + 1): admitted, in chunks 8, 8,
    4 at 1, 2, 3, and R decodes beside each chunk while its token fits. At 3, after L's last
    chunk, R holds 6 slots and L 20: 1 is left, exactly R's token, so R decodes. Mixed steps
    are not decode steps: the ratio does not decay."""
    s, _ = make(capacity=27, chunked_prefill_size=8, enable_mixed_chunk=True, schedule_conservativeness=0.01)
    s.add(Request(0, 0.0, 4, 10, token_ids=(1, 2, 3, 4)), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    s.add(Request(1, 1.0, 20, 1, token_ids=tuple(range(100, 120))), 1.0)
    chunks, decodes = [], []
    for t in (1, 2, 3):
        x = s.schedule(float(t))
        chunks.append(x.chunks)
        decodes.append([g.request.request_id for g in x.decode])
        if t == 3:
            assert s.alloc.available() == 0
        s.complete(x, float(t + 1))
    assert chunks == [[8], [8], [4]] and decodes == [[0], [0], [0]]
    assert s.new_token_ratio == s.init_ratio == pytest.approx(0.007)


def test_a_chunk_is_cut_at_a_page_edge_except_the_last_that_fits_the_budget():
    """Pages of 4 tokens, chunks of 10 tokens. A prompt of 18: its first chunk is cut at
    the last page edge under 10 (8 tokens); the 10 left fit the next step's budget exactly,
    so they are computed at once (no cut: nothing follows them)."""
    s, _ = make(capacity=100, page=4, chunked_prefill_size=10)
    s.add(Request(0, 0.0, 18, 1, token_ids=tuple(range(18))), 0.0)
    chunks = []
    for t in range(3):
        x = s.schedule(float(t))
        chunks.append(x.chunks)
        if not x.empty:
            s.complete(x, float(t + 1))
    assert chunks == [[8], [10], []]


def test_a_recomputed_request_s_last_chunk_reserves_only_the_output_it_has_left():
    """96 slots, chunks of 8, conservativeness 0.05. Requests 0 (26 tokens, output 11) and
    2 (41 tokens, output 28) share their first 12 tokens; 1 (17 tokens, output 21) shares
    nothing. They decode together from 10; at 18 the slots run out and 2 and 0 (9 tokens
    generated each) are retracted; 1 runs alone to its end at 30. At 30 request 2 hits its
    41 cached prompt tokens and computes 8 of the 9 it had generated (the chunk budget). At
    31 the last one (1 slot) ends its prefill: it reserves the 28 - 9 = 19 tokens it has
    left to generate (not 28 + 9), so request 0,
    whose own 14 cached tokens it locks (32 available), fits: 9 to compute + 2 left to
    generate = 11 < 32 + 1 - (1 + 19); it gets the 7 tokens left of the chunk budget."""
    s, _ = make(capacity=96, chunked_prefill_size=8, schedule_conservativeness=0.05, max_num_batched_tokens=256)
    shared = list(range(12))
    workload = {0: [(0, shared + list(range(5000, 5014)), 11)],
                1: [(1, list(range(2000, 2012)) + list(range(5100, 5105)), 21),
                    (2, shared + list(range(5200, 5229)), 28)]}
    steps = {}
    for t in range(32):
        for rid, tokens, out in workload.get(t, ()):
            s.add(Request(rid, float(t), len(tokens), out, token_ids=tuple(tokens)), float(t))
        x = s.schedule(float(t))
        steps[t] = ([g.request.request_id for g in x.prefill], x.chunks, x.preempted_recompute)
        if not x.empty:
            s.complete(x, float(t + 1))
    assert steps[18][2] == 2
    assert steps[30] == ([2], [8], 0)
    assert steps[31] == ([2, 0], [1, 7], 0)


def test_plain_scheduler_settings_get_sglang_s_own_defaults():
    """Built from the shared ``SchedulerSettings`` (no SGLang knobs), the scheduler uses
    SGLang's defaults: lpm, chunks of 8192, no mixed chunks, conservativeness 1 (ratio 0.7)."""
    s = SchedulerSGLang(RadixCacheAllocator(100, 1), SchedulerSettings(watermark=0), lambda g: None)
    assert s.settings == SGLangSettings()
    assert (s.settings.schedule_policy, s.settings.chunked_prefill_size, s.init_ratio) == ("lpm", 8192, 0.7)


def test_token_sequences_are_held_packed_until_one_cannot_be():
    """Each waiting request's tokens are one int64 array (8 bytes a token) while every
    request's can be; a request whose tokens cannot (a named prefix) turns every held
    sequence and the tree's keys into tuples, with the same values."""
    s, _ = make()
    a = s.add(Request(0, 0.0, 4, 2, token_ids=(1, 2, 3, 4)), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    assert type(s._tokens[a]) is array and all(type(n.key) is array for n in s.alloc.tree.nodes())
    b = s.add(Request(1, 1.0, 4, 2, prefix_id="p", prefix_tokens=2), 1.0)
    assert type(s._tokens[a]) is tuple and type(s._tokens[b]) is tuple
    assert all(type(n.key) is tuple for n in s.alloc.tree.nodes())
    assert s._tokens[a] == (4, 8, 12, 16, ((0 << 40) + 4) * 4 + 3, ((0 << 40) + 5) * 4 + 3)
