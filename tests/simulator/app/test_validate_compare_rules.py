"""``kvsim validate``'s comparison of a replay with a measured run, on hand-made tables.

The functions under test (``simulator/app/validate.py``): per-request latencies from the measured
request table and from kvsim's (``measured_latencies``, ``simulated_latencies``), their
summary (``latency_stats``), the per-second curves' alignment and error (``aligned``,
``curve_mae``, ``curve_stats``), the percent difference, and the two workload checks
(``_check_same_requests``, ``_check_all_served``) with their messages word for word.
Every time is a sum of powers of two, so each expectation is exact in floating point.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kvsim.simulator.app.measured_run import ValidateError
from kvsim.simulator.app.validate import (
    Latencies,
    _check_all_served,
    _check_same_requests,
    aligned,
    curve_mae,
    curve_stats,
    latency_stats,
    measured_latencies,
    pct_diff,
    simulated_latencies,
)

NAN = float("nan")


def same(got, want) -> bool:
    """Arrays equal element by element, NaN equal to NaN (and inf only to inf)."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    return got.shape == want.shape and bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))))


# --- latencies ------------------------------------------------------------------------------


def test_measured_latencies_per_request_and_the_makespan():
    """Three measured requests (s): r0 queued 0, first token 1, last 3, 3 tokens: TTFT 1,
    TPOT (3 - 1) / 2 = 1, E2E 3. r1 queued 1, first 1.5, last 2, ONE token: TPOT NaN (a
    one-token output has no gap; the table's last > first must not make it (2 - 1.5) / 0 =
    inf). r2 queued 0.5, first 2, last 2.5, 2 tokens: TPOT 0.5 / 1. Makespan: the latest
    last token (3) less the earliest queue time (0) = 3 (not the earliest last token, 2)."""
    t = pd.DataFrame({"queued_ts": [0.0, 1.0, 0.5], "first_token_ts": [1.0, 1.5, 2.0],
                      "last_token_ts": [3.0, 2.0, 2.5], "output_toks": [3, 1, 2]})
    lat = measured_latencies(t)
    assert same(lat.ttft, [1.0, 0.5, 1.5])
    assert same(lat.tpot, [1.0, NAN, 0.5])
    assert same(lat.e2e, [3.0, 1.0, 2.0])
    assert same(lat.output_tokens, [3, 1, 2])
    assert lat.makespan_s == 3.0
    # the makespan's start is the earliest queue time, not the first row's
    t2 = t.assign(queued_ts=[0.5, 1.0, 0.25])
    assert measured_latencies(t2).makespan_s == 2.75


def test_simulated_latencies_sort_by_request_id_and_blank_unfinished_requests():
    """kvsim's table out of id order: rows for ids 2, 0, 1. Sorted by id: r0 arrives 0, first
    token 1, ends 3, 3 tokens (TPOT 1); r1 arrives 0.5, REJECTED (its first token and finish
    columns hold numbers, which must not count: NaN latencies), r2 arrives 0.25, first 2,
    ends 2.5 with 2 tokens (TPOT 0.5), r3 arrives 1, first 1.5, ends 2 with ONE token (TPOT
    NaN). Makespan: the latest finish of a finished request (3; r1's 4 would give 4) less
    the earliest arrival (0)."""
    t = pd.DataFrame({"request_id": [2, 0, 1, 3], "arrival_s": [0.25, 0.0, 0.5, 1.0],
                      "first_token_s": [2.0, 1.0, 0.5, 1.5], "finish_s": [2.5, 3.0, 4.0, 2.0],
                      "output_tokens": [2, 3, 5, 1],
                      "status": ["finished", "finished", "rejected", "finished"]})
    lat = simulated_latencies(t)
    assert same(lat.ttft, [1.0, NAN, 1.75, 0.5])
    assert same(lat.tpot, [1.0, NAN, 0.5, NAN])  # r3: one token (finish > first: still NaN)
    assert same(lat.e2e, [3.0, NAN, 2.25, 1.0])
    assert same(lat.output_tokens, [3, 5, 2, 1])
    assert lat.makespan_s == 3.0
    # a table without a status column counts every row as finished
    lat = simulated_latencies(t.drop(columns="status"))
    assert same(lat.ttft, [1.0, 0.0, 1.75, 0.5])
    assert same(lat.e2e, [3.0, 3.5, 2.25, 1.0])
    assert same(lat.tpot, [1.0, 0.875, 0.5, NAN])
    assert lat.makespan_s == 4.0


def test_simulated_makespan_is_nan_when_nothing_finished():
    """Every request rejected: no finish at all, so no makespan (NaN, not an error)."""
    t = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "first_token_s": [NAN, NAN],
                      "finish_s": [NAN, NAN], "output_tokens": [2, 2], "status": ["rejected", "rejected"]})
    lat = simulated_latencies(t)
    assert math.isnan(lat.makespan_s)
    assert same(lat.e2e, [NAN, NAN])
    # one finished request is enough: its finish 2 less the earliest arrival (r0's 0) = 2
    t.loc[1, ["first_token_s", "finish_s", "status"]] = [1.5, 2.0, "finished"]
    assert simulated_latencies(t).makespan_s == 2.0


