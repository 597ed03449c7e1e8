"""The hot path's records ("no slower than before"): ``step_row`` builds the same
``StepRow`` as the named tuple's own constructor, a row of the wrong width is refused when
the log turns rows into a block (``step_row`` checks nothing, and a long row would shift
every column after it), and the fast path's ``Run``/``RunEnd`` are named values."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.kv_allocator import RunWeights
from kvsim.simulator.engine.fast_path import INF, Run, RunEnd
from kvsim.simulator.engine.step_log import STEP_COLUMNS, StepLog, StepRow, step_row
from kvsim.simulator.sched.scheduler import Step

VALUES = st.lists(st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6)),
                  min_size=len(STEP_COLUMNS), max_size=len(STEP_COLUMNS)).map(tuple)


@settings(max_examples=50, deadline=None)
@given(VALUES)
def test_step_row_is_the_named_tuples_own_row(values):
    row = step_row(values)
    assert type(row) is StepRow and row == StepRow(*values)
    assert row._asdict() == dict(zip(STEP_COLUMNS, values))


@pytest.mark.parametrize("keep_rows", [True, False])
@pytest.mark.parametrize("width", [len(STEP_COLUMNS) - 1, len(STEP_COLUMNS) + 1])
def test_a_row_of_the_wrong_width_is_refused_with_the_widths(keep_rows, width):
    log = StepLog(keep_rows=keep_rows)
    log.append(step_row(tuple(range(len(STEP_COLUMNS)))))
    log.append(step_row(tuple(range(width))))
    with pytest.raises(ValueError, match=f"step row of {width} values, expected {len(STEP_COLUMNS)}"):
        log.totals()


def test_rows_of_the_right_width_land_in_their_columns():
    log = StepLog(keep_rows=True)
    for i in range(3):
        log.append(step_row(tuple(float(i * 100 + c) for c in range(len(STEP_COLUMNS)))))
    frame = log.frame()
    for c, name in enumerate(STEP_COLUMNS):
        assert frame[name].tolist() == [i * 100 + c for i in range(3)], name


def test_run_and_run_end_are_named_values():
    step, weights = Step(), RunWeights(4, 0.1, 0.01)
    run = Run(step, 1.0, 0.5, 0.0, weights, INF)
    assert (run.step, run.start, run.compute_s, run.swap_s, run.weights, run.edge) == (
        step, 1.0, 0.5, 0.0, weights, INF)
    done = RunEnd(2.0, None, weights)
    assert (done.end, done.step, done.rest) == (2.0, None, weights)
    with pytest.raises(AttributeError):
        done.end = 3.0  # a value: what the engine waits for cannot change under it
