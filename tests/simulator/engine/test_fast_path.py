"""The fast path (simulator/engine/fast_path.py): run planning in closed form, what an applied run
leaves to complete, and the engine loop that stays the story (no allocator calls, one screen).
Identical results with and without the fast path are tests/simulator/engine/test_macro_steps*.py's
and the differential tests' business."""

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest

from kvsim.policies.kv_allocator import RunWeights
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.engine import simulation as engine
from kvsim.simulator.engine.fast_path import INF, FastPath, Lookahead, RunEnd, plan_weights
from kvsim.simulator.engine.step_log import StepLog
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings, Step
from kvsim.traces import Request


class AffineCost:
    """Decode iteration i of n sequences holding c0 tokens lasts a + b * (c0 + n * i) s
    (powers of two by default, so that sums are exact and boundaries can be hit exactly)."""

    def __init__(self, a: float = 2.0**-6, b: float = 2.0**-16, span: int = 10**9):
        self.a, self.b, self.span = a, b, span

    def decode_segment(self, n: int, context: int) -> tuple[float, float, int]:
        return self.a, self.b, self.span


def iteration_ends(n: int, c0: int, steps: int, first_end: float, cost: AffineCost) -> list[float]:
    """End time of every iteration, summed one at a time (the plain way)."""
    t, ends = first_end, []
    for i in range(1, steps + 1):
        t += cost.a + cost.b * (c0 + n * i)
        ends.append(t)
    return ends


def test_a_run_with_no_cut_takes_every_iteration_asked_for():
    cost = AffineCost()
    run = plan_weights(cost, n=4, c0=1000, extra=50, first_end=1.0, cut=INF)
    assert run.steps == 50
    assert 1.0 + run.total == pytest.approx(iteration_ends(4, 1000, 50, 1.0, cost)[-1], rel=1e-12)


def test_a_run_stops_at_the_first_iteration_boundary_at_or_after_the_cut():
    cost = AffineCost()
    ends = iteration_ends(4, 1000, 50, 1.0, cost)
    for k in (1, 7, 30):
        cut = (ends[k - 2] if k > 1 else 1.0) + 1e-6  # just after iteration k - 1 ends
        run = plan_weights(cost, 4, 1000, 50, 1.0, cut)
        assert run.steps == k, cut
        cut = ends[k - 1]  # exactly when iteration k ends: it is the last one
        assert plan_weights(cost, 4, 1000, 50, 1.0, cut).steps == k


def test_no_run_when_the_cut_comes_before_the_step_ends():
    assert plan_weights(AffineCost(), 4, 1000, 50, first_end=2.0, cut=2.0) is None
    assert plan_weights(AffineCost(), 4, 1000, 50, first_end=2.0, cut=1.5) is None


def test_a_run_ends_where_the_cost_models_affine_segment_ends():
    assert plan_weights(AffineCost(span=12), 4, 1000, 50, 1.0, INF).steps == 12


class Recorder:
    """Stands in for a scheduler: records what it is asked to complete."""

    def __init__(self):
        self.calls = []

    def complete(self, step, now, *, run=None):
        self.calls.append(("complete", step, now, run))

    def complete_run(self, run, now):
        self.calls.append(("complete_run", run, now))


@pytest.mark.parametrize("case", ["step", "step and run", "run", "nothing"])
def test_a_run_end_completes_exactly_what_is_still_due(case):
    step, rest = Step(), RunWeights(3, 0.1, 0.01)
    done = {"step": RunEnd(2.0, step, None), "step and run": RunEnd(2.0, step, rest),
            "run": RunEnd(2.0, None, rest), "nothing": RunEnd(2.0, None, None)}[case]
    sched = Recorder()
    done.complete(sched, 2.0)
    want = {"step": [("complete", step, 2.0, None)], "step and run": [("complete", step, 2.0, rest)],
            "run": [("complete_run", rest, 2.0)], "nothing": []}[case]
    assert sched.calls == want


def steady_decode(macro: bool, outputs=(300, 300)):
    """A scheduler whose requests decode (their prefill done), its fast path and its step log."""
    limits = SchedulerSettings(max_seq_len=2048)
    ended = []
    sched = Scheduler(PagedAllocator(400, 16), limits, on_terminal=ended.append)
    for i, out in enumerate(outputs):
        sched.add(Request(i, 0.0, 100, out), 0.0)
    cost = RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])
    steps = StepLog(keep_rows=True)
    fast = FastPath(SimpleNamespace(index=0, scheduler=sched), cost, steps, Lookahead(), macro_steps=macro)
    prefill = sched.schedule(0.0)
    done = fast.run(prefill, 0.0, cost.step_time(prefill.shape), 0.0)
    done.complete(sched, done.end)
    return sched, cost, fast, steps, sched.schedule(done.end), done.end, ended


