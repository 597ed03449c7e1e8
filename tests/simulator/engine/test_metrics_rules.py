"""Every number ``summarize`` publishes, from a hand-made request table and step table.

``tests/simulator/engine/test_summary_numbers.py`` covers the latency statistics; this file pins
the rest of the summary (step counters, memory shares, preemption traffic, goodput at its
SLO boundaries, the one-token request, the measurement window) to values worked out here.
Every time and duration is a sum of powers of two, so each expectation is exact in floating
point.

Requests (times in seconds; the trace starts at 10 s):
  r0: arrives 10, first token 10.5, ends 10.75; 2 tokens, prompt 8. TTFT 0.5, TPOT 0.25/1.
      Preempted once, recomputed 3 tokens, swapped 4 blocks out and 4 in.
  r1: arrives 10.25, first token 10.5, ends 10.5; ONE token, prompt 4. TTFT 0.25, no TPOT.
  r2: arrives 10.5, aborted ("swap space exhausted") at 10.625 after 2 preemptions,
      5 recomputed tokens, 6 blocks swapped out.
Duration: first arrival 10 to last finish 10.75 = 0.75 s (under a second on purpose).

Steps (replica 0; CLASSES sum to the capacity of 100 slots):
  A: start 0,   0.5 s, 1 iteration, prefill 10 (4 recomputed, 3 cached), 2 requests,
     1 swap and 2 recompute preemptions, 7 slots out, swap 0.125 s,
     classes 40/20/10/5/0/25, unshared 80.
  B: start 0.5, 0.25 s, 3 iterations, decode 6, 2 requests, 9 slots in, swap 0.0625 s,
     4 copy-on-write copies, classes 50/10/10/0/0/30, unshared 70.
  C: start 2,   1 s, 1 iteration, decode 1, 1 request, classes 10/0/0/0/0/90, unshared 10.
The window (0, 1) measures A and B only: 0.75 s.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest

from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.metrics import REQUEST_COLUMNS, RequestLog, summarize
from kvsim.simulator.engine.step_log import STEP_COLUMNS, StepTotals
from kvsim.simulator.latency_histogram import LatencyHistogram

NAN = float("nan")
REQUESTS = [  # in REQUEST_COLUMNS order
    (0, 0, "finished", None, 10.0, 8, 2, 1, 2, 2, 0, 10.0, 10.5, 10.75, 1, 3, 4, 4, 0, 0.0),
    (1, 0, "finished", None, 10.25, 4, 1, 1, 1, 1, 0, 10.25, 10.5, 10.5, 0, 0, 0, 0, 0, 0.0),
    (2, 0, "aborted", "swap space exhausted", 10.5, 6, 9, 1, 0, 9, 0, 10.5, NAN, 10.625,
     2, 5, 6, 0, 0, 0.0),
]
DURATION = 0.75


def step(**values) -> dict:
    row = dict.fromkeys(STEP_COLUMNS, 0)
    row.update(values)
    return row


def classes(*slots: int) -> dict:
    return dict(zip(CLASSES, slots))


STEPS = pd.DataFrame([
    step(start_s=0.0, duration_s=0.5, iterations=1, prefill_tokens=10, recompute_tokens=4,
         cached_tokens=3, batched_requests=2, preempted_swap=1, preempted_recompute=2,
         swap_out_blocks=5, swap_out_slots=7, swap_s=0.125, waiting=1, unshared_slots=80,
         **classes(40, 20, 10, 0, 5, 0, 25)),
    step(start_s=0.5, duration_s=0.25, iterations=3, decode_tokens=6, batched_requests=2,
         aborted=1, swap_in_blocks=2, swap_in_slots=9, swap_s=0.0625, cow_copies=4, swapped=1,
         unshared_slots=70, **classes(50, 10, 10, 0, 0, 0, 30)),
    step(start_s=2.0, duration_s=1.0, iterations=1, decode_tokens=1, batched_requests=1,
         unshared_slots=10, **classes(10, 0, 0, 0, 0, 0, 90)),
])


def itl() -> LatencyHistogram:
    """100 gaps of 10 ms and one of 1 s: the p99 (rank 100 of 101) is 10 ms, the max 1 s."""
    h = LatencyHistogram()
    h.add(0.01, 100)
    h.add(1.0)
    return h


def summary(**kw) -> dict:
    return summarize(pd.DataFrame(REQUESTS, columns=REQUEST_COLUMNS), STEPS, itl(), 100,
                     window=(0.0, 1.0), **kw)


def test_request_counts_throughputs_and_the_one_token_request():
    """A one-token request has TTFT and E2E but no TPOT, and its tpot does not count.

    Mean TTFT (500 + 250) / 2 = 375 ms; TPOT only r0's 250 ms (r1 counted as 0 would make it
    125); normalized latency mean(0.75 / 2, 0.25 / 1) = 0.3125 s/token. Throughputs over
    0.75 s: 2 requests, 3 output tokens, 3 + 8 + 4 tokens (the aborted r2 counts in none).
    """
    s = summary()
    assert (s["num_requests"], s["completed"], s["rejected"], s["aborted"]) == (3, 2, 0, 1)
    assert s["duration_s"] == DURATION
    assert s["request_throughput"] == 2 / DURATION
    assert s["output_throughput"] == 3 / DURATION
    assert s["total_token_throughput"] == (3 + 8 + 4) / DURATION
    assert s["mean_ttft_ms"] == 375.0
    assert s["mean_tpot_ms"] == s["median_tpot_ms"] == s["p99_tpot_ms"] == 250.0
    assert s["mean_e2el_ms"] == (750.0 + 250.0) / 2
    assert s["normalized_latency_s_per_token"] == (0.75 / 2 + 0.25 / 1) / 2
    assert s["request_goodput"] == 2 / DURATION  # no SLO: every completed request


def test_inter_token_latency_statistics():
    """Mean (100 x 0.01 + 1) / 101 s; median and p99 in the 10 ms bucket (not the 1 s max)."""
    s = summary()
    assert s["mean_itl_ms"] == pytest.approx((100 * 0.01 + 1.0) / 101 * 1000)
    assert s["median_itl_ms"] == pytest.approx(10.0, rel=1e-3)
    assert s["p99_itl_ms"] == pytest.approx(10.0, rel=1e-3)


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        # r0 sits exactly on both limits (500 ms TTFT, 250 ms TPOT): "within" includes equality.
        ({"slo_ttft_ms": 500, "slo_tpot_ms": 250}, 2),
        ({"slo_ttft_ms": 500}, 2),
        ({"slo_tpot_ms": 250}, 2),
        # r0 misses the TTFT limit but meets the TPOT one: both must hold, so only r1.
        ({"slo_ttft_ms": 400, "slo_tpot_ms": 250}, 1),
        # r1 has one token and no TPOT: a tight TPOT limit does not drop it.
        ({"slo_tpot_ms": 1}, 1),
        ({"slo_ttft_ms": 250}, 1),
    ],
)
def test_goodput_at_the_slo_boundaries(slo, good):
    assert summary(**slo)["request_goodput"] == good / DURATION


def test_step_counters_and_preemption_traffic():
    """Counters sum over all steps (window or not); per-request totals over all requests.

    Recompute time: step A spent 4/10 of its compute (0.5 s less 0.125 s of swap) on
    recomputed tokens: 0.4 x 0.375 = 0.15 s.
    """
    s = summary()
    assert s["num_steps"] == 1 + 3 + 1
    assert s["engine_rows"] == 3
    assert (s["prefill_tokens"], s["decode_tokens"], s["cached_prompt_tokens"]) == (10, 7, 3)
    assert s["busy_time_s"] == 1.75
    assert s["num_preemptions"] == 1 + 0 + 2  # from the request table
    assert (s["num_preemptions_swap"], s["num_preemptions_recompute"]) == (1, 2)  # the steps
    assert s["recomputed_tokens"] == 3 + 5
    assert (s["swapped_out_blocks"], s["swapped_in_blocks"]) == (4 + 6, 4)
    assert s["recompute_time_s"] == pytest.approx(0.4 * 0.375)
    assert s["swap_time_s"] == 0.125 + 0.0625
    assert (s["swap_out_slots"], s["swap_in_slots"], s["cow_copies"]) == (7, 9, 4)
    assert s["abort_reasons"] == {"swap space exhausted": 1}


def test_memory_shares_are_averaged_over_the_window():
    """Window (0, 1): steps A (0.5 s) and B (0.25 s), 0.75 s measured, capacity 100 slots.

    token_states (40 x 0.5 + 50 x 0.25) / 0.75 = 43.33%; reserved (10 + 2.5) / 0.75 = 16.67%;
    internal (5 + 2.5) / 0.75 = 10%; external 2.5 / 0.75 = 3.33%; idle (12.5 + 7.5) / 0.75.
    Mean batch 2. Memory saving over all steps: allocated 70 x 0.5 + 70 x 0.25 + 10 x 1 = 62.5,
    unshared 80 x 0.5 + 70 x 0.25 + 10 x 1 = 67.5 slot-seconds: (1 - 62.5 / 67.5) x 100.
    """
    s = summary()
    assert s["measured_time_s"] == 0.75
    assert s["mean_batched_requests"] == pytest.approx(2.0)
    want = {"token_states": 32.5, "reserved": 12.5, "internal_frag": 7.5, "allocator_frag": 0.0, "external_frag": 2.5,
            "stranded_free": 0.0, "idle_free": 20.0}  # slot-seconds in the window
    for c in CLASSES:
        assert s[f"mem_{c}_perc"] == pytest.approx(want[c] / 0.75 / 100 * 100), c
    assert s["kv_cache_usage_perc"] == pytest.approx((32.5 + 12.5 + 7.5) / 0.75)
    assert s["memory_saving_perc"] == pytest.approx((1 - 62.5 / 67.5) * 100)


def test_without_measured_steps_the_averages_are_zero():
    """A window with no step in it: no time measured, so batch and shares are 0, not NaN."""
    s = summarize(pd.DataFrame(REQUESTS, columns=REQUEST_COLUMNS), STEPS, itl(), 100,
                  window=(5.0, 6.0))
    assert s["measured_time_s"] == 0.0
    assert s["mean_batched_requests"] == 0.0
    assert s["kv_cache_usage_perc"] == 0.0
    assert all(s[f"mem_{c}_perc"] == 0.0 for c in CLASSES)


def test_the_default_window_is_every_step():
    """busy: A, B and C, 1.75 s: mean batch (2 x 0.5 + 2 x 0.25 + 1 x 1) / 1.75."""
    s = summarize(pd.DataFrame(REQUESTS, columns=REQUEST_COLUMNS), STEPS, itl(), 100)
    assert s["measured_time_s"] == 1.75
    assert s["mean_batched_requests"] == pytest.approx(2.5 / 1.75)
    assert s == summarize(pd.DataFrame(REQUESTS, columns=REQUEST_COLUMNS),
                          StepTotals.from_frame(STEPS, "busy"), itl(), 100)


@pytest.mark.parametrize("rows", [[], REQUESTS[2:]], ids=["empty", "none-completed"])
def test_a_run_with_nothing_completed_warns_about_nothing(rows):
    """No mean of an empty array (numpy would warn and print to the user's console):
    latency statistics are NaN by choice, SLO goodput is 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = summarize(pd.DataFrame(rows, columns=REQUEST_COLUMNS), StepTotals(), LatencyHistogram(),
                      100, slo_ttft_ms=100, slo_tpot_ms=100)
    assert s["request_goodput"] == 0.0
    assert s["completed"] == 0 and s["duration_s"] == 0.0
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                "mean_e2el_ms", "median_e2el_ms", "normalized_latency_s_per_token", "mean_itl_ms"):
        assert s[key] != s[key], key  # NaN


