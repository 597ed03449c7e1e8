"""Run one case through the fast engine and the reference engine and compare everything.

A *case* is a config dict (validated as an ``ExperimentConfig``) and a list of
``traces.Request``. ``assert_same(config, requests)`` fails listing the differences and
prints the case as code to paste into ``test_reference_regressions.py``::

    assert_same({...config...}, [Request(request_id=0, ...), ...])

Compared: every request's terminal state, replica, tokens, preemptions, recomputed and
swapped counts (exact) and its scheduled / first-token / finish times (1e-9 relative);
the step totals (iterations, busy time, every counter, recompute time, allocated and
unshared slot-seconds); each memory class and the batch size over the measurement
window; the inter-token-latency gaps (count and sum); copy-on-write, prefix-cache and
eviction counters per replica. With cache tiers (``allocator.tiers``): each request's
loaded tokens (exact) and load wait (1e-9 relative), and every tier's counters
(``TIER_COUNTERS``: blocks exact, bytes and link seconds 1e-9 relative).
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import HealthCheck, note, settings

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.runner import (
    make_allocator_factory,
    make_cost_factory,
    make_tier_factory,
    scheduler_settings,
)
from kvsim.simulator.engine.simulation import Simulation, SimulationStalled
from kvsim.simulator.reference.simulation import COUNTERS, simulate
from kvsim.simulator.reference.vllm import TIER_COUNTERS, ReferenceStalled
from kvsim.traces import Request

EXACT_COLUMNS = (
    "status",
    "replica",
    "generated_tokens",
    "total_output_tokens",
    "cached_prompt_tokens",
    "preemptions",
    "recomputed_tokens",
    "swapped_out_blocks",
    "swapped_in_blocks",
    "loaded_tokens",
)
TIME_COLUMNS = ("scheduled_s", "first_token_s", "finish_s", "load_wait_s")
RTOL = 1e-9


def case_source(config: dict | ExperimentConfig, requests: list[Request]) -> str:
    """The case as Python that reproduces it (paste into a regression test)."""
    if isinstance(config, ExperimentConfig):
        config = config.model_dump(mode="json", exclude_defaults=True)
    lines = ["assert_same(", f"    {config!r},", "    ["]
    lines += [f"        {r!r}," for r in requests]
    lines += ["    ],", ")"]
    return "\n".join(lines)


def run_fast(cfg: ExperimentConfig, requests: list[Request]) -> Simulation:
    sim = Simulation(
        requests,
        make_allocator_factory(cfg),
        make_cost_factory(cfg, Path(".")),
        scheduler_settings(cfg),
        cfg.hardware.num_replicas,
        cfg.scheduler.router,
        macro_steps=cfg.engine.macro_steps,
        overlap_swap=cfg.preemption.overlap_swap,
        keep_steps=cfg.metrics.step_table,
        window=cfg.metrics.measurement_window,
        make_tiers=make_tier_factory(cfg),  # None: no cache tiers
    )
    sim.run()
    return sim


def close(a: float, b: float, scale: float = 0.0) -> bool:
    """Equal to 1e-9 relative (or ``scale`` x 1e-9 absolute: sums of slot-seconds near 0)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=max(scale * RTOL, 1e-12))


