"""The summary's request-level numbers from a hand-made request table (simulator/engine/metrics.py).

Three requests, times in seconds; the trace starts at 10 s (not 0, so a duration that
forgot the start would show):
  r0: arrives 10, first token 11, ends 14; 4 tokens, prompt 8.
  r1: arrives 12, first token 12.5, ends 13; 2 samples of 2 tokens (4 output tokens), prompt 2.
  r2: arrives 13, rejected (never scheduled).
Duration 14 - 10 = 4 s. TTFT 1 and 0.5; E2E 4 and 1; TPOT (14-11)/3 = 1 and (13-12.5)/1 = 0.5.
numpy's p99 interpolates linearly: between 0.5 and 1 it is 0.5 + 0.99 x 0.5 = 0.995.
"""

import math

import pandas as pd
import pytest

from kvsim.simulator.engine.metrics import REQUEST_COLUMNS, summarize
from kvsim.simulator.engine.step_log import StepTotals
from kvsim.simulator.latency_histogram import LatencyHistogram

NAN = float("nan")
ROWS = [  # in REQUEST_COLUMNS order
    (0, 0, "finished", None, 10.0, 8, 4, 1, 4, 4, 0, 10.0, 11.0, 14.0, 0, 0, 0, 0, 0, 0.0),
    (1, 0, "finished", None, 12.0, 2, 2, 2, 2, 4, 0, 12.0, 12.5, 13.0, 0, 0, 0, 0, 0, 0.0),
    (2, 0, "rejected", "too long", 13.0, 9000, 2, 1, 0, 2, 0, NAN, NAN, 13.0, 0, 0, 0, 0, 0, 0.0),
]


def summary(rows, **slo):
    itl = LatencyHistogram()
    itl.add(0.5, 2)
    itl.add(1.0)
    return summarize(pd.DataFrame(rows, columns=REQUEST_COLUMNS), StepTotals(), itl, 100, **slo)


def test_counts_throughputs_and_latencies():
    s = summary(ROWS)
    assert (s["num_requests"], s["completed"], s["rejected"], s["aborted"]) == (3, 2, 1, 0)
    assert s["duration_s"] == 4.0
    assert s["request_throughput"] == 2 / 4
    assert s["output_throughput"] == (4 + 4) / 4
    assert s["total_token_throughput"] == (4 + 4 + 8 + 2) / 4
    for name, (a, b) in {"ttft": (1.0, 0.5), "e2el": (4.0, 1.0), "tpot": (1.0, 0.5)}.items():
        lo, hi = min(a, b), max(a, b)
        assert s[f"mean_{name}_ms"] == pytest.approx((a + b) / 2 * 1000), name
        assert s[f"median_{name}_ms"] == pytest.approx((a + b) / 2 * 1000), name
        assert s[f"p99_{name}_ms"] == pytest.approx((lo + 0.99 * (hi - lo)) * 1000), name
    assert s["mean_itl_ms"] == pytest.approx(2000 / 3)
    assert s["normalized_latency_s_per_token"] == pytest.approx((4 / 4 + 1 / 2) / 2)
    assert s["request_goodput"] == 2 / 4  # no SLO: every completed request counts


@pytest.mark.parametrize("slo", [{"slo_ttft_ms": 600}, {"slo_tpot_ms": 600}])
def test_goodput_counts_requests_within_the_slo(slo):
    assert summary(ROWS, **slo)["request_goodput"] == 1 / 4  # only r1 (0.5 s) is within 600 ms


def test_no_completed_request_has_no_latency():
    s = summary(ROWS[2:])
    assert (s["completed"], s["duration_s"], s["request_throughput"]) == (0, 0.0, 0.0)
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_e2el_ms",
                "normalized_latency_s_per_token"):
        assert math.isnan(s[key]), key


def test_an_empty_run_summarizes_to_zeros():
    s = summary([])
    assert (s["num_requests"], s["completed"], s["duration_s"], s["output_throughput"]) == (0, 0, 0.0, 0.0)
