"""The engine's own rules (simulator/engine/simulation.py), apart from the scheduling it drives.

1. A step's seconds: its batch, plus copy-on-write copies on the GPU, plus swap-out and
   swap-in transfers on the host link (``step_seconds``).
2. The router: round robin in replica order; ``least_outstanding_tokens`` picks the
   replica with the fewest prompt + output tokens of requests not yet ended (ties: the
   lowest index), and a request stops counting once it ends.
3. A replica that can never run its head request stops the run with a message that names
   the request, its sizes, why it is blocked and the queue lengths.
4. The garbage-collector threshold is raised only while the simulation runs.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model.base import BatchShape
from kvsim.simulator.engine.fast_path import FastPath, Lookahead, row_state
from kvsim.simulator.engine.simulation import Router, Simulation, SimulationStalled, step_seconds
from kvsim.simulator.engine.step_log import StepLog
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings, Step
from kvsim.traces import Request


def req(rid: int, t: float, prompt: int, output: int) -> Request:
    return Request(request_id=rid, arrival_time=t, prompt_tokens=prompt, output_tokens=output)


@pytest.mark.parametrize("cow, out_blocks, in_blocks", [(0, 0, 0), (3, 0, 0), (0, 2, 0), (0, 0, 5), (1, 2, 5)])
def test_step_seconds_add_copies_to_compute_and_both_swap_directions_to_the_link(fake_cost, cow, out_blocks,
                                                                                 in_blocks):
    """1 s per step + 1/4 s per decode sequence (2 of them): compute 1.5 s, plus 1/8 s per
    copied block. The link: 1/2 s per block and 1/16 s per slot, out and in alike (slots =
    4 per block here): 3/4 s per block moved, whichever way."""
    cost = fake_cost(step=1.0, per_decode_seq=0.25, copy_per_block=0.125, swap_per_block=0.5,
                     swap_per_slot=0.0625)
    step = Step(shape=BatchShape(decode_seqs=2, decode_context=10), cow_copies=cow,
                swap_out_blocks=out_blocks, swap_out_slots=4 * out_blocks, swap_in_blocks=in_blocks,
                swap_in_slots=4 * in_blocks)
    compute, link = step_seconds(cost, step)
    assert compute == 1.5 + 0.125 * cow
    assert link == 0.75 * (out_blocks + in_blocks)


def test_round_robin_goes_around_the_replicas_in_order():
    router = Router(["a", "b", "c"])  # only picked, never used: any objects do
    assert [router.pick(req(i, 0.0, 1, 1)) for i in range(5)] == ["a", "b", "c", "a", "b"]


def test_an_unknown_router_policy_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        Router([], "random")
    assert str(err.value) == ("router policy must be one of round_robin, least_outstanding_tokens, "
                              "least_outstanding_requests, least_kv_usage; got 'random'")


def sim(cost, requests, replicas=2, router="least_outstanding_tokens", make_alloc=None):
    """A run on ``replicas`` replicas of 64 one-token blocks, ``cost`` (a FakeCost class) at 1 s a step."""
    return Simulation(requests, make_alloc or (lambda: PagedAllocator(64, 1)), lambda: cost(step=1.0),
                      SchedulerSettings(max_seq_len=4096, watermark=0.0), num_replicas=replicas, router=router)


def test_least_outstanding_tokens_counts_requests_until_they_end(fake_cost):
    """Two replicas, 1 s per step. Request 0 (8 + 2 tokens) at t=0 goes to replica 0 (both
    hold 0: the lower index wins the tie). Request 1 (2 + 1) at t=0 goes to replica 1
    (0 < 10). Request 2 (1 + 1) at t=0.5: replica 0 holds 10, replica 1 holds 3: replica 1.
    Request 1 ends at t=1 (prefill gives its only token), request 2 at t=2; request 0 at
    t=2 (prefill, one decode). Request 3 at t=10: both hold 0 again, so replica 0; then
    request 4 at t=10 (replica 0 holds 2): replica 1."""
    s = sim(fake_cost, [req(0, 0.0, 8, 2), req(1, 0.0, 2, 1), req(2, 0.5, 1, 1), req(3, 10.0, 1, 1), req(4, 10.0, 1, 1)])
    s.run()
    rows = s.request_rows.frame().set_index("request_id")
    assert rows["replica"].to_dict() == {0: 0, 1: 1, 2: 1, 3: 0, 4: 1}
    assert [r.outstanding_tokens for r in s.replicas] == [0, 0]


def test_a_request_that_can_never_run_stops_the_run_and_says_why(fake_cost):
    """An allocator that never has room: nothing runs, the head request still waits, and
    the run stops with the request, its sizes, the reason and both queue lengths."""

    class NeverRoom(PagedAllocator):
        def check_admit(self, *args, **kwargs):
            return Admission.NO_SPACE

    s = sim(fake_cost, [req(3, 0.0, 10, 5), req(4, 0.0, 2, 2)], 1, "round_robin", lambda: NeverRoom(64, 16))
    with pytest.raises(SimulationStalled) as err:
        s.run()
    assert str(err.value) == (
        "replica 0: request 3 (prompt 10, output 5 tokens) can never be scheduled: nothing is running and it "
        f"still does not fit (blocked by {Admission.NO_SPACE}); 2 waiting, 0 swapped")


def test_the_gc_threshold_is_raised_only_during_the_run(monkeypatch, fake_cost):
    seen = []
    before = gc.get_threshold()
    s = sim(fake_cost, [req(0, 0.0, 2, 2)], 1, "round_robin")
    orig = s.env.run

    def run(*args, **kwargs):
        seen.append(gc.get_threshold())
        return orig(*args, **kwargs)

    monkeypatch.setattr(s.env, "run", run)
    s.run()
    assert seen == [(50_000, *before[1:])]
    assert gc.get_threshold() == before


def test_a_swapped_group_that_can_never_return_stops_the_run_and_is_named(fake_cost):
    """8 one-token blocks, swap preemption, an allocator that never lets a group swap back
    in. Requests 0 and 1 (prompt 2, output 4: 6 slots each at the end) hold 4 blocks after
    their prefill, 8 after two decodes; the third decode needs 2 more: request 1 (the later
    one) is swapped out and request 0 finishes alone. Then nothing runs, nothing waits and
    request 1 is swapped: the message names it."""

    class NoSwapIn(PagedAllocator):
        def check_swap_in(self, *args, **kwargs):
            return Admission.NO_SPACE

    s = Simulation([req(0, 0.0, 2, 4), req(1, 0.0, 2, 4)], lambda: NoSwapIn(8, 1, 16),
                   lambda: fake_cost(step=1.0), SchedulerSettings(max_seq_len=4096, watermark=0.0,
                                                                  preemption="swap"))
    with pytest.raises(SimulationStalled) as err:
        s.run()
    sched = s.replicas[0].scheduler
    assert [g.request.request_id for g in sched.swapped] == [1] and not sched.waiting
    assert str(err.value) == (
        "replica 0: request 1 (prompt 2, output 4 tokens) can never be scheduled: nothing is running and it "
        f"still does not fit (blocked by {sched.blocked}); 0 waiting, 1 swapped")


def test_an_arrival_at_the_end_of_a_run_is_routed_before_the_run_completes(fake_cost):
    """Two replicas, least outstanding tokens, 1 s per step. Request 0 (prompt 1, output 3,
    4 tokens) goes to replica 0: prefill [0, 1), decodes [1, 2) and [2, 3): it ends at t=3.
    Request 1 arrives at t=3 exactly, the end of replica 0's run. The run stops at the
    arrival, and the arrival is handled first (its event was due before the engine's): it
    still sees request 0's 4 tokens on replica 0 and goes to replica 1, as one step at a
    time would route it."""
    rows = {}
    for macro in (True, False):
        s = Simulation([req(0, 0.0, 1, 3), req(1, 3.0, 1, 1)], lambda: PagedAllocator(64, 1),
                       lambda: fake_cost(step=1.0), SchedulerSettings(max_seq_len=4096, watermark=0.0),
                       num_replicas=2, router="least_outstanding_tokens", macro_steps=macro)
        s.run()
        rows[macro] = s.request_rows.frame().set_index("request_id")
        assert rows[macro].loc[0, "finish_s"] == 3.0
    assert rows[True]["replica"].to_dict() == rows[False]["replica"].to_dict() == {0: 0, 1: 1}


def defaults_and(fake_cost, requests, **settings):
    """A one-replica run with the engine's defaults, but for ``settings``; counts SimPy timeouts."""
    s = Simulation(requests, lambda: PagedAllocator(4096, 16), lambda: fake_cost(step=1.0),
                   SchedulerSettings(max_seq_len=4096, watermark=0.0), **settings)
    timeouts = []
    make = s.env.timeout
    s.env.timeout = lambda delay, *a, **k: timeouts.append(delay) or make(delay, *a, **k)
    s.run()
    return s.steps.frame(), len(timeouts)


def test_by_default_identical_iterations_share_a_row(fake_cost):
    """One request, prompt 1, output 3000: a prefill row, then one row for all 2999 decode
    iterations (in closed-form parts of at most 1024, which the row does not show)."""
    steps, _ = defaults_and(fake_cost, [req(0, 0.0, 1, 3000)])
    assert steps["iterations"].tolist() == [1, 2999]
    single, _ = defaults_and(fake_cost, [req(0, 0.0, 1, 3000)], macro_steps=False)
    assert len(single) == 3000 and single["iterations"].eq(1).all()


def test_by_default_steps_chain_without_yielding_to_simpy(fake_cost):
    """Two requests 100 s apart, 3 steps each, one row per step. Stepping through SimPy
    takes one timeout per step plus the second arrival's wait (7); chained, the engine
    yields only when an event could come first or to catch SimPy up before it sleeps
    (fewer). Same rows either way."""
    requests = [req(0, 0.0, 4, 3), req(1, 100.0, 4, 3)]
    chained, chained_timeouts = defaults_and(fake_cost, requests, macro_steps=False)
    stepped, stepped_timeouts = defaults_and(fake_cost, requests, macro_steps=False, chain_steps=False)
    assert chained.equals(stepped) and len(stepped) == 6
    assert stepped_timeouts == 1 + 6 and chained_timeouts < stepped_timeouts


def test_a_step_that_starts_on_a_window_edge_plans_its_run_to_the_next_edge(fake_cost):
    """1 s per step, a measurement window [2, 100). One request, prompt 1, output 10:
    prefill [0, 1); the decode step at 1 may not cross the edge at 2, so it stands alone
    [1, 2); the step at 2 starts *on* the edge, which is behind it: its run goes on to the
    end, [2, 10), 8 iterations in one row."""
    s = Simulation([req(0, 0.0, 1, 10)], lambda: PagedAllocator(64, 1), lambda: fake_cost(step=1.0),
                   SchedulerSettings(max_seq_len=4096, watermark=0.0), window=(2.0, 100.0))
    s.run()
    steps = s.steps.frame()
    assert steps["start_s"].tolist() == [0.0, 1.0, 2.0]
    assert steps["iterations"].tolist() == [1, 1, 8]


def test_with_a_request_waiting_a_later_arrival_does_not_cut_the_run(fake_cost):
    """8 one-token blocks, 1 s per step. Request 0 (prompt 2, output 6) runs; request 1
    (prompt 7) waits from t=0: 7 blocks never free up while request 0 holds its 2 or more.
    Request 2 (prompt 1) arrives at t=3.5 and queues behind it (FCFS), so it cannot be
    admitted either: request 0's decodes [1, 6) stay one run, one row of 5 iterations."""
    s = Simulation([req(0, 0.0, 2, 6), req(1, 0.0, 7, 1), req(2, 3.5, 1, 1)], lambda: PagedAllocator(8, 1),
                   lambda: fake_cost(step=1.0), SchedulerSettings(max_seq_len=4096, watermark=0.0))
    s.run()
    steps = s.steps.frame()
    first = steps[steps["start_s"] < 6.0]
    assert first["start_s"].tolist() == [0.0, 1.0] and first["iterations"].tolist() == [1, 5]
    rows = s.request_rows.frame().set_index("request_id")
    assert rows.loc[0, "finish_s"] == 6.0 and rows.loc[1, "scheduled_s"] == 6.0


@pytest.mark.parametrize("swap_per_block", [0.25, 2.0])
def test_an_overlapped_swap_lasts_the_longer_of_compute_and_transfer(fake_cost, swap_per_block):
    """8 one-token blocks, swap preemption, 1 s per step. Requests 0 and 1 (prompt 2,
    output 4) hold 8 blocks after two decodes; the third decode swaps request 1 out (4
    blocks: 1 s or 8 s of transfer). With the transfer overlapping the compute, that row
    lasts max(1, transfer); without, 1 + transfer."""
    for overlap in (True, False):
        s = Simulation([req(0, 0.0, 2, 4), req(1, 0.0, 2, 4)], lambda: PagedAllocator(8, 1, 16),
                       lambda: fake_cost(step=1.0, swap_per_block=swap_per_block),
                       SchedulerSettings(max_seq_len=4096, watermark=0.0, preemption="swap"), overlap_swap=overlap)
        s.run()
        steps = s.steps.frame()
        out = steps[steps["swap_out_blocks"] > 0]
        assert out["swap_out_blocks"].tolist() == [4] and out["swap_s"].tolist() == [4 * swap_per_block]
        transfer = 4 * swap_per_block
        assert out["duration_s"].tolist() == [max(1.0, transfer) if overlap else 1.0 + transfer]


def test_a_fast_path_on_its_own_merges_runs_of_at_most_1024_iterations(fake_cost):
    """``FastPath``'s defaults (the engine passes its own): macro steps on, closed-form parts
    of at most 1024 iterations, swaps not overlapped, rows from ``row_state``. One request
    (prompt 1, output 3000) after its prefill: the decode step plans 1024 more iterations."""
    sched = Scheduler(PagedAllocator(4096, 16), SchedulerSettings(max_seq_len=4096, watermark=0.0), lambda g: None)
    sched.add(req(0, 0.0, 1, 3000), 0.0)
    cost = fake_cost(step=1.0)
    fast = FastPath(SimpleNamespace(index=0, scheduler=sched), cost, StepLog(keep_rows=True), Lookahead())
    assert fast.overlap_swap is False and fast.state is row_state
    prefill = sched.schedule(0.0)
    done = fast.run(prefill, 0.0, 1.0, 0.0)
    done.complete(sched, done.end)
    run = fast.plan(sched.schedule(done.end), done.end, 1.0, 0.0)
    assert run.weights is not None and run.weights.steps == 1024