def differences(config: dict | ExperimentConfig, requests: list[Request]) -> list[str]:
    """Everything the two engines disagree on (empty: they agree)."""
    cfg = (
        config if isinstance(config, ExperimentConfig) else ExperimentConfig.model_validate(config)
    )
    stalled = []  # a run where work remains that can never be scheduled must stall in both
    try:
        fast = run_fast(cfg, requests)
    except SimulationStalled:
        stalled.append("fast")
    try:
        ref = simulate(cfg, requests, make_cost_factory(cfg, Path(".")))
    except ReferenceStalled:
        stalled.append("reference")
    if stalled:
        return [] if len(stalled) == 2 else [f"only the {stalled[0]} engine stalled"]
    out: list[str] = []
    a, b = fast.request_rows.frame(), ref.requests
    if a["request_id"].tolist() != b["request_id"].tolist():
        return [
            f"request ids: fast {a['request_id'].tolist()} reference {b['request_id'].tolist()}"
        ]
    for col in EXACT_COLUMNS:
        for rid, x, y in zip(a["request_id"], a[col], b[col]):
            if x != y:
                out.append(f"request {rid} {col}: fast {x!r} reference {y!r}")
    for col in TIME_COLUMNS:
        for rid, x, y in zip(a["request_id"], a[col].to_numpy(float), b[col].to_numpy(float)):
            if not close(float(x), float(y)):
                out.append(f"request {rid} {col}: fast {x!r} reference {y!r}")
    if out:
        return out  # the steps follow from the requests: show the first cause
    t, r = fast.steps.totals(), ref.totals
    capacity = fast.replicas[0].scheduler.alloc.capacity
    slot_scale = capacity * max(t.busy_s, 1e-9)
    if int(t.counters["iterations"]) != r.iterations:
        out.append(f"iterations: fast {t.counters['iterations']} reference {r.iterations}")
    pairs = [
        ("busy_s", t.busy_s, r.busy_s, 0.0),
        ("recompute_time_s", t.recompute_time_s, r.recompute_time_s, 0.0),
        ("allocated_slot_s", t.allocated_slot_s, r.allocated_slot_s, slot_scale),
        ("unshared_slot_s", t.unshared_slot_s, r.unshared_slot_s, slot_scale),
        ("measured_s", t.measured_s, r.measured_s, t.busy_s),
    ]
    pairs += [(c, t.counters[c], r.counters[c], 0.0) for c in COUNTERS]
    pairs += [(f"measured {c}", t.measured[c], r.measured[c], slot_scale) for c in CLASSES]
    pairs.append(
        (
            "measured batched_requests",
            t.measured["batched_requests"],
            r.measured["batched_requests"],
            t.busy_s * 1000,
        )
    )
    for name, x, y, scale in pairs:
        if not close(float(x), float(y), scale):
            out.append(f"{name}: fast {x!r} reference {y!r}")
    # Inter-token latencies: every gap of every sequence (count exact, sum 1e-9).
    itl_count = sum(rep.scheduler.itl.count for rep in fast.replicas)
    itl_total = sum(rep.scheduler.itl.total for rep in fast.replicas)
    ref_count = sum(n for _, n in ref.itl)
    ref_total = sum(gap * n for gap, n in ref.itl)
    if itl_count != ref_count or not close(itl_total, ref_total, itl_total):
        out.append(
            f"ITL: fast {itl_count} gaps, {itl_total!r} s; "
            f"reference {ref_count} gaps, {ref_total!r} s"
        )
    for i, (fa, ra) in enumerate(
        zip((rep.scheduler.alloc for rep in fast.replicas), ref.allocators)
    ):
        for name in ("copied_blocks", "prefix_lookups", "prefix_hits", "evictions"):
            x, y = getattr(fa, name, 0), getattr(ra, name, 0)
            if x != y:
                out.append(f"replica {i} {name}: fast {x} reference {y}")
    if getattr(cfg.allocator, "tiers", None):
        out += tier_differences(fast.tier_stats(), ref.tier_stats)
    return out


def tier_differences(fast: dict, ref: dict) -> list[str]:
    """Per tier, the counters the engines disagree on (blocks exact, bytes and seconds 1e-9)."""
    if sorted(fast) != sorted(ref):
        return [f"tiers: fast {sorted(fast)} reference {sorted(ref)}"]
    out = []
    for name in ref:
        for c in TIER_COUNTERS:
            x, y = fast[name][c], ref[name][c]
            if not close(float(x), float(y)):
                out.append(f"tier {name} {c}: fast {x!r} reference {y!r}")
    return out


def assert_same(config: dict | ExperimentConfig, requests: list[Request]) -> None:
    diffs = differences(config, requests)
    if diffs:
        shown = "\n".join(diffs[:12])
        raise AssertionError(
            f"fast engine != reference:\n{shown}\n\nthe case, to paste into a regression "
            f"test:\n{case_source(config, requests)}"
        )


def differential_settings(max_examples: int, large_data: bool = True) -> settings:
    """The hypothesis settings of a differential test: ``max_examples`` cases, no deadline (a
    case runs both engines), no health check on slow draws, nor (``large_data``) on large
    ones."""
    checks = [HealthCheck.too_slow, HealthCheck.data_too_large] if large_data else [HealthCheck.too_slow]
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=checks)


def check_case(config: dict | ExperimentConfig, requests: list[Request]) -> None:
    """``assert_same``, with the case's source noted first (hypothesis prints it for the
    failing case, ready to paste into a regression test)."""
    note(case_source(config, requests))
    assert_same(config, requests)
