"""From a validated config to a finished simulation and its tables."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported where a frame is read: a run starts without pandas)
    import pandas as pd

from kvsim.policies.kv_allocator import KVAllocator
from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator, contiguous_preset
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.tiers.cache_tier import CacheTier
from kvsim.policies.tiers.tier_stack import Level, TierLink, TierStack
from kvsim.simulator.capacity import swap_slots
from kvsim.simulator.config import ConfigError, ExperimentConfig
from kvsim.simulator.cost_model.base import CostModel, Deployment
from kvsim.simulator.cost_model.catalogue import GiB
from kvsim.simulator.cost_model.roofline import RooflineCostModel, RooflineParams
from kvsim.simulator.engine.metrics import summarize
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.latency_histogram import LatencyHistogram
from kvsim.simulator.sched.policy_registry import policy_entry
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.simulator.workload import build_requests
from kvsim.traces import Request


@dataclass
class RunResult:
    """A finished run: its config, summary (dict), per-request and per-step tables.

    ``warnings``: one line each, for a run that is legitimate but degenerate (no request
    completed, an empty workload): the CLI prints them, and ``--strict`` makes them fail.
    """

    config: ExperimentConfig
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    wall_s: float
    warnings: list[str] = field(default_factory=list)


def allocator_settings(cfg: ExperimentConfig) -> tuple[str, str, bool]:
    """(placement, reservation, request_level_batching) after applying a preset."""
    a = cfg.allocator
    if a.kind == "paged":  # no regions to place or size
        return "", "", cfg.scheduler.batching == "request"
    if a.preset is not None:
        p = contiguous_preset(a.preset)
        return p.placement, p.reservation, p.request_level_batching
    return a.placement, a.reservation, cfg.scheduler.batching == "request"


def make_allocator_factory(cfg: ExperimentConfig) -> Callable[[], KVAllocator]:
    slots = cfg.kv_slots
    swap = swap_slots(cfg.hardware.swap_space_gib, cfg.hardware.tensor_parallel, cfg.model.spec)
    a = cfg.allocator
    if a.kind == "paged":
        B = a.block_size
        entry = policy_entry(cfg.scheduler.policy)  # its cache: vLLM v1's free queue, SGLang's radix tree
        cache = entry.paged_cache
        if cache is not None and (a.prefix_caching or not entry.cache_needs_prefix_caching):
            return lambda: cache(slots // B, B, a.eviction_policy)
        return lambda: PagedAllocator(slots // B, B, swap // B, prefix_caching=a.prefix_caching,
                                      eviction=a.eviction_policy)
    placement, reservation, _ = allocator_settings(cfg)
    max_len = a.reserve_tokens or cfg.model.context_len
    return lambda: ContiguousAllocator(slots, placement, reservation, max_len, swap)


def make_tier_factory(cfg: ExperimentConfig) -> Callable[[], TierStack] | None:
    """Each replica's cache tiers (``allocator.tiers``), or None when there are none."""
    tiers = getattr(cfg.allocator, "tiers", None)
    if not tiers:
        return None
    B = cfg.allocator.block_size
    block_bytes = B * cfg.model.spec.kv_bytes_per_token  # one block of the whole replica's KV

    def make() -> TierStack:
        levels = [Level(CacheTier(t.name, int(t.capacity_gib * GiB // block_bytes), t.eviction_policy),
                        TierLink(t.link_bandwidth, t.link_latency), t.write_policy, t.write_after_hits or 0)
                  for t in tiers]
        return TierStack(levels, B, block_bytes)
    return make


def tier_summary(sim: Simulation, requests: pd.DataFrame, policy: str) -> dict:
    """Per tier: hit ratio over the GPU cache's lookups and every counter; the TTFT split."""
    out: dict = {}
    lookups = sum(getattr(r.scheduler.alloc, "prefix_lookups", 0) for r in sim.replicas)
    unit = policy_entry(policy).tier_hit_unit  # what the policy's cache counts its lookups in
    for name, c in sim.tier_stats().items():
        out[f"tier_{name}_hit_ratio"] = c[unit] / lookups if lookups else 0.0
        out.update({f"tier_{name}_{k}": v for k, v in c.items()})
    done = requests[requests["status"] == "finished"]
    if len(done):
        load = done["load_wait_s"]
        queue = done["scheduled_s"] - done["arrival_s"] - load
        prefill = done["first_token_s"] - done["scheduled_s"]
        for part, v in (("queue", queue), ("load", load), ("prefill", prefill)):
            out[f"mean_ttft_{part}_ms"] = float(v.mean()) * 1000
    return out


def make_cost_factory(cfg: ExperimentConfig, base_dir: Path) -> Callable[[], CostModel]:
    c, hw = cfg.cost_model, cfg.hardware
    kernel = "paged" if cfg.allocator.kind == "paged" else "contiguous"
    block = policy_entry(cfg.scheduler.policy).kernel_block(cfg.allocator.block_size if kernel == "paged" else 1)
    deployment = Deployment(cfg.model.spec, hw.spec, hw.tensor_parallel, block, kernel, hw.pcie, hw.link, c.host_time,
                            cfg.expert_group)
    if c.kind == "calibrated":
        from kvsim.simulator.cost_model.calibrated import CalibratedCostModel, load_profile_for

        profile = load_profile_for(c.profile, base_dir)
        params = RooflineParams(step_overhead_s=c.step_overhead_s)
        return lambda: CalibratedCostModel(profile, deployment, swap_batched=c.swap_batched,
                                           params=params)
    if c.kind == "profiled":
        from kvsim.simulator.cost_model.profiled import profiled_cost_factory

        overhead = c.step_overhead_s or 0.0  # unset: the GPU's work only
        return profiled_cost_factory(c.profile, base_dir, deployment, swap_batched=c.swap_batched,
                                     step_overhead_s=overhead)
    params = c.params()
    return lambda: RooflineCostModel(cfg.model.spec, hw.spec, hw.tensor_parallel, block, kernel, params, hw.pcie,
                                     hw.link, c.host_time, cfg.expert_group)


def scheduler_settings(cfg: ExperimentConfig) -> SchedulerSettings:
    _, _, request_level = allocator_settings(cfg)
    sc = cfg.scheduler
    make = policy_entry(sc.policy).settings
    return make(**sc.policy_keys(),  # the policy's own knobs ride along (none for vllm-v0)
        max_num_seqs=cfg.scheduler.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_seq_len=cfg.model.context_len,
        watermark=cfg.allocator.watermark,
        request_level_batching=request_level,
        preemption=cfg.preemption.mode,
        swap_fallback=cfg.preemption.swap_fallback,
        sample_lengths=cfg.decoding.sample_lengths,
        beam_concentration=cfg.decoding.beam_concentration,
        seed=cfg.seed,
        policy=cfg.scheduler.policy,
    )


def allocator_stats(allocators: list[KVAllocator], kv_bytes_per_token: int, summary: dict) -> dict:
    """Prefix-cache and traffic counters summed over replicas."""
    lookups = sum(getattr(a, "prefix_lookups", 0) for a in allocators)
    hits = sum(getattr(a, "prefix_hits", 0) for a in allocators)
    return {
        "prefix_cache_lookups": lookups,
        "prefix_cache_hit_ratio": hits / lookups if lookups else 0.0,
        "prefix_cache_evictions": sum(getattr(a, "evictions", 0) for a in allocators),
        "swap_out_bytes": summary.get("swap_out_slots", 0) * kv_bytes_per_token,
        "swap_in_bytes": summary.get("swap_in_slots", 0) * kv_bytes_per_token,
    }


def expected_requests(cfg: ExperimentConfig) -> int | None:
    """How many requests the workload will hold, when the config says (for a progress bar)."""
    w = cfg.workload
    counts = [n for n in (w.num_requests, w.window.num_requests if w.window else None) if n is not None]
    return min(counts) if counts and w.duration_s is None else None


def expected_duration_s(cfg: ExperimentConfig) -> float | None:
    """Simulated seconds the arrivals span, when the config says (a progress bar's total)."""
    w = cfg.workload
    spans = [d for d in (w.duration_s, w.window.duration_s if w.window else None) if d is not None]
    return min(spans) if spans else None


def run_warnings(cfg: ExperimentConfig, summary: dict, requests: pd.DataFrame) -> list[str]:
    """Lines for a run whose numbers mean little although nothing failed."""
    out = []
    n = len(requests)
    if n == 0:
        out.append(f"{cfg.name}: the workload holds no request (check workload.window and the trace)")
    elif not summary.get("completed"):
        parts = [f"{int(summary.get(k) or 0)} {k}" for k in ("rejected", "aborted") if summary.get(k)]
        import pandas as pd

        reasons = requests["reason"].dropna() if "reason" in requests else pd.Series(dtype=object)
        reasons = reasons[reasons.astype(str) != ""]
        why = f"; first reason: {reasons.iloc[0]}" if len(reasons) else ""
        out.append(f"{cfg.name}: no request completed ({', '.join(parts) or 'none finished'} of {n}){why}")
    if cfg.metrics.measurement_window == "saturated" and summary.get("busy_time_s") and \
            not summary.get("measured_time_s"):
        out.append(f"{cfg.name}: metrics.window 'saturated' is empty (no step had a request waiting): the memory "
                   "classes and mean batch are over no time and read 0; use window: busy")
    return out


def check_window(cfg: ExperimentConfig, totals, end_s: float) -> None:
    """An explicit measurement window that holds no engine step would make every memory
    metric 0: that is a wrong setting (after the end of the run, or between its steps)."""
    window = cfg.metrics.measurement_window
    if isinstance(window, tuple) and totals.busy_s > 0 and totals.measured_s <= 0:
        start, end = window
        raise ConfigError(
            f"metrics: window [{start or 0:g}, {'end' if end is None else format(end, 'g')}] s holds no engine step "
            f"(the run ends at {end_s:.6g} s of simulated time): every memory metric would be 0; "
            "move metrics.window_start_s / window_end_s inside the run")


def add_communication(summary: dict, steps: pd.DataFrame, counters: dict, cost: CostModel) -> None:
    """Communication as its own part of the run, where the replica's GPUs communicate (tensor
    parallel): ``communication_time_s`` in the summary and a ``communication_s`` column in
    the step table (seconds of each row's duration spent in collectives). A step's
    collectives are affine in its tokens (``CostModel.communication_coefficients``) and every
    row holds tokens, so a row of ``iterations`` steps spends ``iterations x fixed + per_token x
    (prefill_tokens + decode_tokens)``. On one GPU neither appears (results as before)."""
    fixed, per_token = cost.communication_coefficients()
    if not (fixed or per_token):
        return
    summary["communication_time_s"] = (fixed * counters["iterations"]
                                       + per_token * (counters["prefill_tokens"] + counters["decode_tokens"]))
    if len(steps):
        steps["communication_s"] = fixed * steps["iterations"] + per_token * (steps["prefill_tokens"]
                                                                              + steps["decode_tokens"])


def run_experiment(cfg: ExperimentConfig, base_dir: Path = Path("."),
                   requests: Iterable[Request] | None = None, progress=None) -> RunResult:
    """Simulate ``cfg`` (its workload, unless ``requests`` are given) and summarize.

    ``progress``: a :class:`simulator.app.run_progress.RunProgress` to show how far the run is.
    """
    t0 = time.perf_counter()
    if requests is None:
        requests = build_requests(cfg.workload, base_dir=base_dir, seed=cfg.seed, max_seq_len=cfg.model.context_len)
    sim = Simulation(requests, make_allocator_factory(cfg), make_cost_factory(cfg, base_dir),
                     scheduler_settings(cfg), cfg.hardware.num_replicas, cfg.scheduler.router,
                     macro_steps=cfg.engine.macro_steps, overlap_swap=cfg.preemption.overlap_swap,
                     keep_steps=cfg.metrics.step_table, window=cfg.metrics.measurement_window,
                     make_tiers=make_tier_factory(cfg))
    if progress is not None:
        progress.watch(sim)
    sim.run()
    totals = sim.steps.totals()
    check_window(cfg, totals, sim.env.now)
    req_df = sim.request_rows.frame()
    steps = sim.steps.frame()  # empty when metrics.step_table is off
    itl = LatencyHistogram()
    for r in sim.replicas:
        itl.merge(r.scheduler.itl)
    capacity = sim.replicas[0].scheduler.alloc.capacity
    summary = summarize(req_df, totals, itl, capacity, cfg.metrics.slo_ttft_ms, cfg.metrics.slo_tpot_ms)
    summary["kv_capacity_slots"] = capacity
    summary["kv_num_gpu_blocks"] = capacity // cfg.allocator.block_size  # per replica, as vLLM logs it
    add_communication(summary, steps, totals.counters, sim.replicas[0].cost)
    if cfg.cost_model.kind == "profiled":  # step-time lookups outside the profile's measured grid
        summary["cost_out_of_grid_lookups"] = sum(sum(r.cost.out_of_grid.values()) for r in sim.replicas)
    summary.update(allocator_stats([r.scheduler.alloc for r in sim.replicas], cfg.model.spec.kv_bytes_per_token,
                                   summary))
    if getattr(cfg.allocator, "tiers", None):
        summary.update(tier_summary(sim, req_df, cfg.scheduler.policy))
    wall = time.perf_counter() - t0
    return RunResult(cfg, summary, req_df, steps, wall, run_warnings(cfg, summary, req_df))