def test_memory_saving_is_the_share_of_slot_seconds_sharing_saved():
    """0.25 slot-seconds allocated where 0.5 would be held unshared: sharing saved 50%.
    Nothing held at all (an empty run): nothing saved, 0%."""
    rows = pd.DataFrame(REQUESTS, columns=REQUEST_COLUMNS)
    totals = StepTotals(allocated_slot_s=0.25, unshared_slot_s=0.5)
    assert summarize(rows, totals, itl(), 100)["memory_saving_perc"] == 50.0
    assert summarize(rows, StepTotals(), itl(), 100)["memory_saving_perc"] == 0.0


def test_the_request_log_keeps_missing_values_missing():
    """Times that never happened (an aborted request's first token) are NaN in a float
    column; a finished request has no reason (missing)."""
    log = RequestLog()
    for row in REQUESTS:
        log.append(tuple(None if isinstance(v, float) and v != v else v for v in row))
    df = log.frame()
    assert len(log) == 3 and list(df.columns) == list(REQUEST_COLUMNS)
    assert df["reason"].isna().tolist() == [True, True, False]
    assert df["reason"][2] == "swap space exhausted"
    assert df["first_token_s"].dtype == np.float64 and np.isnan(df["first_token_s"][2])
    assert df["finish_s"].tolist() == [10.75, 10.5, 10.625]
    assert df["preemptions"].tolist() == [1, 0, 2]


