"""StepLog without rows folds buffered rows into running totals in blocks; whatever the
block size, the totals must equal ``StepTotals.from_frame`` on the kept rows."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.step_log import (
    COUNTERS,
    FLOAT_COLUMNS,
    MEASURED,
    STEP_COLUMNS,
    StepLog,
    StepRow,
    StepTotals,
    _as_block,
)

FLUSH_SIZES = st.sampled_from([1, 3, 7, 4096])  # 4096: the default, never reached here
COUNTS = st.integers(0, 30)


@st.composite
def step_rows(draw, waiting: str = "some", count=COUNTS) -> list[tuple]:
    """Rows in STEP_COLUMNS order, starts non-decreasing. ``waiting``: "none" (no row has
    a request waiting), "one" (exactly one row), "some" (any)."""
    n = draw(count)
    waiter = draw(st.integers(0, n - 1)) if waiting == "one" and n else None
    rows, start = [], 0.0
    for i in range(n):
        start += draw(st.sampled_from([0.0, 0.01, 0.25, 1.5]))
        duration = draw(st.floats(0, 2))
        prefill = draw(st.sampled_from([0, 0, 16, 300]))
        values = {
            "replica": draw(st.integers(0, 1)),
            "start_s": start,
            "duration_s": duration,
            "iterations": draw(st.integers(1, 8)),
            "prefill_tokens": prefill,
            "recompute_tokens": draw(st.integers(0, prefill)),
            "cached_tokens": draw(st.integers(0, 64)),
            "decode_tokens": draw(st.integers(0, 64)),
            "batched_requests": draw(st.floats(0, 64)),
            "swap_s": draw(st.sampled_from([0.0, 0.3, 1.0])) * duration,  # never longer than the step
            "waiting": {"none": 0, "one": 3 * (i == waiter), "some": draw(st.sampled_from([0, 0, 1, 5]))}[waiting],
            "unshared_slots": draw(st.floats(0, 1e4)),
        }
        for c in CLASSES:
            values[c] = draw(st.floats(0, 1e4))
        row = tuple(values[c] if c in values else draw(st.integers(0, 9)) for c in STEP_COLUMNS)
        rows.append(row)
    return rows


def windows(rows: list[tuple]):
    """Every window kind; interval edges often exactly on a step's start (the edge cases)."""
    starts = [r[STEP_COLUMNS.index("start_s")] for r in rows] or [0.0]
    edge = st.one_of(st.none(), st.sampled_from(starts), st.floats(-1, max(starts) + 1))
    return st.one_of(st.just("busy"), st.just("saturated"), st.tuples(edge, edge))


def summary_log(window, flush_rows: int) -> StepLog:
    log = StepLog(keep_rows=False, window=window)
    log.flush_rows = flush_rows
    return log


def reference(rows: list[tuple], window) -> StepTotals:
    kept = StepLog(keep_rows=True, window=window)
    for row in rows:
        kept.append(StepRow(*row))
    return StepTotals.from_frame(kept.frame(), window)


def assert_same_totals(got: StepTotals, want: StepTotals) -> None:
    close = pytest.approx  # sums of non-negative terms: only summation order differs
    assert got.rows == want.rows
    for name in ("busy_s", "recompute_time_s", "allocated_slot_s", "unshared_slot_s", "measured_s"):
        assert getattr(got, name) == close(getattr(want, name), rel=1e-9, abs=1e-12), name
    assert got.counters.keys() == set(COUNTERS)
    assert got.measured.keys() == set(MEASURED)
    for c in COUNTERS:
        assert got.counters[c] == close(want.counters[c], rel=1e-9, abs=1e-12), c
    for c in MEASURED:
        assert got.measured[c] == close(want.measured[c], rel=1e-9, abs=1e-12), c


@given(st.data(), FLUSH_SIZES)
def test_summary_totals_equal_totals_of_the_table(data, flush_rows):
    rows = data.draw(step_rows())
    window = data.draw(windows(rows))
    cut = data.draw(st.integers(0, len(rows)))  # totals are also asked for mid-run
    log = summary_log(window, flush_rows)
    for row in rows[:cut]:
        log.append(StepRow(*row))
    assert_same_totals(log.totals(), reference(rows[:cut], window))
    for row in rows[cut:]:
        log.append(StepRow(*row))
    assert_same_totals(log.totals(), reference(rows, window))


@given(step_rows(waiting="none"), FLUSH_SIZES)
def test_saturated_window_without_waiting_rows_is_empty(rows, flush_rows):
    log = summary_log("saturated", flush_rows)
    for row in rows:
        log.append(StepRow(*row))
    got = log.totals()
    assert got.measured_s == 0 and not any(got.measured.values())
    assert_same_totals(got, reference(rows, "saturated"))


@given(step_rows(waiting="one", count=st.integers(1, 30)), FLUSH_SIZES)
def test_saturated_window_with_one_waiting_row_is_that_row(rows, flush_rows):
    log = summary_log("saturated", flush_rows)
    for row in rows:
        log.append(StepRow(*row))
    got = log.totals()
    (row,) = [r for r in rows if r[STEP_COLUMNS.index("waiting")] > 0]
    duration = row[STEP_COLUMNS.index("duration_s")]
    assert got.measured_s == pytest.approx(duration, rel=1e-12)
    for c in MEASURED:
        assert got.measured[c] == pytest.approx(duration * row[STEP_COLUMNS.index(c)], rel=1e-12, abs=1e-12)
    assert_same_totals(got, reference(rows, "saturated"))


