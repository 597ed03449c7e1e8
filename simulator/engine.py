"""SimPy processes: requests arrive, a router hands them to replicas, engines iterate.

Each replica's engine is a process that reads like the loop it simulates::

    while there is work:
        step = scheduler.schedule()          # pick the batch, allocate KV
        yield env.timeout(cost(step))        # the GPU computes it
        scheduler.complete(step)             # every sequence gains a token

When a replica has nothing to do it sleeps until the router wakes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import simpy

from policies.kv_allocator import KVAllocator
from simulator.cost_model.base import CostModel
from simulator.memory_classes import classify
from simulator.metrics import StepLog, request_row
from simulator.scheduler import Scheduler, SchedulerLimits, Step
from simulator.sequence import SequenceGroup
from traces import Request


class SimulationStalled(RuntimeError):
    """No progress is possible: work remains but nothing can ever be scheduled."""


@dataclass
class Replica:
    """One model replica: a scheduler, its KV allocator and its cost model."""

    index: int
    scheduler: Scheduler
    cost: CostModel
    _wake: simpy.Event | None = None
    outstanding_tokens: int = 0  # prompt + output tokens of requests not yet ended

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()


class Router:
    """Assigns each arriving request to a replica."""

    def __init__(self, replicas: list[Replica], policy: str = "round_robin"):
        if policy not in ("round_robin", "least_outstanding_tokens"):
            raise ValueError(f"router policy must be round_robin or least_outstanding_tokens, got {policy!r}")
        self.replicas, self.policy, self._next = replicas, policy, 0

    def pick(self, request: Request) -> Replica:
        if self.policy == "round_robin":
            r = self.replicas[self._next % len(self.replicas)]
            self._next += 1
            return r
        return min(self.replicas, key=lambda r: (r.outstanding_tokens, r.index))


class Simulation:
    """Wires the trace, router and replicas into one SimPy environment and runs it."""

    def __init__(
        self,
        requests: Iterable[Request],
        make_allocator: Callable[[], KVAllocator],
        make_cost: Callable[[], CostModel],
        limits: SchedulerLimits,
        num_replicas: int = 1,
        router: str = "round_robin",
    ):
        self.env = simpy.Environment()
        self.requests = requests
        self.steps = StepLog()
        self.request_rows: list[tuple] = []
        self.replicas: list[Replica] = []
        for i in range(num_replicas):
            sched = Scheduler(make_allocator(), limits, on_terminal=self._on_terminal(i))
            self.replicas.append(Replica(i, sched, make_cost()))
        self.router = Router(self.replicas, router)
        self.arrivals_done = False
        self.num_arrived = 0

    def _on_terminal(self, replica: int) -> Callable[[SequenceGroup], None]:
        def record(g: SequenceGroup) -> None:
            self.request_rows.append(request_row(g, replica))
            self.replicas[replica].outstanding_tokens -= g.request.prompt_tokens + g.request.output_tokens
        return record

    # --- processes ------------------------------------------------------------------
    def _arrivals(self):
        env = self.env
        for request in self.requests:
            delay = request.arrival_time - env.now
            if delay > 0:
                yield env.timeout(delay)
            replica = self.router.pick(request)
            replica.outstanding_tokens += request.prompt_tokens + request.output_tokens
            self.num_arrived += 1
            replica.scheduler.add(request, env.now)
            replica.wake()
        self.arrivals_done = True
        for r in self.replicas:
            r.wake()

    def _engine(self, replica: Replica):
        env, sched, cost = self.env, replica.scheduler, replica.cost
        while True:
            step = sched.schedule(env.now)
            if step.empty:
                if sched.has_work and not sched.running:
                    raise SimulationStalled(self._stall_message(replica))
                if self.arrivals_done and not sched.has_work:
                    return
                replica._wake = env.event()
                yield replica._wake
                replica._wake = None
                continue
            duration = self._duration(step, cost)
            start = env.now
            self._record(replica, step, start, duration)
            yield env.timeout(duration)
            sched.complete(step, env.now)

    @staticmethod
    def _duration(step: Step, cost: CostModel) -> float:
        t = cost.step_time(step.shape)
        if step.swap_out_blocks or step.swap_in_blocks:
            t += cost.swap_time(step.swap_out_blocks) + cost.swap_time(step.swap_in_blocks)
        if step.cow_copies:
            t += cost.copy_time(step.cow_copies)
        return t

    def _record(self, replica: Replica, step: Step, start: float, duration: float) -> None:
        sched = replica.scheduler
        mem = classify(sched.alloc.usage(), bool(sched.waiting), sched.blocked)
        shape = step.shape
        self.steps.append(
            replica.index, start, duration, 1, shape.prefill_tokens, shape.decode_seqs, step.num_groups,
            step.preempted, step.swap_out_blocks, step.swap_in_blocks, step.cow_copies,
            len(sched.waiting), len(sched.swapped), mem,
        )

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
        self.env.run(until=simpy.AllOf(self.env, procs) if procs else None)