def test_without_macro_steps_every_step_is_planned_alone():
    sched, cost, fast, steps, step, now, _ = steady_decode(macro=False)
    run = fast.plan(step, now, cost.step_time(step.shape), 0.0)
    assert run.weights is None
    done = fast.run(step, now, cost.step_time(step.shape), 0.0)
    assert done.step is step and done.rest is None
    assert steps.frame()["iterations"].tolist() == [1, 1]


def test_with_nothing_waiting_a_run_goes_past_finishes_and_retires_them_in_one_row():
    sched, cost, fast, steps, step, now, ended = steady_decode(macro=True, outputs=(300, 500))
    done = fast.run(step, now, cost.step_time(step.shape), 0.0)
    assert done.step is None and done.rest is None  # all of it completed on the way
    assert [g.request.request_id for g in ended] == [0, 1] and not sched.running
    row = steps.frame().iloc[-1]
    assert row["iterations"] == 499  # the prefill sampled each request's first token
    assert row["decode_tokens"] == 2 * 299 + 200
    assert ended[1].finish == done.end == pytest.approx(now + row["duration_s"], rel=1e-12)
    assert ended[0].finish < ended[1].finish


def test_a_run_stops_at_the_next_arrival_and_leaves_its_last_part_to_complete():
    sched, cost, fast, steps, step, now, ended = steady_decode(macro=True, outputs=(300, 500))
    fast.lookahead.next_arrival = now + 0.5
    run = fast.plan(step, now, cost.step_time(step.shape), 0.0)
    done = fast.run(step, now, cost.step_time(step.shape), 0.0)
    assert done.step is step and done.rest == run.weights  # nothing finished before the arrival
    a, b = cost.decode_coefficients(2)
    assert now + 0.5 <= done.end < now + 0.5 + a + b * 2 * 600  # the first boundary at or after it
    assert not ended
    done.complete(sched, done.end)
    iterations = steps.frame()["iterations"].iloc[-1]
    assert [g.generated for g in sched.running] == [1 + iterations] * 2  # the prefill's token, then the run's


@pytest.mark.parametrize("macro", [True, False])
@pytest.mark.parametrize("arrival", [INF, 0.5, 0.0])
@pytest.mark.parametrize("edge", [None, 0.3])
def test_run_applies_what_plan_shows(macro, arrival, edge):
    """``plan`` (a look, applying nothing) and ``run`` (the engine's call) agree: a step
    planned alone is one row ending after its compute; a planned run is applied whole, and
    when nothing was completed on the way its rest is exactly the planned iterations."""
    sched, cost, fast, steps, step, now, ended = steady_decode(macro, outputs=(300, 500, 40))
    fast.lookahead.next_arrival = now + arrival
    if edge is not None:
        fast.lookahead.edges = (now + edge,)
    runs = 0
    while sched.has_work:
        compute = cost.step_time(step.shape)
        planned = fast.plan(step, now, compute, 0.0)
        done = fast.run(step, now, compute, 0.0)
        iterations = steps.frame()["iterations"].iloc[-1]
        if planned.weights is None:
            assert (done.end, done.step, done.rest, iterations) == (now + compute, step, None, 1)
        else:
            runs += 1
            assert iterations >= 1 + planned.weights.steps
            planned_end = now + compute + planned.weights.total
            if planned_end >= planned.edge:  # the window's edge ends the run: nothing goes on past it
                assert done.end == planned_end and iterations == 1 + planned.weights.steps
            if done.step is step:
                assert done.rest == planned.weights and iterations == 1 + planned.weights.steps
        done.complete(sched, done.end)
        now = done.end
        step = sched.schedule(now)
    assert len(ended) == 3  # every request ended
    assert (runs > 0) == (macro and arrival > 0)  # an arrival due now cuts every run before it starts


# --- the engine stays the story -------------------------------------------------------------

def engine_source(name: str) -> str:
    return textwrap.dedent(inspect.getsource(getattr(engine.Simulation, name)))


def test_the_engine_never_reaches_into_the_allocator():
    tree = ast.parse(inspect.getsource(engine))
    reached = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "alloc"})
    assert reached == [], "simulator/engine/simulation.py must not use scheduler.alloc: go through the scheduler or fast path"


def test_the_engine_loop_fits_on_one_screen():
    lines = engine_source("_engine").splitlines()
    assert len(lines) <= 35, f"the engine loop has {len(lines)} lines"
    body = "\n".join(lines)
    for word in ("schedule(", "step_seconds(", "yield", "complete("):  # schedule, cost, wait, complete
        assert word in body