def test_latency_stats_means_percentiles_and_throughputs():
    """TTFT 1, 2, 3, 4, 5 s (and one NaN, left out): mean 3, p50 3, p90 1 + 0.9 x 4 = 4.6,
    p99 4.96 (numpy's linear percentiles). TPOT 0.5, 0.25 s and NaNs: reported in ms, mean
    375, p50 375, p90 250 + 0.9 x 250 = 475, p99 497.5. E2E 2, 4, 6, 8, 10 (and NaN): mean 6.
    Makespan 8 s. The five finished requests (finite E2E) produced 1 + 2 + 3 + 4 + 6 = 16
    tokens (the NaN one's 100 do not count): 2 tokens/s, 5 / 8 = 0.625 requests/s."""
    lat = Latencies(ttft=np.array([1.0, 2.0, NAN, 3.0, 4.0, 5.0]),
                    tpot=np.array([NAN, 0.5, NAN, 0.25, NAN, NAN]),
                    e2e=np.array([2.0, 4.0, NAN, 6.0, 8.0, 10.0]),
                    output_tokens=np.array([1.0, 2.0, 100.0, 3.0, 4.0, 6.0]), makespan_s=8.0)
    s = latency_stats(lat)
    assert s == pytest.approx({
        "ttft_mean": 3.0, "ttft_p50": 3.0, "ttft_p90": 4.6, "ttft_p99": 4.96,
        "tpot_mean": 375.0, "tpot_p50": 375.0, "tpot_p90": 475.0, "tpot_p99": 497.5,
        "e2e_mean": 6.0, "e2e_p50": 6.0, "e2e_p90": 9.2, "e2e_p99": 9.92,
        "makespan_s": 8.0, "output_throughput": 2.0, "request_throughput": 0.625,
    }, rel=1e-12)
    assert list(s) == ["ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p90",
                       "tpot_p99", "e2e_mean", "e2e_p50", "e2e_p90", "e2e_p99", "makespan_s",
                       "output_throughput", "request_throughput"]


def test_latency_stats_of_nothing_are_nan():
    """No finite TPOT (every output one token): its mean and percentiles are NaN, not an
    error; a makespan of 0 gives NaN throughputs (not a division by zero)."""
    lat = Latencies(ttft=np.array([1.0]), tpot=np.array([NAN]), e2e=np.array([1.0]),
                    output_tokens=np.array([1.0]), makespan_s=0.0)
    s = latency_stats(lat)
    assert all(math.isnan(s[k]) for k in ("tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99"))
    assert s["ttft_mean"] == s["ttft_p99"] == 1.0
    assert s["makespan_s"] == 0.0
    assert math.isnan(s["output_throughput"]) and math.isnan(s["request_throughput"])


# --- curves ------------------------------------------------------------------------------------


def curve(t, **columns) -> pd.DataFrame:
    return pd.DataFrame({"t": t, **columns})


def test_aligned_carries_the_last_sample_and_is_zero_outside_the_curve():
    """Samples at seconds 2 (value 5) and 4 (value 7). Asked at 1..6: before the first
    sample 0; at 2 and 3 the value 5 (3 carries 2's); at 4 the value 7; after the last
    sample (5, 6) 0. An empty curve is 0 everywhere."""
    c = curve([2, 4], running=[5.0, 7.0])
    assert same(aligned(c, np.arange(1, 7), "running"), [0, 5, 5, 7, 0, 0])
    assert same(aligned(curve([], running=[]), np.arange(1, 4), "running"), [0, 0, 0])
    # one sample at the first second asked
    assert same(aligned(curve([1], running=[3.0]), np.arange(1, 3), "running"), [3, 0])


def test_curve_mae_over_every_second_of_either_run():
    """Measured: seconds 1..2 at 4 and 8. Simulated: second 1 at 2, second 4 at 4 (it ran
    longer). Compared over seconds 1..4 (the later of the two ends): measured 4, 8, 0, 0;
    simulated 2, 2, 2, 4 (second 3 carries second 1's sample) -> |diff| 2, 6, 2, 4: MAE 3.5. Swapping the two gives the same;
    two empty curves, or curves ending before second 1, have no error (NaN)."""
    m = curve([1, 2], waiting=[4.0, 8.0])
    s = curve([1, 4], waiting=[2.0, 4.0])
    assert curve_mae(m, s, "waiting") == 3.5
    assert curve_mae(s, m, "waiting") == 3.5
    empty = curve(np.zeros(0, int), waiting=np.zeros(0))
    assert math.isnan(curve_mae(empty, empty, "waiting"))
    # one empty side: compared over the other's seconds (1..2: |4|, |8| -> 6)
    assert curve_mae(m, empty, "waiting") == 6.0
    assert curve_mae(empty, m, "waiting") == 6.0
    zero = curve([0], waiting=[1.0])
    assert math.isnan(curve_mae(zero, zero, "waiting"))
    # the last second is counted: measured ends at 3 with 8 -> seconds 1..3
    assert curve_mae(curve([3], waiting=[8.0]), curve([1], waiting=[0.0]), "waiting") == pytest.approx(8 / 3)


