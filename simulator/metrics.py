"""Per-step and per-request records, and the summary (vLLM serving-benchmark names).

Latencies in the summary are milliseconds (``*_ms``), throughputs per second of
simulated time, memory shares percent of KV capacity. Memory classes are
time-weighted: each step's snapshot weighs its duration.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np
import pandas as pd

from simulator.memory_classes import CLASSES, MemorySnapshot
from simulator.sequence import SequenceGroup, Status

STEP_COLUMNS = (
    "replica",
    "start_s",
    "duration_s",
    "iterations",
    "prefill_tokens",
    "decode_seqs",
    "batched_requests",
    "preempted",
    "swap_out_blocks",
    "swap_in_blocks",
    "cow_copies",
    "waiting",
    "swapped",
) + CLASSES


class StepLog:
    """Columnar, append-only record of engine steps (one row per step or macro-step)."""

    def __init__(self) -> None:
        self._cols = {c: array("d") for c in STEP_COLUMNS}

    def append(self, replica: int, start: float, duration: float, iterations: int, prefill_tokens: int,
               decode_seqs: int, batched: int, preempted: int, swap_out: int, swap_in: int, cow: int,
               waiting: int, swapped: int, mem: MemorySnapshot) -> None:
        c = self._cols
        for name, value in zip(STEP_COLUMNS, (replica, start, duration, iterations, prefill_tokens,
                                              decode_seqs, batched, preempted, swap_out, swap_in, cow,
                                              waiting, swapped, *mem.as_tuple())):
            c[name].append(value)

    def __len__(self) -> int:
        return len(self._cols["start_s"])

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame({c: np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0) for c, a in self._cols.items()})
        int_cols = [c for c in STEP_COLUMNS if c not in ("start_s", "duration_s")]
        return df.astype({c: np.int64 for c in int_cols})


REQUEST_COLUMNS = (
    "request_id", "replica", "status", "reason", "arrival_s", "prompt_tokens", "output_tokens", "num_seqs",
    "generated_tokens", "scheduled_s", "first_token_s", "finish_s", "preemptions", "recomputed_tokens",
    "swapped_out_blocks", "swapped_in_blocks",
)


def request_row(g: SequenceGroup, replica: int) -> tuple:
    r = g.request
    return (r.request_id, replica, g.status.value, g.reason, r.arrival_time, r.prompt_tokens,
            r.output_tokens, r.num_seqs, g.generated, g.first_scheduled, g.first_token, g.finish, g.preemptions,
            g.recomputed_tokens, g.swapped_out_blocks, g.swapped_in_blocks)


def request_frame(rows: Iterable[tuple]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(list(rows), columns=list(REQUEST_COLUMNS))
    return df.sort_values("request_id", kind="stable").reset_index(drop=True)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of values repeated ``weights`` times (lower nearest-rank)."""
    if len(values) == 0 or weights.sum() == 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    rank = max(1, int(np.ceil(q * cum[-1])))
    return float(v[np.searchsorted(cum, rank)])


def _stats(name: str, seconds: np.ndarray, out: dict) -> None:
    ms = seconds * 1000.0
    has = len(ms) > 0
    out[f"mean_{name}_ms"] = float(ms.mean()) if has else float("nan")
    out[f"median_{name}_ms"] = float(np.median(ms)) if has else float("nan")
    out[f"p99_{name}_ms"] = float(np.percentile(ms, 99)) if has else float("nan")


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    itl_gaps: dict[float, int],
    capacity_slots: int,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> dict:
    """The run's summary: counts, throughputs, latency statistics, memory breakdown."""
    out: dict = {}
    status = requests["status"]
    done = requests[status == Status.FINISHED.value]
    out["num_requests"] = int(len(requests))
    out["completed"] = int(len(done))
    out["rejected"] = int((status == Status.REJECTED.value).sum())
    out["aborted"] = int((status == Status.ABORTED.value).sum())
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    end = float(done["finish_s"].max()) if len(done) else start
    duration = max(end - start, 1e-12)
    out["duration_s"] = end - start
    out_tokens = (done["output_tokens"] * done["num_seqs"]).sum()
    out["request_throughput"] = len(done) / duration
    out["output_throughput"] = float(out_tokens) / duration
    out["total_token_throughput"] = float(out_tokens + done["prompt_tokens"].sum()) / duration

    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(float)
    e2el = (done["finish_s"] - done["arrival_s"]).to_numpy(float)
    multi = done[done["output_tokens"] > 1]
    tpot = ((multi["finish_s"] - multi["first_token_s"]) / (multi["output_tokens"] - 1)).to_numpy(float)
    _stats("ttft", ttft, out)
    _stats("tpot", tpot, out)
    _stats("e2el", e2el, out)
    gaps = np.fromiter(itl_gaps.keys(), float, len(itl_gaps))
    counts = np.fromiter(itl_gaps.values(), float, len(itl_gaps))
    out["mean_itl_ms"] = float((gaps * counts).sum() / counts.sum() * 1000) if counts.sum() else float("nan")
    out["median_itl_ms"] = weighted_quantile(gaps, counts, 0.5) * 1000
    out["p99_itl_ms"] = weighted_quantile(gaps, counts, 0.99) * 1000

    good = np.ones(len(done), bool)
    if slo_ttft_ms is not None:
        good &= ttft * 1000 <= slo_ttft_ms
    if slo_tpot_ms is not None:
        tpot_all = np.where(done["output_tokens"] > 1,
                            (done["finish_s"] - done["first_token_s"]) / (done["output_tokens"] - 1).clip(lower=1), 0.0)
        good &= tpot_all * 1000 <= slo_tpot_ms
    out["request_goodput"] = float(good.sum()) / duration
    out["normalized_latency_s_per_token"] = float((e2el / done["output_tokens"].to_numpy(float)).mean()) if len(done) else float("nan")

    w = steps["duration_s"].to_numpy(float)
    total_w = w.sum()
    out["num_steps"] = int(steps["iterations"].sum()) if len(steps) else 0
    out["num_preemptions"] = int(requests["preemptions"].sum())
    out["busy_time_s"] = float(total_w)
    if total_w > 0:
        out["mean_batched_requests"] = float((steps["batched_requests"] * w).sum() / total_w)
        shares = {c: float((steps[c] * w).sum() / total_w / capacity_slots * 100) for c in CLASSES}
    else:
        out["mean_batched_requests"] = 0.0
        shares = {c: 0.0 for c in CLASSES}
    out["kv_cache_usage_perc"] = shares["token_states"] + shares["reserved"] + shares["internal_frag"]
    for c in CLASSES:
        out[f"mem_{c}_perc"] = shares[c]
    out["recomputed_tokens"] = int(requests["recomputed_tokens"].sum())
    out["swapped_out_blocks"] = int(requests["swapped_out_blocks"].sum())
    out["swapped_in_blocks"] = int(requests["swapped_in_blocks"].sum())
    return out
