"""A request the context window (or the whole KV cache) turns away is counted as rejected, with
its reason, and never as completed: it adds nothing to a throughput or a latency."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.simulator.config import validate_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.traces import Request

PROMPTS = [100, 900, 120, 1500, 80]  # context window 1024: requests 1 and 3 cannot fit


@pytest.mark.parametrize("policy", ["vllm-v0", "vllm-v1"])
def test_rejected_requests_are_reported_and_left_out_of_every_metric(policy):
    cfg = validate_config({
        "model": {"name": "llama-2-7b", "context_len_tokens": 1024},
        "hardware": {"gpu": "a100-80gb"},
        "scheduler": {"policy": policy, "max_num_batched_tokens": 2048},
        "workload": {"arrivals": {"kind": "poisson", "rate": 1},
                     "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1}, "num_requests": 1},
    })
    requests = [Request(i, 0.5 * i, p, 200) for i, p in enumerate(PROMPTS)]
    result = run_experiment(cfg, requests=requests)
    s, table = result.summary, result.requests
    assert (s["completed"], s["rejected"], s["num_requests"]) == (3, 2, 5)
    rejected = table[table["status"] == "rejected"]
    assert rejected["request_id"].tolist() == [1, 3]
    assert all("exceeds the context window" in r for r in rejected["reason"])
    assert sum(s["reject_reasons"].values()) == 2
    assert all("context window" in k for k in s["reject_reasons"])
    done = table[table["status"] == "finished"]
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy()
    assert s["mean_e2el_ms"] == pytest.approx(1000 * e2e.mean())  # over the 3 that ran, not 5
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy()
    assert s["mean_ttft_ms"] == pytest.approx(1000 * ttft.mean())
    duration = done["finish_s"].max() - table["arrival_s"].min()
    assert s["request_throughput"] == pytest.approx(3 / duration)
    assert s["output_throughput"] == pytest.approx(3 * 200 / duration)
    assert np.isnan(rejected["first_token_s"]).all()