def test_an_empty_request_log_has_numeric_columns():
    """No request ended: the frame is empty but its numeric columns are still numbers (the
    summary computes on them), not Python objects."""
    df = RequestLog().frame()
    assert len(df) == 0 and list(df.columns) == list(REQUEST_COLUMNS)
    for c in REQUEST_COLUMNS:
        if c not in ("status", "reason"):
            assert df[c].dtype == np.float64, c
    assert summarize(df, StepTotals(), LatencyHistogram(), 100)["num_requests"] == 0


def test_the_request_log_sorts_by_id_and_keeps_integers_exact():
    """Rows come in the order requests end; the table is by request id. Integer columns are
    signed 64-bit integers, not floats: exact, and any id a hand-made request list used
    (the trace loaders number from 0, but ``Request`` takes any int) comes back unchanged."""
    log = RequestLog()
    late, early = list(REQUESTS[0]), list(REQUESTS[1])
    late[0], early[0] = 5, -1
    early[3] = late[3] = "x"
    log.append(tuple(late))
    log.append(tuple(early))
    df = log.frame()
    assert df["request_id"].tolist() == [-1, 5]
    assert df["arrival_s"].tolist() == [10.25, 10.0]
    for c in ("request_id", "prompt_tokens", "preemptions", "swapped_in_blocks"):
        assert df[c].dtype == np.int64, c


