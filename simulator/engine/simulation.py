"""SimPy processes: requests arrive, a router hands them to replicas, engines iterate.

Each replica's engine is a process that reads like the loop it simulates::

    while there is work:
        step = scheduler.schedule(now)       # pick the batch, allocate KV
        seconds = cost(step)                 # what the GPU (and the host link) take
        yield env.timeout(seconds)           # wait while they compute it
        scheduler.complete(step, now)        # every sequence gains a token

When a replica has nothing to do it sleeps until an arrival routed to it (or the end of
the trace) wakes it. The speed lives behind one call to the replica's fast path
(``simulator.engine.fast_path``, DESIGN.md "Performance principle"): ``run`` plans (extends a
decode step with the identical iterations certain to follow it) and applies (advances
them in closed form and writes the step table's row). When no other event comes before a step
ends, the engine does not yield at all: it completes the step and goes on (SimPy would
run nothing in between), so its clock ``now`` may run ahead of SimPy's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from kvsim.policies.kv_allocator import KVAllocator
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.cost_model.base import CostModel
from kvsim.simulator.engine.fast_path import FastPath, Lookahead, row_state
from kvsim.simulator.engine.metrics import RequestLog, request_row
from kvsim.simulator.engine.step_log import StepLog, Window
from kvsim.simulator.sched.policy_registry import policy_entry
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings, Step
from kvsim.simulator.sched.sequence import SequenceGroup
from kvsim.traces import Request

if TYPE_CHECKING:
    from kvsim.simulator.sched.sglang import SchedulerSGLang
    from kvsim.simulator.sched.vllm_v1 import SchedulerV1

INF = float("inf")


def step_seconds(cost: CostModel, step: Step) -> tuple[float, float]:
    """(GPU, host link) seconds of one step: its batch plus copy-on-write copies, and its swaps."""
    compute = cost.step_time(step.shape)
    if step.cow_copies:
        compute += cost.copy_time(step.cow_copies)
    if not (step.swap_out_blocks or step.swap_in_blocks):
        return compute, 0.0
    return compute, cost.swap_time(step.swap_out_blocks, step.swap_out_slots) + cost.swap_time(
        step.swap_in_blocks, step.swap_in_slots)


class SimulationStalled(RuntimeError):
    """No progress is possible: work remains but nothing can ever be scheduled."""


@dataclass
class Replica:
    """One model replica: a scheduler (with its KV allocator), its cost model, its fast
    path and its host link."""

    index: int
    scheduler: Scheduler | SchedulerV1 | SchedulerSGLang
    cost: CostModel
    pcie: simpy.Resource | None = None  # the GPU<->CPU link, when swaps overlap compute
    fast: FastPath = field(init=False, repr=False)  # run planning and the step rows
    _wake: simpy.Event | None = field(default=None, repr=False)
    outstanding_tokens: int = 0  # prompt + output tokens of requests not yet ended
    outstanding_requests: int = 0  # requests routed here and not yet ended

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()


def kv_usage(replica: Replica) -> float:
    """The share of the replica's KV cache allocated now (a prefix cache's unreferenced
    blocks count as free, as in vLLM's ``kv_cache_usage``)."""
    u = replica.fast.memory()
    return (u.capacity - u.free) / u.capacity


#: ``scheduler.router``'s load measures: the replica with the least load gets the request
#: (ties: the lowest index). DESIGN.md "Engine and scheduler".
LOADS: dict[str, Callable[[Replica], float]] = {
    "least_outstanding_tokens": lambda r: r.outstanding_tokens,
    "least_outstanding_requests": lambda r: r.outstanding_requests,
    "least_kv_usage": kv_usage,
}


class Router:
    """Assigns each arriving request to a replica: round robin, or the least loaded by one
    of ``LOADS``."""

    def __init__(self, replicas: list[Replica], policy: str = "round_robin"):
        if policy != "round_robin" and policy not in LOADS:
            raise ValueError(f"router policy must be one of round_robin, {', '.join(LOADS)}; got {policy!r}")
        self.replicas, self.policy, self._next = replicas, policy, 0
        self._load = LOADS.get(policy)

    def pick(self, request: Request) -> Replica:
        if self._load is None:
            r = self.replicas[self._next % len(self.replicas)]
            self._next += 1
            return r
        load = self._load
        return min(self.replicas, key=lambda r: (load(r), r.index))


