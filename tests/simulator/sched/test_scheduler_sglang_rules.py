"""Rules of the SGLang scheduler (``simulator/sched/sglang.py``) that its other tests
leave open, written for the survivors of its mutation campaign (mutation/README.md): the
rejections at arrival word for word and at their boundaries, the construction errors, and
the new-token ratio's constants. Pages of one token unless said otherwise.
"""

from __future__ import annotations

import pytest

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
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
