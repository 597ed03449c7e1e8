"""Macro-stepping (DESIGN.md "Performance principle") gives the results of stepping one
iteration at a time: same per-request metrics (to float tolerance), same memory breakdown."""

import random

import numpy as np
import pytest

from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.metrics import summarize
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.traces import Request


def poisson_trace(count, rate, seed, prompt=(10, 900), output=(1, 400), **extra):
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        out.append(Request(i, t, rng.randint(*prompt), rng.randint(*output), **extra))
    return out


def bursty_trace(n, seed):
    rng = random.Random(seed)
    return [Request(i, float(i // 40) * 3.0, rng.randint(5, 300), rng.randint(1, 200)) for i in range(n)]


ALLOCATORS = {
    "paged-16": lambda: PagedAllocator(900, 16, swap_blocks=400),
    "paged-1": lambda: PagedAllocator(14_000, 1, swap_blocks=6000),
    "orca-max": lambda: ContiguousAllocator(16_000, "buddy", "max", 2048, 8000),
    "orca-oracle": lambda: ContiguousAllocator(16_000, "buddy_exact", "oracle", 2048, 8000),
    "first-fit-pow2": lambda: ContiguousAllocator(16_000, "first_fit", "pow2", 2048, 8000),
}
TRACES = {
    "poisson": lambda: poisson_trace(500, 8.0, 1),
    "bursty": lambda: bursty_trace(400, 2),
    "samples": lambda: poisson_trace(150, 3.0, 3, n=3),
}


def run(requests, make_alloc, macro, **limits):
    limits.setdefault("max_seq_len", 2048)
    cost = lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])  # noqa: E731
    sim = Simulation(requests, make_alloc, cost, SchedulerSettings(**limits), macro_steps=macro)
    sim.run()
    df = sim.request_rows.frame()
    steps = sim.steps.frame()
    summary = summarize(df, steps, sim.replicas[0].scheduler.itl, sim.replicas[0].scheduler.alloc.capacity)
    return df, steps, summary


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("trace", list(TRACES))
@pytest.mark.parametrize("alloc", list(ALLOCATORS))
def test_macro_steps_equal_single_steps(alloc, trace, preemption):
    reqs = TRACES[trace]()
    one, steps_one, s_one = run(reqs, ALLOCATORS[alloc], macro=False, preemption=preemption)
    many, steps_many, s_many = run(reqs, ALLOCATORS[alloc], macro=True, preemption=preemption)
    assert steps_many["iterations"].sum() == steps_one["iterations"].sum() == len(steps_one)
    for col in ("status", "preemptions", "generated_tokens", "recomputed_tokens", "swapped_out_blocks"):
        assert one[col].tolist() == many[col].tolist(), col
    for col in ("scheduled_s", "first_token_s", "finish_s"):
        a, b = one[col].to_numpy(float), many[col].to_numpy(float)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=col)
    for c in CLASSES:
        assert s_many[f"mem_{c}_perc"] == pytest.approx(s_one[f"mem_{c}_perc"], rel=1e-9, abs=1e-9), c
    for key in ("mean_batched_requests", "mean_itl_ms", "normalized_latency_s_per_token"):
        assert s_many[key] == pytest.approx(s_one[key], rel=1e-9), key
    assert s_many["p99_itl_ms"] == pytest.approx(s_one["p99_itl_ms"], rel=2e-3)  # histogram buckets


def test_macro_steps_actually_merge_iterations():
    reqs = poisson_trace(300, 2.0, 5)
    _, steps, _ = run(reqs, ALLOCATORS["orca-max"], macro=True)
    assert steps["iterations"].max() > 10
    assert len(steps) < steps["iterations"].sum() / 3


@pytest.mark.parametrize("window", ["busy", "saturated", (5.0, 40.0)])
def test_totals_without_rows_equal_totals_from_rows(window):
    from kvsim.simulator.engine.step_log import StepTotals

    reqs = poisson_trace(400, 9.0, 7)
    sims = []
    for keep in (True, False):
        cost = lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])  # noqa: E731
        sim = Simulation(reqs, ALLOCATORS["paged-16"], cost, SchedulerSettings(max_seq_len=2048, preemption="swap"),
                         keep_steps=keep, window=window)
        sim.run()
        sims.append(sim)
    kept, online = sims[0].steps.totals(), sims[1].steps.totals()
    assert len(sims[1].steps.frame()) == 0 and kept.rows == online.rows > 0
    assert kept.measured_s > 0 and kept.measured_s < kept.busy_s or window == "busy"
    for name in ("busy_s", "recompute_time_s", "allocated_slot_s", "unshared_slot_s", "measured_s"):
        assert getattr(online, name) == pytest.approx(getattr(kept, name), rel=1e-9, abs=1e-9), name
    for c, v in kept.counters.items():
        assert online.counters[c] == pytest.approx(v, rel=1e-9, abs=1e-9), c
    for c, v in kept.measured.items():
        assert online.measured[c] == pytest.approx(v, rel=1e-9, abs=1e-6), c
    assert isinstance(StepTotals.from_frame(sims[0].steps.frame(), window), StepTotals)


def test_runs_go_on_past_finishes_when_nothing_waits():
    # Light load: nothing ever waits, so a run ends only at an arrival (or memory);
    # requests that finish inside it retire at their own time.
    reqs = poisson_trace(300, 1.0, 11, prompt=(10, 200), output=(20, 300))
    one, _, s_one = run(reqs, ALLOCATORS["paged-16"], macro=False)
    many, steps, s_many = run(reqs, ALLOCATORS["paged-16"], macro=True)
    assert (steps["waiting"] == 0).all()
    batch = steps["batched_requests"].to_numpy()
    assert (batch != np.round(batch)).any()  # some rows' batch shrank part-way: a finish inside the run
    # About one prefill row and one run row per request (a run no longer ends at each finish).
    assert len(steps) <= 2 * len(reqs) + 5
    np.testing.assert_allclose(one["finish_s"].to_numpy(float), many["finish_s"].to_numpy(float), rtol=1e-9)
    assert s_many["mean_batched_requests"] == pytest.approx(s_one["mean_batched_requests"], rel=1e-9)


@pytest.mark.parametrize("window", [(30.0, 60.0), (100.0, 101.0), (None, 45.5), (200.0, None)])
def test_runs_stop_at_an_explicit_windows_edges(window):
    # A row is in the window by its start: a run (which now goes on past finishes) must
    # not carry iterations across an edge, or the window's averages drift.
    reqs = poisson_trace(300, 1.0, 11, prompt=(10, 200), output=(20, 600))
    out = []
    for macro in (False, True):
        cost = lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])  # noqa: E731
        sim = Simulation(reqs, lambda: PagedAllocator(2000, 16), cost, SchedulerSettings(max_seq_len=2048),
                         macro_steps=macro, window=window)
        sim.run()
        out.append(summarize(sim.request_rows.frame(), sim.steps.frame(), sim.replicas[0].scheduler.itl,
                             2000 * 16, window=window))
    one, many = out
    assert many["measured_time_s"] == pytest.approx(one["measured_time_s"], rel=1e-9)
    for key in ["mean_batched_requests"] + [f"mem_{c}_perc" for c in CLASSES]:
        assert many[key] == pytest.approx(one[key], rel=1e-9, abs=1e-9), key