class Simulation:
    """Wires the trace, router and replicas into one SimPy environment and runs it.

    ``keep_steps``: keep every step's row (the per-step table and the memory
    timeline); without, only the totals the summary needs, averaged over ``window``.
    ``overlap_swap``: swaps run on the replica's PCIe link (a SimPy resource) while
    the GPU computes, so a step lasts max(compute, transfer) instead of their sum.
    ``chain_steps``: when no other event comes before a step ends, go straight on
    without yielding to SimPy (same results, fewer events; off: yield after every step).
    ``make_tiers``: each replica's cache tiers below the GPU (``policies.tiers.tier_stack``;
    vllm-v0, vllm-v1 and sglang): a load's end is a SimPy event that puts its request back in line.
    """

    def __init__(
        self,
        requests: Iterable[Request],
        make_allocator: Callable[[], KVAllocator],
        make_cost: Callable[[], CostModel],
        limits: SchedulerSettings,
        num_replicas: int = 1,
        router: str = "round_robin",
        macro_steps: bool = True,
        max_run: int = 1024,
        overlap_swap: bool = False,
        keep_steps: bool = True,
        window: Window = "busy",
        chain_steps: bool = True,
        make_tiers: Callable[[], TierStack] | None = None,
    ):
        self.env = simpy.Environment()
        self.requests = requests
        self.steps = StepLog(keep_rows=keep_steps, window=window)  # rows, or only their totals
        self.request_rows = RequestLog()
        # An explicit measurement window's edges (s): a row must not straddle one.
        edges = tuple(sorted(e for e in window if e is not None)) if isinstance(window, tuple) else ()
        self.lookahead = Lookahead(edges=edges)  # the next arrival, shared by the fast paths
        self.replicas: list[Replica] = []
        make_scheduler = policy_entry(limits.policy).scheduler
        for i in range(num_replicas):
            sched = make_scheduler(make_allocator(), limits, on_terminal=self._on_terminal(i),
                                   tiers=make_tiers() if make_tiers is not None else None)
            pcie = simpy.Resource(self.env, capacity=1) if overlap_swap else None
            replica = Replica(i, sched, make_cost(), pcie)
            if make_tiers is not None:
                sched.on_load = self._on_load(replica)
            replica.fast = FastPath(replica, replica.cost, self.steps, self.lookahead, macro_steps, max_run,
                                    overlap_swap, state=self._state)
            self.replicas.append(replica)
        self.router = Router(self.replicas, router)
        self.arrivals_done = False
        self.chain_steps = chain_steps

    def _on_load(self, replica: Replica) -> Callable[[float], None]:
        """A load from a cache tier will end at ``done`` (s): then its request rejoins the
        waiting queue and the replica wakes (a SimPy event, so a chain of steps stops there)."""
        def at_end(done: float) -> None:
            def finish(_event: simpy.Event) -> None:
                replica.scheduler.finish_loads(done)
                replica.wake()
            self.env.timeout(done - self.env.now).callbacks.append(finish)
        return at_end

    def tier_stats(self) -> dict[str, dict[str, float]]:
        """Each cache tier's counters (``policies.tiers.tier_stack.TIER_COUNTERS``), summed over replicas."""
        out: dict[str, dict[str, float]] = {}
        for r in self.replicas:
            tiers = getattr(r.scheduler, "tiers", None)
            for name, counters in (tiers.stats() if tiers is not None else {}).items():
                mine = out.setdefault(name, dict.fromkeys(counters, 0))
                for k, v in counters.items():
                    mine[k] += v
        return out

    def _on_terminal(self, replica: int) -> Callable[[SequenceGroup], None]:
        def record(g: SequenceGroup) -> None:
            self.request_rows.append(request_row(g, replica))
            r = self.replicas[replica]
            r.outstanding_tokens -= g.request.prompt_tokens + g.request.output_tokens
            r.outstanding_requests -= 1
        return record

    # --- processes ------------------------------------------------------------------
    def _arrivals(self):
        env = self.env
        for request in self.requests:
            self.lookahead.next_arrival = request.arrival_time
            delay = request.arrival_time - env.now
            if delay > 0:
                yield env.timeout(delay)
            replica = self.router.pick(request)
            replica.outstanding_tokens += request.prompt_tokens + request.output_tokens
            replica.outstanding_requests += 1
            replica.scheduler.add(request, env.now)
            replica.wake()
        self.arrivals_done = True
        self.lookahead.next_arrival = INF
        for r in self.replicas:
            r.wake()

    def _engine(self, replica: Replica):
        env, sched, cost, fast, pcie = self.env, replica.scheduler, replica.cost, replica.fast, replica.pcie
        chain = self.chain_steps and pcie is None  # overlapped swaps start SimPy processes
        now = env.now  # the replica's own clock (s): ahead of env.now while steps chain
        while True:
            step = sched.schedule(now)  # schedule
            if step.empty:  # (a step that preempted every running group is scheduled again)
                if not step.preempted:
                    now = yield from self._idle(replica, now)
                    if now is None:
                        return
                continue
            compute, swap = step_seconds(cost, step)  # cost
            done = fast.run(step, now, compute, swap)  # its row; identical iterations at once
            if swap and pcie is not None:  # wait: the transfer overlaps the compute
                yield env.all_of([env.timeout(compute), env.process(self._transfer(replica, swap))])
                now = env.now
            else:  # wait, unless no other event comes first
                now = done.end
                if not chain or env.peek() <= now:
                    yield env.timeout(now - env.now)
            done.complete(sched, now)  # complete

    def _idle(self, replica: Replica, now: float) -> Generator[simpy.Event, None, float | None]:
        """Nothing to run at ``now`` (s): catch SimPy up with the replica's clock, then sleep
        until an arrival, a load's end (or the end of the trace) wakes the replica, as the
        reference engine does: scheduling again at the same instant with nothing new would
        repeat the refusal, but not its side effects (a tier's store batch went out).
        Returns the replica's clock afterwards; None when no work will ever come."""
        env, sched = self.env, replica.scheduler
        if sched.has_work and not sched.running and sched.next_load_s == INF:
            raise SimulationStalled(self._stall_message(replica))
        replica._wake = wake = env.event()  # (an event due by ``now`` may wake it while catching up)
        if now > env.now:
            yield env.timeout(now - env.now)
        if not wake.triggered:
            if self.arrivals_done and not sched.has_work:
                replica._wake = None
                return None
            yield wake
        replica._wake = None
        return env.now

    # A row's queue lengths and memory classes: the one spot that sees every row's replica as
    # the row is written (tests/simulator/app/test_validate.py checks the running counts there).
    _state = staticmethod(row_state)

    def _transfer(self, replica: Replica, seconds: float):
        """Hold the replica's PCIe link for one step's swap traffic."""
        with replica.pcie.request() as link:
            yield link
            yield self.env.timeout(seconds)

    def _stall_message(self, replica: Replica) -> str:
        s = replica.scheduler
        head = s.waiting[0].request if s.waiting else s.swapped[0].request
        return (
            f"replica {replica.index}: request {head.request_id} (prompt {head.prompt_tokens}, output "
            f"{head.output_tokens} tokens) can never be scheduled: nothing is running and it still does "
            f"not fit (blocked by {s.blocked}); {len(s.waiting)} waiting, {len(s.swapped)} swapped"
        )

    def run(self) -> None:
        self.env.process(self._arrivals())
        procs = [self.env.process(self._engine(r)) for r in self.replicas]
        with _rare_gc():
            self.env.run(until=simpy.AllOf(self.env, procs) if procs else None)


@contextmanager
def _rare_gc(young: int = 50_000) -> Iterator[None]:
    """Run the cyclic garbage collector less often while simulating.

    A simulation allocates many short-lived objects but few reference cycles, so
    Python's default young-generation threshold (700 allocations) makes it collect
    for nothing; collecting every ``young`` allocations saves ~4% of wall time.
    """
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)

