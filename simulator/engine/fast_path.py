"""The engine's shortcuts (DESIGN.md "Performance principle"): runs of identical decode
iterations in closed form, and the step table's rows.

The engine loop states the rules (schedule, cost, wait, complete); this module makes
them cheap. For every step it scheduled, a replica's engine makes one call, which plans a
run and applies it::

    done = fast.run(step, start, compute_s, swap_s)   # plan the run, write its row, advance it
    ... wait until done.end ...
    done.complete(scheduler, done.end)                 # what the run left to complete

(``fast.plan(step, ...)`` shows what ``run`` would plan, applying nothing.)

**Planning.** After a decode step the scheduler can tell how many more iterations are
certain to be identical (``run_length``: no admission, no finish, every append fits).
Context grows by one token per sequence per iteration, so iteration ``i`` lasts
``a + b * (c0 + n * i)`` seconds (the cost model's affine ``decode_segment``) and the
whole run has a closed-form duration (:class:`RunWeights`). A run stops at the first
boundary at or after its *cut*: the next arrival when it may be admitted there, an
explicit measurement window's edge, or the end of the cost model's affine segment.

**Applying.** The allocator integrates its memory classes over the run in closed form
(``advance_all``). When nothing waits, a finish cannot lead to an admission, so the run
goes on past it: the finished requests are retired at their own time (nothing can
observe the replica before the next arrival) and a new run is planned from there
(``continue_length``). The engine then waits once, until the end of it all, and
completes only the last part (:class:`RunEnd`). One row records the whole run: its
duration, iterations, tokens and the duration-weighted means of batch and memory.

Same results as stepping one iteration at a time (tests/simulator/engine/test_macro_steps*.py
and the differential tests against the reference engine), far fewer Python steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvsim.policies.kv_allocator import MemoryUsage, RunWeights
from kvsim.simulator.cost_model.base import CostModel
from kvsim.simulator.engine.memory_classes import split_free
from kvsim.simulator.engine.step_log import StepLog, step_row

if TYPE_CHECKING:  # the schedulers import nothing from here; only their types are named
    from kvsim.simulator.sched.scheduler import Scheduler, Step
    from kvsim.simulator.sched.vllm_v1 import SchedulerV1

INF = float("inf")

_new = tuple.__new__
"""``_new(Run, fields)``: a named tuple from a tuple of its fields. Every engine step builds a
:class:`Run` and a :class:`RunEnd`; this C call costs half their generated ``__new__`` and
about two thirds of a slotted dataclass's ``__init__`` (timeit)."""


class ReplicaView(Protocol):
    """What the fast path sees of a replica (``engine.Replica``)."""

    index: int
    scheduler: Scheduler | SchedulerV1


@dataclass(slots=True)
class Lookahead:
    """What the engine knows of the future, shared by every replica's fast path: a run
    must end at the first boundary at or after an event that could change it."""

    next_arrival: float = INF  # arrival time of the next request not yet dispatched (s)
    edges: tuple[float, ...] = ()  # an explicit measurement window's edges (s), sorted: no row straddles one


class Run(NamedTuple):
    """A scheduled step and the identical decode iterations planned to follow it: what
    :meth:`FastPath.plan` shows (a named tuple, a value)."""

    step: Step
    start: float  # when the step starts (s)
    compute_s: float  # the step's GPU time (s)
    swap_s: float  # its host-link transfer time (s); always 0 when ``weights`` is set
    weights: RunWeights | None  # the iterations after the step (None: the step alone)
    edge: float  # the first explicit window edge after ``start`` (s; INF: none)


class RunEnd(NamedTuple):
    """Where an applied run leaves the engine: it waits until ``end`` (s), then completes
    what is still due there. A value, like :class:`Run`.

    ``step``: the scheduled step, when it is still to complete (None: it was completed on
    the way, at its own end). ``rest``: the run's iterations still to complete (None: none).
    """

    end: float
    step: Step | None
    rest: RunWeights | None

    def complete(self, scheduler: Scheduler | SchedulerV1, now: float) -> None:
        """Hand the scheduler what ended at ``now``: every sequence in it gained its tokens."""
        complete_due(scheduler, self.step, self.rest, now)


def complete_due(scheduler: Scheduler | SchedulerV1, step: Step | None, rest: RunWeights | None,
                 now: float) -> None:
    """The one place a step is completed: ``step`` (if still due) with the run's iterations
    after it, else those iterations alone; the engine calls it through :class:`RunEnd`, a run
    going on past finishes directly (no record built for it)."""
    if step is not None:
        scheduler.complete(step, now, run=rest)
    elif rest is not None:
        scheduler.complete_run(rest, now)


