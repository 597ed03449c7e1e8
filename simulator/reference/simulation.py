"""The reference engine's simulation: the trace, a router and each replica's rules in one
SimPy environment, and the tables and totals the differential tests compare.

The rules are in ``simulator.reference.vllm`` (vLLM v0 and v1: ``ReferenceReplica``,
``ReferenceV1Replica``, the cache tiers' ``ReferenceTiers``) and
``simulator.reference.sglang`` (``ReferenceSGLangReplica``); this module picks one per
``scheduler.policy``, builds each replica's plain allocator, runs the arrivals and records
every step and every request (:func:`simulate`). Like the rules, it shares only plain data
with the fast engine: ``traces.Request``, the config and the cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from kvsim.policies.reference.contiguous import REFERENCE_PRESETS, ReferenceContiguousAllocator
from kvsim.policies.reference.paged import (
    FRAGMENTED,
    ReferenceFreeQueueAllocator,
    ReferencePagedAllocator,
)
from kvsim.simulator.capacity import swap_slots
from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.cost_model.base import CostModel
from kvsim.simulator.cost_model.roofline import RooflineCostModel, RooflineParams
from kvsim.simulator.reference.sglang import ReferenceSGLangReplica
from kvsim.simulator.reference.vllm import (
    CLASSES,
    TIER_COUNTERS,
    Group,
    ReferenceReplica,
    ReferenceStalled,
    ReferenceTiers,
    ReferenceV1Replica,
    Rules,
    Step,
)
from kvsim.traces import Request

# The step columns summed into the totals (tokens, groups, slots, seconds, copies).
COUNTERS = (
    "prefill_tokens",
    "recompute_tokens",
    "cached_tokens",
    "decode_tokens",
    "preempted_swap",
    "preempted_recompute",
    "aborted",
    "swap_out_slots",
    "swap_in_slots",
    "swap_s",
    "cow_copies",
)

# A step row's columns, in file order: the counters, with the batch size after the token counts.
STEP_FIELDS = (
    ("replica", "start_s", "duration_s")
    + COUNTERS[:4]
    + ("batched_requests",)
    + COUNTERS[4:]
    + ("waiting", "swapped")
    + CLASSES
    + ("unshared_slots",)
)


@dataclass
class Totals:
    """Sums over steps (tokens, seconds, slot-seconds): what a summary is made of."""

    iterations: int = 0
    busy_s: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    recompute_time_s: float = 0.0  # each prefill's compute time times its recomputed share
    allocated_slot_s: float = 0.0
    unshared_slot_s: float = 0.0
    measured_s: float = 0.0  # seconds of the steps in the measurement window
    measured: dict[str, float] = field(default_factory=dict)  # duration x value, in the window


def in_window(steps: pd.DataFrame, window) -> np.ndarray:
    """Which steps the memory averages cover: ``busy`` all; ``saturated`` each replica's steps
    from its first to its last one starting with a request waiting; (start, end) by start time."""
    if isinstance(window, tuple):
        start, end = window
        keep = np.ones(len(steps), bool)
        if start is not None:
            keep &= steps["start_s"].to_numpy() >= start
        if end is not None:
            keep &= steps["start_s"].to_numpy() < end
        return keep
    if window == "saturated":
        keep = np.zeros(len(steps), bool)
        replica, waiting = steps["replica"].to_numpy(), steps["waiting"].to_numpy() > 0
        for r in set(replica.tolist()):
            rows = np.flatnonzero(replica == r)  # this replica's steps, in time order
            waits = rows[waiting[rows]]
            if len(waits):
                keep[rows[(rows >= waits[0]) & (rows <= waits[-1])]] = True
        return keep
    return np.ones(len(steps), bool)


def totals(steps: pd.DataFrame, window) -> Totals:
    t = Totals()
    w = steps["duration_s"].to_numpy(float)
    t.iterations = len(steps)
    t.busy_s = float(w.sum())
    for c in COUNTERS:
        t.counters[c] = float(steps[c].sum())
    for row in steps.itertuples():
        if row.prefill_tokens:
            t.recompute_time_s += (
                row.recompute_tokens / row.prefill_tokens * (row.duration_s - row.swap_s)
            )
    t.allocated_slot_s = float(
        ((steps["token_states"] + steps["reserved"] + steps["internal_frag"] + steps["allocator_frag"]) * w).sum()
    )
    t.unshared_slot_s = float((steps["unshared_slots"] * w).sum())
    keep = in_window(steps, window)
    t.measured_s = float(w[keep].sum())
    for c in ("batched_requests",) + CLASSES:
        t.measured[c] = float((steps[c].to_numpy(float) * w)[keep].sum())
    return t


@dataclass
class ReferenceResult:
    requests: pd.DataFrame  # one row per request, by request id
    steps: pd.DataFrame  # one row per iteration
    totals: Totals
    itl: list[tuple[float, int]]  # (gap s, sequences): every inter-token gap of every replica
    allocators: list
    tier_stats: dict[str, dict[str, float]] = field(default_factory=dict)  # summed over replicas


def make_reference_allocator(
    cfg: ExperimentConfig,
) -> ReferencePagedAllocator | ReferenceContiguousAllocator | ReferenceFreeQueueAllocator:
    """One replica's allocator: paged blocks of ``block_size`` slots (under vllm-v1 in one
    free queue), or contiguous regions."""
    slots, a = cfg.kv_slots, cfg.allocator
    if cfg.scheduler.policy == "sglang":  # a radix tree over pages of block_size slots
        from kvsim.policies.reference.radix import ReferenceRadixCache

        B = a.block_size
        return ReferenceRadixCache(slots // B * B, B, a.eviction_policy)
    if cfg.scheduler.policy == "vllm-v1":  # the config admits only paged memory here
        return ReferenceFreeQueueAllocator(
            slots // a.block_size, a.block_size, prefix_caching=a.prefix_caching,
            eviction=a.eviction_policy,
        )
    swap = swap_slots(cfg.hardware.swap_space_gib, cfg.hardware.tensor_parallel, cfg.model.spec)
    if a.kind == "paged":
        B = a.block_size
        return ReferencePagedAllocator(slots // B, B, swap // B, prefix_caching=a.prefix_caching,
                                       eviction=a.eviction_policy)
    placement, reservation = (
        REFERENCE_PRESETS[a.preset][:2] if a.preset else (a.placement, a.reservation)
    )
    return ReferenceContiguousAllocator(
        slots, placement, reservation, a.reserve_tokens or cfg.model.context_len, swap
    )


def roofline_cost(cfg: ExperimentConfig) -> CostModel:
    """The roofline cost model the config asks for (paged or contiguous attention kernel).
    Other kinds read profiles: pass ``make_cost`` (``simulator.engine.runner.make_cost_factory``)."""
    c, hw = cfg.cost_model, cfg.hardware
    if c.kind != "roofline":
        raise ValueError(
            f"cost_model.kind {c.kind!r}: the reference builds only 'roofline' itself; "
            "pass make_cost for the others"
        )
    paged = cfg.allocator.kind == "paged"
    block = cfg.allocator.block_size if paged else 1
    if cfg.scheduler.policy == "sglang":  # its kernels read KV through a token index table:
        block = max(block, 16)  # costed as a paged kernel at 16 (as simulator.engine.runner does)
    params = RooflineParams(
        compute_efficiency=c.compute_efficiency,
        memory_efficiency=c.memory_efficiency,
        step_overhead_s=c.step_overhead_s,
        swap_batched=c.swap_batched,
    )
    return RooflineCostModel(
        cfg.model.spec,
        hw.spec,
        hw.tensor_parallel,
        block,
        "paged" if paged else "contiguous",
        params,
        hw.pcie,
        hw.link,
        c.host_time,
        cfg.expert_group,
    )


class ReferenceSimulation:
    """The trace, a router and the replicas' engines in one SimPy environment."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        requests: Iterable[Request],
        make_cost: Callable[[], CostModel] | None = None,
    ):
        if cfg.scheduler.policy not in ("vllm-v0", "vllm-v1", "sglang"):
            raise ValueError(f"the reference engine implements vllm-v0, vllm-v1 and sglang, not "
                             f"scheduler.policy {cfg.scheduler.policy!r}")
        self.cfg, self.requests = cfg, requests
        self.env = simpy.Environment()
        allocators = [make_reference_allocator(cfg) for _ in range(cfg.hardware.num_replicas)]
        rules = Rules(
            max_num_seqs=cfg.scheduler.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_seq_len=cfg.model.context_len,
            watermark_slots=int(cfg.allocator.watermark * allocators[0].capacity),
            request_level_batching=cfg.scheduler.batching == "request",
            preemption=cfg.preemption.mode,
            swap_fallback=cfg.preemption.swap_fallback,
            sample_lengths=cfg.decoding.sample_lengths,
            beam_concentration=cfg.decoding.beam_concentration,
            policy=cfg.scheduler.policy,
            **cfg.scheduler.policy_keys(),  # the policy's own settings (none for vllm-v0)
        )
        make_cost = make_cost or (lambda: roofline_cost(cfg))
        replica = {"vllm-v1": ReferenceV1Replica, "sglang": ReferenceSGLangReplica}.get(rules.policy, ReferenceReplica)
        self.replicas = [
            replica(i, alloc, make_cost(), rules, cfg.seed, self.record_end)
            for i, alloc in enumerate(allocators)
        ]
        for replica in self.replicas:
            replica.wake = lambda r=replica: self.wake(r)
        tiers = getattr(cfg.allocator, "tiers", [])
        if tiers:  # the config allows them only with prefix caching (paged)
            B = cfg.allocator.block_size
            for replica in self.replicas:
                replica.tiers = ReferenceTiers(self.env, tiers, B, B * cfg.model.spec.kv_bytes_per_token)
                replica.alloc.log_evictions = tiers[0].write_policy == "write-back"
        self.overlap_swap = cfg.preemption.overlap_swap
        self.rows: list[tuple] = []
        self.ended: list[tuple] = []
        self.arrivals_done = False
        self.next_replica = 0

    def pick(self, request: Request) -> ReferenceReplica:
        """The router: round robin, or the replica with the least load (the fewest outstanding
        tokens or requests, or the smallest share of its KV cache allocated), ties to the
        lowest index."""
        router = self.cfg.scheduler.router
        if router == "round_robin":
            replica = self.replicas[self.next_replica % len(self.replicas)]
            self.next_replica += 1
            return replica

        def load(r: ReferenceReplica) -> float:
            if router == "least_outstanding_tokens":
                return r.outstanding_tokens
            if router == "least_outstanding_requests":
                return r.outstanding_requests
            m = r.alloc.memory()  # least_kv_usage
            return (r.alloc.capacity - m.free) / r.alloc.capacity

        return min(self.replicas, key=lambda r: (load(r), r.index))

    def arrivals(self):
        env = self.env
        for request in self.requests:
            if request.arrival_time > env.now:
                yield env.timeout(request.arrival_time - env.now)
            replica = self.pick(request)
            replica.outstanding_tokens += request.prompt_tokens + request.output_tokens
            replica.outstanding_requests += 1
            replica.add(request, env.now)
            self.wake(replica)
        self.arrivals_done = True
        for replica in self.replicas:
            self.wake(replica)

    @staticmethod
    def wake(replica: ReferenceReplica) -> None:
        if replica.wake_event is not None and not replica.wake_event.triggered:
            replica.wake_event.succeed()

    def engine(self, replica: ReferenceReplica):
        env, cost = self.env, replica.cost
        while True:
            if replica.tiers is not None:  # transfers that end now end first: a lookup now
                yield env.timeout(0)  # sees what they stored, and loads done now are back
            step = replica.schedule(env.now)
            if not step.prefill and not step.decode:
                if step.preempted:  # every running group was preempted: nothing ran; schedule again
                    continue
                if replica.has_work and not replica.running and not replica.loading:
                    raise ReferenceStalled(
                        f"replica {replica.index}: work remains that can never be scheduled"
                    )
                if self.arrivals_done and not replica.has_work and not replica.loading:
                    return
                replica.wake_event = env.event()
                yield replica.wake_event
                replica.wake_event = None
                continue
            compute = cost.step_time(step.shape())
            if step.cow_copies:
                compute += cost.copy_time(step.cow_copies)
            swap = 0.0
            if step.swap_out_blocks or step.swap_in_blocks:
                swap = cost.swap_time(step.swap_out_blocks, step.swap_out_slots) + cost.swap_time(
                    step.swap_in_blocks, step.swap_in_slots
                )
            duration = max(compute, swap) if self.overlap_swap and swap else compute + swap
            self.record_step(replica, step, env.now, duration, swap)
            yield env.timeout(duration)
            replica.complete(step, env.now)

    def record_step(
        self, replica: ReferenceReplica, step: Step, start: float, duration: float, swap_s: float
    ) -> None:
        """The step's row: its work, and memory by class as the step starts (after scheduling)."""
        m = replica.alloc.memory()
        waiting = len(replica.waiting)
        # Why free slots are free: nothing waits (idle); the head of the queue waits although
        # the free space would hold it, for want of a large enough hole (external
        # fragmentation); anything else (too little space, watermark, limits, swapped first).
        external = m.free if waiting and replica.blocked == FRAGMENTED else 0
        idle = m.free if not waiting else 0
        stranded = m.free - external - idle
        self.rows.append(
            (
                replica.index,
                start,
                duration,
                step.prefill_tokens,
                step.recompute_tokens,
                step.cached_tokens,
                step.decode_seqs,
                len(step.prefill) + len(step.decode),
                step.preempted_swap,
                step.preempted_recompute,
                step.aborted,
                step.swap_out_slots,
                step.swap_in_slots,
                swap_s,
                step.cow_copies,
                waiting,
                len(replica.swapped),
                m.token_states,
                m.reserved,
                m.internal_frag,
                m.allocator_frag,
                external,
                stranded,
                idle,
                m.unshared,
            )
        )

    def record_end(self, g: Group, replica: int) -> None:
        r = g.request
        self.replicas[replica].outstanding_tokens -= r.prompt_tokens + r.output_tokens
        self.replicas[replica].outstanding_requests -= 1
        self.ended.append(
            (
                r.request_id,
                replica,
                g.status,
                g.reason,
                r.arrival_time,
                r.prompt_tokens,
                r.output_tokens,
                r.num_seqs,
                g.generated,
                sum(g.targets.values()),
                g.cached_tokens,
                g.scheduled_s,
                g.first_token_s,
                g.finish_s,
                g.preemptions,
                g.recomputed_tokens,
                g.swapped_out_blocks,
                g.swapped_in_blocks,
                g.loaded_tokens,
                g.load_wait_s,
            )
        )

    def run(self) -> ReferenceResult:
        self.env.process(self.arrivals())
        engines = [self.env.process(self.engine(r)) for r in self.replicas]
        self.env.run(until=simpy.AllOf(self.env, engines))
        columns = (
            "request_id",
            "replica",
            "status",
            "reason",
            "arrival_s",
            "prompt_tokens",
            "output_tokens",
            "num_seqs",
            "generated_tokens",
            "total_output_tokens",
            "cached_prompt_tokens",
            "scheduled_s",
            "first_token_s",
            "finish_s",
            "preemptions",
            "recomputed_tokens",
            "swapped_out_blocks",
            "swapped_in_blocks",
            "loaded_tokens",
            "load_wait_s",
        )
        requests = (
            pd.DataFrame(self.ended, columns=columns)
            .sort_values("request_id")
            .reset_index(drop=True)
        )
        for c in ("scheduled_s", "first_token_s", "finish_s"):
            requests[c] = requests[c].astype(float)
        steps = pd.DataFrame(self.rows, columns=STEP_FIELDS)
        itl = [gap for r in self.replicas for gap in r.itl]
        tier_stats: dict[str, dict[str, float]] = {}
        for r in self.replicas:
            for name, counters in (r.tiers.stats() if r.tiers is not None else {}).items():
                mine = tier_stats.setdefault(name, dict.fromkeys(TIER_COUNTERS, 0))
                for c, v in counters.items():
                    mine[c] += v
        return ReferenceResult(
            requests,
            steps,
            totals(steps, self.cfg.metrics.measurement_window),
            itl,
            [r.alloc for r in self.replicas],
            tier_stats,
        )


def simulate(
    cfg: ExperimentConfig,
    requests: Iterable[Request],
    make_cost: Callable[[], CostModel] | None = None,
) -> ReferenceResult:
    """Run ``requests`` under ``cfg`` with the reference engine and allocators."""
    return ReferenceSimulation(cfg, requests, make_cost).run()
