"""Every router sends each request where the reference's router does, under every policy:
three replicas of the quickstart's Azure conversation trace on a small KV cache, so the
replicas' loads differ and requests queue."""

from __future__ import annotations

import pytest
from ref_compare import assert_same
from test_reference_regressions import load

from kvsim.simulator.reference.simulation import simulate

ROUTERS = ("round_robin", "least_outstanding_tokens", "least_outstanding_requests", "least_kv_usage")
SETUPS = {
    "vllm-v0 paged": (),
    "vllm-v0 orca-pow2": ("allocator.kind=contiguous", "allocator.preset=orca-pow2"),
    "vllm-v1 prefix cache": ("scheduler.policy=vllm-v1", "allocator.prefix_caching=true", "preemption.mode=recompute"),
    "sglang": ("scheduler.policy=sglang", "preemption.mode=recompute"),
}


def three_replicas(router: str, *setup: str):
    return load("quickstart.yaml", "workload.window.num_requests=45", "hardware.kv_cache_gib=1",
                "hardware.num_replicas=3", "scheduler.max_num_seqs=16", f"scheduler.router={router}", *setup)


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("router", ROUTERS)
def test_the_fast_engine_routes_as_the_reference(router, setup):
    cfg, requests = three_replicas(router, *SETUPS[setup])
    assert_same(cfg, requests)


@pytest.mark.parametrize("router", ROUTERS[1:])
def test_each_load_measure_picks_its_own_replicas(router):
    """The measures disagree on this trace: each router's assignment differs from round
    robin's and from every other measure's (so a router reading the wrong load fails)."""
    assignments = {}
    for r in ROUTERS:
        cfg, requests = three_replicas(r)
        rows = simulate(cfg, requests).requests.sort_values("request_id")
        assignments[r] = tuple(rows["replica"])
    others = [a for name, a in assignments.items() if name != router]
    assert all(assignments[router] != a for a in others), router
