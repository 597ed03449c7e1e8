"""``max_num_seqs`` and the token budget (``max_num_batched_tokens``) on each admission path:
a fresh prefill, and the prefill of a group preempted by recomputation (its prompt now
holds the tokens it had generated). Swap-in is covered in ``test_swap``."""

import pytest

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.config import ConfigError, validate_config
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.traces import Request


@pytest.mark.parametrize("n, max_num_seqs", [(1, 2), (2, 3)])
def test_max_num_seqs_holds_back_a_prefill(tiny, paged, n, max_num_seqs):
    # Requests of n sequences, prompt 4, output 2; the limit admits two of them (n=1)
    # or one (n=2: 2 + 2 > 3) at t=0.
    #   n=1: step 1 [0,1] prefills R0, R1; step 2 [1,2] decodes them (they end at 2);
    #        R2 prefills [2,3] and decodes [3,4]: it ends at 4.
    #   n=2: R0 alone [0,1], decode [1,2] ends at 2; R1 [2,3], [3,4] ends at 4.
    reqs = [Request(i, 0.0, 4, 2, n=n) for i in range(3 if n == 1 else 2)]
    out = tiny(reqs, paged(64, 4), max_num_seqs=max_num_seqs)
    r = out.requests
    last = len(reqs) - 1
    assert r.loc[last, "scheduled_s"] == 2.0
    assert r.loc[last, "first_token_s"] == 3.0
    assert r.loc[last, "finish_s"] == 4.0
    assert (r.loc[:last - 1, "finish_s"] == 2.0).all()


def test_token_budget_splits_prefills(tiny, paged):
    # Budget 10 tokens, three prompts of 4 (output 2) at t=0:
    #   step 1 [0,1] prefills R0, R1 (8 tokens; + 4 = 12 > 10 holds R2 back);
    #   step 2 [1,2] prefills R2 alone (a prefill step: R0 and R1 do not decode);
    #   step 3 [2,3] decodes all three: each has its 2 tokens and ends at 3.
    out = tiny([Request(i, 0.0, 4, 2) for i in range(3)], paged(64, 4), max_num_batched_tokens=10)
    r, steps = out.requests, out.steps
    assert list(r["first_token_s"]) == [1.0, 1.0, 2.0]
    assert list(r["finish_s"]) == [3.0, 3.0, 3.0]
    assert list(steps.loc[steps.prefill_tokens > 0, "prefill_tokens"]) == [8, 4]
    first = out.cost.shapes[0]  # two prompts of 4 in one step: 2 x (4 x 5 / 2) pairs
    assert (first.prefill_seqs, first.prefill_tokens, first.prefill_attn_pairs) == (2, 8, 20)


@pytest.mark.parametrize("macro_steps", [True, False])
def test_a_recomputed_prompt_counts_its_generated_tokens_against_the_budget(tiny, paged, macro_steps):
    # Paged, block size 1, 10 blocks, recompute; budget 8 tokens.
    #   R0, R1: prompt 4, output 6 (t=0); R2: prompt 4, output 1 (t=0.5).
    #   step 1 [0,1] prefill R0, R1 (8 tokens, 8 blocks). R2 arrives, cannot fit (2 free).
    #   step 2 [1,2] both append: free 0.
    #   step 3 at 2: both need a block: the latest, R1, is preempted (5 slots dropped) and
    #     waits at the front with prompt 4 + 2 generated = 6. R0 appends. free 4.
    #   steps 4-6: R1 needs 6 blocks; R0 decodes to its 6th token and ends at 6.
    #   step 7 [6,7] prefills R1 (6 tokens); R2 would make 6 + 4 = 10 > 8: it waits.
    #   step 8 [7,8] prefills R2, whose one token ends it at 8.
    #   steps 9-11 R1 decodes tokens 4, 5, 6: it ends at 11.
    reqs = [Request(0, 0.0, 4, 6), Request(1, 0.0, 4, 6), Request(2, 0.5, 4, 1)]
    out = tiny(reqs, paged(10, 1), macro_steps=macro_steps, preemption="recompute", max_num_batched_tokens=8)
    r, steps = out.requests, out.steps
    assert list(r["finish_s"]) == [6.0, 11.0, 8.0]
    assert r.loc[1, "preemptions"] == 1 and r.loc[1, "recomputed_tokens"] == 5
    assert r.loc[1, "first_token_s"] == 1.0  # the first token is not re-timed by the recompute
    assert r.loc[2, "first_token_s"] == 8.0
    assert steps["recompute_tokens"].sum() == 6
    assert list(steps.loc[steps.prefill_tokens > 0, "prefill_tokens"]) == [8, 6, 4]
    # ITL: R0's tokens at 1..6: five gaps of 1. R1's at 1, 2, then 7 (its re-prefill samples
    # its 3rd token: one gap of 5 across the preemption), 9 (step 8 was R2's prefill), 10, 11.
    assert out.itl.count == 5 + 5
    assert out.summary["mean_itl_ms"] == pytest.approx((5 * 1 + 1 + 5 + 2 + 1 + 1) / 10 * 1000)


def test_a_budget_below_max_num_seqs_is_rejected_by_the_config():
    # A decode step is one token per running sequence, so with more sequences than the
    # budget a decode step or a swap-in would exceed it: vLLM refuses such limits, so does kvsim.
    raw = {"name": "limits", "model": {"name": "opt-13b"}, "hardware": {"gpu": "a100-40gb", "kv_cache_gib": 12},
           "workload": {"arrivals": {"kind": "poisson", "rate": 1.0}, "lengths": {"kind": "preset", "name": "alpaca-paper"},
                        "num_requests": 4},
           "scheduler": {"max_num_seqs": 4096}}
    with pytest.raises(ConfigError, match=r"scheduler.max_num_batched_tokens \(2048\) must be >= scheduler.max_num_seqs"
                                          r" \(4096\)"):
        validate_config(raw)
    raw["scheduler"] = {"max_num_seqs": 2048}
    assert validate_config(raw).scheduler.max_num_seqs == 2048


def test_nothing_blocks_once_every_waiting_group_is_admitted():
    # ``Scheduler.blocked`` says why the head of the queue waits, and None when nothing does.
    # 4 blocks of 4: R0 (prompt 4, 2 tokens) takes 1; R1's prompt of 13 needs 4: it waits
    # until R0 ends after its decode step, then it is admitted and nothing waits.
    sched = Scheduler(PagedAllocator(4, 4), SchedulerSettings(max_seq_len=64, watermark=0.0), lambda g: None)
    sched.add(Request(0, 0.0, 4, 2), 0.0)
    sched.add(Request(1, 0.0, 13, 2), 0.0)
    sched.complete(sched.schedule(0.0), 1.0)
    assert sched.blocked is Admission.NO_SPACE
    sched.complete(sched.schedule(1.0), 2.0)
    step = sched.schedule(2.0)
    assert [g.request.request_id for g in step.prefill] == [1]
    assert sched.blocked is None