def test_curve_stats_peak_and_mean_kv():
    """KV 25, 75, 50 %: peak 75, mean 50; no sampled second: NaN for both."""
    assert curve_stats(curve([1, 2, 3], kv_pct=[25.0, 75.0, 50.0])) == {"kv_peak_pct": 75.0, "kv_mean_pct": 50.0}
    s = curve_stats(curve([], kv_pct=[]))
    assert list(s) == ["kv_peak_pct", "kv_mean_pct"]
    assert math.isnan(s["kv_peak_pct"]) and math.isnan(s["kv_mean_pct"])


def test_pct_diff():
    """(simulated - measured) / measured in %: 3 vs 2 -> +50, 1 vs 4 -> -75; NaN when the
    measured value is 0 or either value is missing (NaN or infinite)."""
    assert pct_diff(3.0, 2.0) == 50.0
    assert pct_diff(1.0, 4.0) == -75.0
    for sim, meas in ((1.0, 0.0), (NAN, 1.0), (1.0, NAN), (math.inf, 1.0), (1.0, -math.inf)):
        assert math.isnan(pct_diff(sim, meas))


# --- the workload checks -------------------------------------------------------------------------


def folder(inputs, outputs, lines=None) -> SimpleNamespace:
    meas = pd.DataFrame({"input_toks": inputs, "output_toks": outputs,
                         "line": lines if lines is not None else list(range(1, len(inputs) + 1))})
    return SimpleNamespace(requests=meas, workload=Path("w.jsonl"),
                           files={"requests": Path("run/requests.jsonl")})


def sim(prompts, outputs, ids=None, status=None, reason=None) -> pd.DataFrame:
    n = len(prompts)
    return pd.DataFrame({"request_id": ids if ids is not None else list(range(n)), "prompt_tokens": prompts,
                         "output_tokens": outputs, "status": status or ["finished"] * n,
                         "reason": reason or [None] * n})


def test_same_requests_passes_in_arrival_order():
    """The measured lengths (576, 12), (10, 3) against kvsim's rows for ids 1, 0 (the table
    out of order): sorted by id they are the same: no error."""
    _check_same_requests(folder([576, 10], [12, 3]), sim([10, 576], [3, 12], ids=[1, 0]))


def test_same_requests_refuses_another_count():
    with pytest.raises(ValidateError) as e:
        _check_same_requests(folder([5, 6, 7], [1, 1, 1]), sim([5, 6], [1, 1]))
    assert str(e.value) == (f"w.jsonl: 2 requests, but {Path('run/requests.jsonl')} records 3: "
                            "not this run's workload")


def test_same_requests_names_the_first_differing_request_and_its_line():
    """Requests 1 (its output) and 2 (its prompt) differ, in arrival order: the message names
    the first, request 1, at line 7 of the measured file, both pairs as plain ints."""
    f = folder([4, 5, 6], [1, 2, 3], lines=[3, 7, 9])
    with pytest.raises(ValidateError) as e:
        _check_same_requests(f, sim([4, 5, 60], [1, 20, 3]))
    assert str(e.value) == (f"{Path('run/requests.jsonl')}:7: input_toks/output_toks (5, 2) differ from the "
                            "workload's request 1 (5, 20) (in arrival order): not this run's workload")
    # only the prompt differs, at the first row
    with pytest.raises(ValidateError, match=r"^\S+:3: input_toks/output_toks \(4, 1\) differ from the "
                                            r"workload's request 0 \(40, 1\) "):
        _check_same_requests(f, sim([40, 5, 6], [1, 2, 3]))


def test_all_served_passes_when_every_request_finished():
    _check_all_served(folder([1], [1]), sim([1, 2], [1, 1]))


def test_all_served_counts_the_unserved_by_status_and_names_the_first():
    """Of 4 requests, ids 3 and 1 rejected and 2 aborted (rows out of id order): 3 not
    served, counted per status in name order ("1 aborted, 2 rejected"), the example the
    smallest id among them (1) with its reason."""
    s = sim([1, 1, 1, 1], [1, 1, 1, 1], ids=[3, 0, 2, 1], status=["rejected", "finished", "aborted", "rejected"],
            reason=["too long", None, "swap space exhausted", "needs more KV slots than the whole cache (64)"])
    with pytest.raises(ValidateError) as e:
        _check_all_served(folder([1] * 4, [1] * 4), s)
    assert str(e.value) == (
        f"the replay did not serve 3 of the 4 requests the engine served (all of them, "
        f"{Path('run/requests.jsonl')}): 1 aborted, 2 rejected, e.g. request 1: needs more KV slots than the "
        "whole cache (64); the replay's settings are not the run's: give the run's context window with "
        "--max-model-len N or its KV capacity with --num-gpu-blocks N (and check --set overrides)")