def test_saturated_window_spans_blocks_from_first_to_last_waiting_row():
    # Durations 1, 2, 4, 8, 16 s; requests wait at the 2nd and 4th step -> 2 + 4 + 8 s,
    # with the window opening in one two-row block and closing in the next.
    durations, waiting = [1.0, 2.0, 4.0, 8.0, 16.0], [0, 1, 0, 1, 0]
    log = summary_log("saturated", 2)
    for i, (d, w) in enumerate(zip(durations, waiting)):
        values = {"start_s": float(i), "duration_s": d, "waiting": w, "batched_requests": 2.0}
        log.append(StepRow(*(values.get(c, 0) for c in STEP_COLUMNS)))
    got = log.totals()
    assert got.measured_s == 14.0
    assert got.measured["batched_requests"] == 28.0
    assert got.busy_s == 31.0


@pytest.mark.parametrize("keep_rows", [False, True])
@pytest.mark.parametrize("flush_rows", [1, 2, 4096])
def test_saturated_window_is_each_replicas_own(keep_rows, flush_rows):
    # Rows in start order, (replica, duration s, waiting): replica 0 waits at its 1st and
    # 3rd rows (1 + 2 + 4 s), replica 1 only at its 2nd (32 s). Replica 1's first row
    # (16 s) starts between replica 0's waiting rows but is outside replica 1's window;
    # replica 0's last row (8 s) is after its own last waiting row.
    rows = [(0, 1.0, 1), (1, 16.0, 0), (0, 2.0, 0), (1, 32.0, 2), (0, 4.0, 1), (0, 8.0, 0), (1, 64.0, 0)]
    log = StepLog(keep_rows=keep_rows, window="saturated")
    log.flush_rows = flush_rows
    for i, (replica, d, w) in enumerate(rows):
        values = {"replica": replica, "start_s": float(i), "duration_s": d, "waiting": w, "batched_requests": 3.0}
        log.append(StepRow(*(values.get(c, 0) for c in STEP_COLUMNS)))
    got = log.totals()
    assert got.measured_s == 1 + 2 + 4 + 32
    assert got.measured["batched_requests"] == 3 * (1 + 2 + 4 + 32)
    assert got.busy_s == 127


@pytest.mark.parametrize("keep_rows", [False, True])
@pytest.mark.parametrize("flush_rows", [1, 3, 7])
def test_buffer_never_holds_more_than_flush_rows(keep_rows, flush_rows):
    log = StepLog(keep_rows=keep_rows, window="saturated")
    log.flush_rows = flush_rows
    row = tuple(1 for _ in STEP_COLUMNS)
    for i in range(25):
        log.append(StepRow(*row))
        assert len(log._pending) <= flush_rows  # the only rows a summary-only log holds
        assert len(log) == i + 1
    assert log._blocks if keep_rows else not log._blocks
    assert log.totals().rows == 25


@given(st.data(), FLUSH_SIZES)
def test_kept_rows_come_back_unchanged(data, flush_rows):
    rows = data.draw(step_rows())
    cut = data.draw(st.integers(0, len(rows)))
    log = StepLog(keep_rows=True)
    log.flush_rows = flush_rows
    for row in rows[:cut]:
        log.append(StepRow(*row))
    assert len(log.frame()) == cut  # asking mid-run must not lose or repeat rows
    for row in rows[cut:]:
        log.append(StepRow(*row))
    frame = log.frame()
    assert list(frame.columns) == list(STEP_COLUMNS)
    expected = np.array(rows, dtype=float).reshape(len(rows), len(STEP_COLUMNS))
    np.testing.assert_array_equal(frame.to_numpy(float), expected)
    for c in STEP_COLUMNS:
        assert frame[c].dtype == (np.float64 if c in FLOAT_COLUMNS else np.int64), c


def test_summary_log_has_an_empty_table():
    log = StepLog(keep_rows=False)
    log.append(StepRow(*(1 for _ in STEP_COLUMNS)))
    frame = log.frame()
    assert len(frame) == 0 and list(frame.columns) == list(STEP_COLUMNS)
    assert log.totals().rows == 1


def test_row_of_the_wrong_length_is_rejected():
    # A row is a named record: a missing value fails where the row is built, so it can
    # never shift the values after it into the wrong columns.
    with pytest.raises(TypeError, match="unshared_slots"):
        StepRow(*(1 for _ in STEP_COLUMNS[:-1]))


def test_columns_are_the_row_fields_with_the_memory_classes_in_order():
    assert STEP_COLUMNS[-1 - len(CLASSES):-1] == CLASSES
    assert STEP_COLUMNS[:3] == ("replica", "start_s", "duration_s")


def test_unknown_window_is_rejected():
    with pytest.raises(ValueError, match="'steady'.*allowed are 'busy', 'saturated'"):
        StepLog(window="steady")


def test_a_block_holds_each_value_as_float_would():
    """Rows become float64 blocks by packing (``_as_block``): each value converts as float()
    does (an int past 2**53 correctly rounded, numpy scalars and bools by value), in
    STEP_COLUMNS order, row after row."""
    width = len(STEP_COLUMNS)
    rows = [tuple(range(width)),
            tuple([2**53 + 1, np.int64(-7), np.float64(0.1), True] + [0.5 * i for i in range(width - 4)]),
            tuple(float(-i) for i in range(width))]
    block = _as_block(rows)
    assert block.dtype == np.float64 and block.shape == (3, width)
    assert block.tolist() == [[float(v) for v in row] for row in rows]
