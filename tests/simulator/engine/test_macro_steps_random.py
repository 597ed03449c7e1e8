"""Random small workloads: advancing runs of decode steps in closed form (and retiring the
requests that finish inside them) gives exactly what stepping one iteration at a time gives."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.metrics import summarize
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.traces import Request

ALLOCATORS = {
    "paged-1": lambda: PagedAllocator(3000, 1, swap_blocks=1500),
    "paged-4": lambda: PagedAllocator(700, 4, swap_blocks=300),
    "paged-16": lambda: PagedAllocator(180, 16, swap_blocks=80),
    "paged-16-prefix-cache": lambda: PagedAllocator(180, 16, swap_blocks=80, prefix_caching=True),
    "orca-oracle": lambda: ContiguousAllocator(3000, "buddy_exact", "oracle", 1024, 1500),
    "orca-max": lambda: ContiguousAllocator(4096, "buddy", "max", 1024, 2048),
}


@st.composite
def workloads(draw):
    count = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 2.0]), min_size=count, max_size=count))
    sharing = draw(st.sampled_from(["none", "samples", "beams", "prefix"]))
    reqs, t = [], 0.0
    for i, gap in enumerate(gaps):
        t += gap
        extra = {"samples": {"n": draw(st.sampled_from([2, 3]))}, "beams": {"beam_width": 2},
                 "prefix": {"prefix_id": f"p{draw(st.integers(0, 2))}", "prefix_tokens": 64}, "none": {}}[sharing]
        reqs.append(Request(i, t, draw(st.integers(1, 300)), draw(st.integers(1, 200)), **extra))
    return reqs


def simulate(reqs, alloc, macro, replicas, chain=True, window="busy", **limits):
    cost = lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])  # noqa: E731
    sim = Simulation(reqs, ALLOCATORS[alloc], cost, SchedulerSettings(max_seq_len=1024, **limits),
                     num_replicas=replicas, router="least_outstanding_tokens", macro_steps=macro,
                     chain_steps=chain, window=window)
    sim.run()
    itl = sim.replicas[0].scheduler.itl
    for r in sim.replicas[1:]:
        itl.merge(r.scheduler.itl)
    df = sim.request_rows.frame()
    return df, summarize(df, sim.steps.totals(), itl, sim.replicas[0].scheduler.alloc.capacity)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(list(ALLOCATORS)), st.sampled_from(["recompute", "swap", "auto"]),
       st.sampled_from(["same", "independent"]), st.sampled_from([1, 2, 3]), st.sampled_from([4, 8, 256]),
       st.sampled_from(["busy", "saturated"]))
def test_macro_steps_equal_single_steps_on_random_workloads(reqs, alloc, preemption, lengths, replicas, max_seqs,
                                                            window):
    kw = dict(preemption=preemption, sample_lengths=lengths, max_num_seqs=max_seqs, window=window)
    one, s_one = simulate(reqs, alloc, False, replicas, **kw)
    many, s_many = simulate(reqs, alloc, True, replicas, **kw)
    for col in ("status", "replica", "generated_tokens", "preemptions", "recomputed_tokens"):
        assert one[col].tolist() == many[col].tolist(), col
    for col in ("scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(one[col].to_numpy(float), many[col].to_numpy(float), rtol=1e-9, atol=1e-9,
                                   err_msg=col)
    for c in CLASSES:
        assert s_many[f"mem_{c}_perc"] == pytest.approx(s_one[f"mem_{c}_perc"], rel=1e-7, abs=1e-7), c
    for key in ("mean_batched_requests", "mean_itl_ms"):
        assert s_many[key] == pytest.approx(s_one[key], rel=1e-7, nan_ok=True), key


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(list(ALLOCATORS)), st.sampled_from(["recompute", "swap"]),
       st.sampled_from([1, 2]), st.booleans())
def test_going_on_without_yielding_changes_nothing(reqs, alloc, preemption, replicas, macro):
    """The engine skips SimPy's wake-up when no other event comes before a step ends;
    yielding after every step instead must give the very same numbers."""
    kw = dict(preemption=preemption, max_num_seqs=8)
    chained, s_chained = simulate(reqs, alloc, macro, replicas, chain=True, **kw)
    stepped, s_stepped = simulate(reqs, alloc, macro, replicas, chain=False, **kw)
    assert chained.equals(stepped)
    assert s_chained == s_stepped or all(
        a == b or (a != a and b != b) for a, b in zip(s_chained.values(), s_stepped.values()))