def test_the_request_log_holds_a_number_in_8_bytes():
    """A million-request run keeps a million rows: the log stores each number as a machine
    value in a column (8 bytes), not as a Python object (28 bytes for an int, 24 for a float,
    plus an 8-byte pointer). 8192 rows of 18 numbers and 2 texts, measured with tracemalloc:
    about 8 bytes a value (arrays over-allocate by an eighth); objects would take over 30."""
    rows = 8192
    tracemalloc.start()
    try:
        log = RequestLog()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(rows):
            big = 1000 + i  # beyond the small ints Python shares
            t = 0.5 * i + 0.1
            log.append((big, big, "finished", None, t, big, big, big, big, big, big, t, t, t,
                        big, big, big, big, big, t))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(log) == rows
    assert held < 12 * rows * len(REQUEST_COLUMNS)


def test_the_request_log_converts_each_value_as_its_column_type_does():
    """Numbers move to the columns in bulk as machine values (``struct``): an integer column
    keeps any int64 exactly, numpy integers included; a seconds column takes an int as
    float() does; a row's values stay in their own columns and rows in their order."""
    log = RequestLog()
    first = list(REQUESTS[0])
    first[0], first[5], first[4], first[-1] = 2**62 + 1, np.int64(-(2**63)), 3, np.float64(0.1)
    second = list(REQUESTS[1])
    second[0], second[6] = 2**63 - 1, 2**53 + 1
    log.append(tuple(first))
    log.append(tuple(second))
    df = log.frame()
    assert df["request_id"].tolist() == [2**62 + 1, 2**63 - 1]
    assert df["prompt_tokens"].tolist() == [-(2**63), REQUESTS[1][5]]
    assert df["output_tokens"].tolist() == [REQUESTS[0][6], 2**53 + 1]
    assert df["arrival_s"].tolist() == [3.0, REQUESTS[1][4]] and df["load_wait_s"].tolist() == [0.1, 0.0]
    for i, c in enumerate(REQUEST_COLUMNS):
        if c not in ("request_id", "prompt_tokens", "output_tokens", "arrival_s", "load_wait_s", "reason"):
            assert df[c].tolist() == [REQUESTS[0][i], REQUESTS[1][i]], c
