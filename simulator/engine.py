"""SimPy processes: requests arrive, a router hands them to replicas, engines iterate.

Each replica's engine is a process that reads like the loop it simulates::

    while there is work:
        step = scheduler.schedule()          # pick the batch, allocate KV
        yield env.timeout(cost(step))        # the GPU computes it
        scheduler.complete(step)             # every sequence gains a token

When a replica has nothing to do it sleeps until the router wakes it. When no
other event comes before a step ends, the engine does not yield at all: it
completes the step and goes on (SimPy would run nothing in between). Between
events, a run of decode iterations is advanced at once (DESIGN.md "Performance
principle"): every running sequence gains a token per iteration, so durations and
memory follow closed forms. When no admission can follow a finish (nothing waits),
the run goes on past it and the finished requests retire at their own time. Same
results as stepping one iteration at a time, far fewer Python steps.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import simpy

from policies.kv_allocator import KVAllocator, RunWeights
from simulator.cost_model.base import CostModel
from simulator.memory_classes import split_free
from simulator.metrics import RequestLog, request_row
from simulator.scheduler import Scheduler, SchedulerSettings, Step
from simulator.scheduler_v1 import SchedulerV1
from simulator.sequence import SequenceGroup
from simulator.step_log import StepLog, Window
from traces import Request

INF = float("inf")


class SimulationStalled(RuntimeError):
    """No progress is possible: work remains but nothing can ever be scheduled."""


@dataclass
class Replica:
    """One model replica: a scheduler, its KV allocator, its cost model and its host link."""

    index: int
    scheduler: Scheduler | SchedulerV1
    cost: CostModel
    pcie: simpy.Resource | None = None  # the GPU<->CPU link, when swaps overlap compute
    _wake: simpy.Event | None = field(default=None, repr=False)
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
    """Wires the trace, router and replicas into one SimPy environment and runs it.

    ``keep_steps``: keep every step's row (the per-step table and the memory
    timeline); without, only the totals the summary needs, averaged over ``window``.
    ``overlap_swap``: swaps run on the replica's PCIe link (a SimPy resource) while
    the GPU computes, so a step lasts max(compute, transfer) instead of their sum.
    ``chain_steps``: when no other event comes before a step ends, go straight on
    without yielding to SimPy (same results, fewer events; off: yield after every step).
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
    ):
        self.env = simpy.Environment()
        self.requests = requests
        self.steps = StepLog(keep_rows=keep_steps, window=window)  # rows, or only their totals
        self.request_rows = RequestLog()
        self.replicas: list[Replica] = []
        for i in range(num_replicas):
            make_scheduler = SchedulerV1 if limits.policy == "vllm-v1" else Scheduler
            sched = make_scheduler(make_allocator(), limits, on_terminal=self._on_terminal(i))
            pcie = simpy.Resource(self.env, capacity=1) if overlap_swap else None
            self.replicas.append(Replica(i, sched, make_cost(), pcie))
        self.router = Router(self.replicas, router)
        self.arrivals_done = False
        self.next_arrival = INF  # arrival time of the next request not yet dispatched (s)
        # An explicit measurement window's edges (s): a row must not straddle one.
        self._edges = sorted(e for e in window if e is not None) if isinstance(window, tuple) else []
        self.macro_steps = macro_steps  # advance runs of identical decode steps in closed form
        self.max_run = max_run  # at most this many iterations per closed-form run (or part of one)
        self.chain_steps = chain_steps

    def _on_terminal(self, replica: int) -> Callable[[SequenceGroup], None]:
        def record(g: SequenceGroup) -> None:
            self.request_rows.append(request_row(g, replica))
            self.replicas[replica].outstanding_tokens -= g.request.prompt_tokens + g.request.output_tokens
        return record

    # --- processes ------------------------------------------------------------------
    def _arrivals(self):
        env = self.env
        for request in self.requests:
            self.next_arrival = request.arrival_time
            delay = request.arrival_time - env.now
            if delay > 0:
                yield env.timeout(delay)
            replica = self.router.pick(request)
            replica.outstanding_tokens += request.prompt_tokens + request.output_tokens
            replica.scheduler.add(request, env.now)
            replica.wake()
        self.arrivals_done = True
        self.next_arrival = INF
        for r in self.replicas:
            r.wake()

    def _engine(self, replica: Replica):
        env, sched, cost = self.env, replica.scheduler, replica.cost
        # The replica's own clock (s). When no other event comes before a step ends,
        # nothing can tell the step from its end, so the engine goes straight on
        # without yielding: ``now`` runs ahead of ``env.now``.
        now = env.now
        chain = self.chain_steps and replica.pcie is None  # overlapped swaps start SimPy processes
        while True:
            step = sched.schedule(now)
            if step.empty:
                if step.preempted:  # it preempted every running group: schedule again (swap back in, readmit)
                    continue
                if sched.has_work and not sched.running:
                    raise SimulationStalled(self._stall_message(replica))
                if now > env.now:  # catch up before sleeping or ending
                    yield env.timeout(now - env.now)
                    continue
                if self.arrivals_done and not sched.has_work:
                    return
                replica._wake = env.event()
                yield replica._wake
                replica._wake = None
                now = env.now
                continue
            start = now
            compute = cost.step_time(step.shape)
            if step.cow_copies:
                compute += cost.copy_time(step.cow_copies)
            swap = cost.swap_time(step.swap_out_blocks, step.swap_out_slots) + cost.swap_time(
                step.swap_in_blocks, step.swap_in_slots) if step.swap_out_blocks or step.swap_in_blocks else 0.0
            extra = sched.run_length(step, self.max_run) if self.macro_steps else 0
            edge = next((e for e in self._edges if e > start), INF) if self._edges else INF
            # With nothing waiting, an arrival may be admitted at the next step boundary.
            cut = edge if sched.waiting else min(edge, self.next_arrival)
            run = (self._plan_run(cost, step.shape.decode_seqs, step.shape.decode_context, extra, start + compute,
                                  cut) if extra else None)
            if run is not None:  # swap is 0 here: runs never preempt or swap in
                now, pending, first = self._run(replica, step, start, compute, run, edge)
                if not chain or env.peek() <= now:
                    yield env.timeout(now - env.now)
                if pending is not None:
                    if first:
                        sched.complete(step, now, pending)
                    else:
                        sched.complete_run(pending, now)
                continue
            overlap = bool(swap) and replica.pcie is not None
            # Rows are written as steps start, so they stay in time order across replicas.
            u = sched.alloc.usage()
            state = self._state(replica, u.token_states, u.reserved, u.internal_frag, u.free,
                                u.unshared or (u.capacity - u.free))
            self._record(replica, step, start, max(compute, swap) if overlap else compute + swap, 1,
                         step.shape.decode_seqs, step.num_groups, state, swap)
            if overlap:
                yield env.all_of([env.timeout(compute), env.process(self._transfer(replica, swap))])
                now = env.now
            else:
                now = start + (compute + swap)  # as SimPy adds a timeout's delay
                if not chain or env.peek() <= now:
                    yield env.timeout(now - env.now)
            sched.complete(step, now)

    def _transfer(self, replica: Replica, seconds: float):
        """Hold the replica's PCIe link for one step's swap traffic."""
        with replica.pcie.request() as link:
            yield link
            yield self.env.timeout(seconds)

    @staticmethod
    def _plan_run(cost: CostModel, n: int, c0: int, extra: int, first_end: float, cut: float) -> RunWeights | None:
        """Up to ``extra`` decode iterations of ``n`` sequences holding ``c0`` tokens, starting
        at ``first_end`` (s), in closed form (None: none).

        Context grows by one token per sequence per iteration, so iteration i lasts
        ``a + b * (c0 + n * i)``. The run stops at the first boundary at or after ``cut``
        (s): the next arrival, when it may be admitted there, or a measurement window's edge,
        and where the cost model's affine segment ends (``decode_segment``; a profiled cost
        model is piecewise affine in the context): the next run starts there.
        """
        a, b, span = cost.decode_segment(n, c0 + n)
        extra = min(extra, span)
        run = RunWeights(extra, a + b * (c0 + n), b * n)
        if cut == INF:
            return run
        gap = cut - first_end  # seconds the run may last
        if run.total < gap:  # it ends before the cut
            return run
        if gap <= 0:
            return None
        k = run.iterations_to_reach(gap)
        return run if k >= extra else RunWeights(k, run.first, run.slope)

    # --- records --------------------------------------------------------------------
    @staticmethod
    def _state(replica: Replica, token_states: float, reserved: float, internal_frag: float, free: float,
               unshared: float) -> tuple:
        """Queue lengths and memory classes (slots) as the step starts: what the step is weighted by."""
        sched = replica.scheduler
        waiting = sched.waiting
        return (len(waiting), len(sched.swapped), token_states, reserved, internal_frag,
                *split_free(free, bool(waiting), sched.blocked), unshared)

    def _record(self, replica: Replica, step: Step, start: float, duration: float, iterations: int,
                decode_tokens: int, groups: float, state: tuple, swap_s: float = 0.0) -> None:
        shape = step.shape
        self.steps.append((
            replica.index, start, duration, iterations, shape.prefill_tokens, step.recompute_tokens,
            step.cached_tokens, decode_tokens, groups, step.preempted_swap,
            step.preempted_recompute, step.aborted, step.swap_out_blocks, step.swap_in_blocks,
            step.swap_out_slots, step.swap_in_slots, swap_s, step.cow_copies, *state,
        ))

    def _run(self, replica: Replica, step: Step, start: float, d0: float, run: RunWeights,
             edge: float) -> tuple[float, RunWeights | None, bool]:
        """Apply ``step``'s run of identical decode iterations, and go on past finishes
        while no admission can follow them (up to the next arrival, and the window
        ``edge``, s); write one row for it all.

        Groups that finish before the next arrival are retired now, at their finish
        time: nothing can observe the replica before then. Returns the run's end (s)
        and the part still to complete when the engine wakes there (None: nothing),
        with whether it is ``step``'s own run.
        """
        sched, alloc, cost = replica.scheduler, replica.scheduler.alloc, replica.cost
        u = alloc.usage()
        groups = step.num_groups
        # Duration-weighted sums: seconds, group-seconds and slot-seconds by class.
        seconds, group_s = d0, groups * d0
        token_s, reserved_s, internal_s, free_s = u.token_states * d0, u.reserved * d0, u.internal_frag * d0, u.free * d0
        unshared_s = (u.unshared or (u.capacity - u.free)) * d0
        iterations, tokens = 1, step.shape.decode_seqs
        t, first, n = start + d0, True, step.shape.decode_seqs  # n: sequences decoding in the run
        while True:
            i = alloc.advance_all(run, u)  # slot-seconds over the run
            token_s += i.token_states
            reserved_s += i.reserved
            internal_s += i.internal_frag
            free_s += i.free
            unshared_s += i.unshared
            seconds += run.total
            group_s += groups * run.total
            iterations += run.steps
            tokens += n * run.steps
            t += run.total
            cut = min(edge, self.next_arrival)
            if t >= cut:  # an arrival (or the window's edge) comes first: the engine wakes at t
                break
            if first:
                sched.complete(step, t, run)
            else:
                sched.complete_run(run, t)
            k = sched.continue_length(self.max_run)
            n, c0 = alloc.resident_kv()
            run = self._plan_run(cost, n, c0, k, t, cut) if k else None
            if run is None:
                break
            first, u, groups = False, alloc.usage(), len(sched.running)
        state = self._state(replica, token_s / seconds, reserved_s / seconds, internal_s / seconds,
                            free_s / seconds, unshared_s / seconds)
        self._record(replica, step, start, seconds, iterations, tokens, group_s / seconds, state)
        return t, run, first

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