def plan_weights(cost: CostModel, n: int, c0: int, extra: int, first_end: float, cut: float) -> RunWeights | None:
    """Up to ``extra`` decode iterations of ``n`` sequences holding ``c0`` tokens, starting
    at ``first_end`` (s), in closed form (None: none).

    Iteration i lasts ``a + b * (c0 + n * i)``. The run stops at the first boundary at or
    after ``cut`` (s), and where the cost model's affine segment ends (``decode_segment``;
    a profiled cost model is piecewise affine in the context): the next run starts there.
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


def row_state(replica: ReplicaView, token_states: float, reserved: float, internal_frag: float,
              allocator_frag: float, free: float, unshared: float) -> tuple:
    """A row's queue lengths and memory classes (slots), in ``STEP_COLUMNS`` order from
    ``waiting`` on: free slots are split by why they are free (``split_free``), which only
    the scheduler's queues can tell."""
    scheduler = replica.scheduler
    waiting = scheduler.waiting
    return (len(waiting), len(scheduler.swapped), token_states, reserved, internal_frag, allocator_frag,
            *split_free(free, bool(waiting), scheduler.blocked), unshared)


class FastPath:
    """One replica's run planning, closed-form integration and step rows.

    ``macro_steps`` off: every step is planned alone (one row per iteration).
    ``max_run``: at most this many iterations per closed-form run (or part of one).
    ``overlap_swap``: a step's swaps overlap its compute, so its row lasts the longer of
    the two (the engine holds the replica's host link meanwhile).
    ``state``: a row's queue lengths and memory classes, from the replica and its memory
    (:func:`row_state`; the engine passes its own hook for it).

    Every engine step runs ``run`` once, so it is written for speed (``make bench``): it
    plans and applies in one call (no :class:`Run` in between), the allocator's ``usage``
    and the log's ``append`` are bound once, records are built as tuples (``_new``,
    ``step_row``) and unpacked at once.
    """

    __slots__ = ("replica", "index", "scheduler", "cost", "steps", "lookahead", "macro_steps", "max_run",
                 "overlap_swap", "state", "_usage", "_append")

    def __init__(self, replica: ReplicaView, cost: CostModel, steps: StepLog, lookahead: Lookahead,
                 macro_steps: bool = True, max_run: int = 1024, overlap_swap: bool = False,
                 state: Callable[..., tuple] = row_state):
        self.replica = replica
        self.index = replica.index  # the rows' replica column
        self.scheduler = replica.scheduler
        self.cost = cost
        self.steps = steps
        self.lookahead = lookahead
        self.macro_steps = macro_steps
        self.max_run = max_run
        self.overlap_swap = overlap_swap
        self.state = state
        self._usage = replica.scheduler.alloc.usage  # memory by class now (MemoryUsage, slots)
        self._append = steps.append

    # --- the engine's call, and a look at what it would plan ------------------------------
    def run(self, step: Step, start: float, compute_s: float, swap_s: float) -> RunEnd:
        """Plan ``step`` (starting at ``start``, s) with the identical decode iterations
        certain to follow it, and apply it: write its row, advance the iterations in closed
        form. Returns where the engine waits and what it completes there. One call, not
        two: the engine makes it for every step (``make bench``)."""
        if self.macro_steps and (extra := self.scheduler.run_length(step, self.max_run)):
            edge = self._edge(start) if self.lookahead.edges else INF
            weights = self._weights(step, start + compute_s, extra, edge)
            if weights is not None:
                return self._advance(step, start, compute_s, weights, edge)
        # The step alone. Rows are written as steps start (memory as the step starts), so
        # they stay in time order across replicas.
        u = self._usage()
        duration = max(compute_s, swap_s) if swap_s and self.overlap_swap else compute_s + swap_s
        self._record(step, start, duration, 1, step.shape.decode_seqs, step.num_groups, u.token_states,
                     u.reserved, u.internal_frag, u.allocator_frag, u.free, u.unshared or (u.capacity - u.free),
                     swap_s)
        return _new(RunEnd, (start + (compute_s + swap_s), step, None))  # as SimPy adds a timeout's delay

    def memory(self) -> MemoryUsage:
        """The replica's memory by class now (slots): what a router reads of it."""
        return self._usage()

    def plan(self, step: Step, start: float, compute_s: float, swap_s: float) -> Run:
        """What ``run`` would plan for ``step``, without applying anything (to look at it:
        tests, debugging): the step and the identical decode iterations sure to follow it."""
        extra = self.scheduler.run_length(step, self.max_run) if self.macro_steps else 0
        edge = self._edge(start) if extra else INF
        weights = self._weights(step, start + compute_s, extra, edge) if extra else None
        return _new(Run, (step, start, compute_s, swap_s, weights, edge))

    # --- planning -----------------------------------------------------------------------
    def _edge(self, start: float) -> float:
        """The first explicit window edge after ``start`` (s; INF: none)."""
        return next((e for e in self.lookahead.edges if e > start), INF)

    def _weights(self, step: Step, first_end: float, extra: int, edge: float) -> RunWeights | None:
        """Up to ``extra`` iterations after ``step`` (which ends at ``first_end``, s) before
        anything could change them, in closed form (None: none). ``edge``: the window's."""
        sched = self.scheduler
        # With nothing waiting, an arrival may be admitted at the next step boundary.
        cut = edge if sched.waiting else min(edge, self.lookahead.next_arrival)
        cut = min(cut, sched.next_load_s)  # a load's end puts its request at the head
        shape = step.shape
        return plan_weights(self.cost, shape.decode_seqs, shape.decode_context, extra, first_end, cut)

    # --- a run, and past finishes while no admission can follow them -------------------
    def _advance(self, step: Step, start: float, d0: float, run: RunWeights, edge: float) -> RunEnd:
        """Apply the step's run of identical decode iterations, and go on past finishes
        while no admission can follow them (up to the next arrival and the window edge);
        write one row for it all.

        Groups that finish before the next arrival are retired now, at their finish
        time: nothing can observe the replica before then.
        """
        sched, cost, look = self.scheduler, self.cost, self.lookahead
        alloc = sched.alloc
        due: Step | None = step  # still to complete
        u = self._usage()
        groups = step.num_groups
        # Duration-weighted sums: seconds, group-seconds and slot-seconds by class.
        seconds, group_s = d0, groups * d0
        token_s, reserved_s, internal_s, free_s = u.token_states * d0, u.reserved * d0, u.internal_frag * d0, u.free * d0
        rounding_s = u.allocator_frag * d0
        unshared_s = (u.unshared or (u.capacity - u.free)) * d0
        iterations, tokens = 1, step.shape.decode_seqs
        t, n = start + d0, step.shape.decode_seqs  # n: sequences decoding in the run
        while True:
            i = alloc.advance_all(run, u)  # slot-seconds over the run
            token_s += i.token_states
            reserved_s += i.reserved
            internal_s += i.internal_frag
            rounding_s += i.allocator_frag
            free_s += i.free
            unshared_s += i.unshared
            seconds += run.total
            group_s += groups * run.total
            iterations += run.steps
            tokens += n * run.steps
            t += run.total
            cut = min(edge, look.next_arrival, sched.next_load_s)
            if t >= cut:  # an arrival (or the window's edge) comes first: the engine wakes at t
                break
            complete_due(sched, due, run, t)
            due = None
            k = sched.continue_length(self.max_run)
            n, c0 = alloc.resident_kv()
            run = plan_weights(cost, n, c0, k, t, cut) if k else None
            if run is None:
                break
            u, groups = self._usage(), len(sched.running)
        self._record(step, start, seconds, iterations, tokens, group_s / seconds, token_s / seconds,
                     reserved_s / seconds, internal_s / seconds, rounding_s / seconds, free_s / seconds,
                     unshared_s / seconds)
        return _new(RunEnd, (t, due, run))

    # --- rows ---------------------------------------------------------------------------
    def _record(self, step: Step, start: float, duration: float, iterations: int, decode_tokens: int,
                groups: float, token_states: float, reserved: float, internal_frag: float,
                allocator_frag: float, free: float, unshared: float, swap_s: float = 0.0) -> None:
        """One row: ``step``'s counters, the queues now, and memory (slots) split by class."""
        self._append(step_row((
            self.index, start, duration, iterations, step.shape.prefill_tokens, step.recompute_tokens,
            step.cached_tokens, decode_tokens, groups, step.preempted_swap, step.preempted_recompute,
            step.aborted, step.swap_out_blocks, step.swap_in_blocks, step.swap_out_slots, step.swap_in_slots,
            swap_s, step.cow_copies,
        ) + self.state(self.replica, token_states, reserved, internal_frag, allocator_frag, free, unshared)))
