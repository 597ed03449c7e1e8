"""``kvsim validate``: reading a run folder, the report's numbers worked out by hand, bad folders,
and the shipped real vLLM run (with the targets that hold today, so a regression fails)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.validate import (
    ValidateError,
    aligned,
    curve_mae,
    latency_stats,
    measured_latencies,
    policy_available,
    read_run_folder,
    simulated_curves,
    simulated_latencies,
    validate_run,
)
from kvsim.simulator.app.validate_report import readme_snippet, report_dict, write_validation
from kvsim.simulator.config import validate_config

REAL = Path(__file__).resolve().parents[3] / "gpu_validation" / "runs" / "vllm-0.19-rtx4090-llama-3.1-8b"

# Four requests worked out by hand (times in s; the engine's clock starts at 100 s).
#            queued  first   last    output   -> TTFT  E2E   TPOT
MEASURED = [(100.0, 100.5, 101.5, 3),      # 0.5   1.5   0.5
            (101.0, 102.0, 104.0, 5),      # 1.0   3.0   0.5
            (102.0, 104.0, 105.0, 1),      # 2.0   3.0   - (one token)
            (103.0, 103.5, 105.5, 6)]      # 0.5   2.5   0.4
PROMPTS = [20, 33, 16, 40]


def make_folder(root: Path, *, blocks: int | None = 101, meta_extra: dict | None = None, nested: bool = True,
                model: str = "meta-llama/Llama-2-7b-hf", device: str = "NVIDIA A100-SXM4-80GB") -> Path:
    """A run folder in the shipped layout (data in vllm/, workload in workload/)."""
    data = root / "vllm" if nested else root
    data.mkdir(parents=True, exist_ok=True)
    (root / "workload").mkdir(exist_ok=True)
    meta = {
        "model": model,
        "engine_kwargs": {"tensor_parallel_size": 1, "max_num_seqs": 8, "max_num_batched_tokens": 4096,
                          "dtype": "bfloat16"},
        "dataset_path": "workloads/tiny.jsonl",
        "kv_cache": {"num_gpu_blocks": blocks, "block_size": 16, "enable_prefix_caching": True,
                     "gpu_memory_utilization": 0.9},
        "hardware": {"device_name": device},
        "resolved_config": {"model_config": {"max_model_len": 1024},
                            "scheduler_config": {"enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
                                                 "max_num_partial_prefills": 1, "scheduler_reserve_full_isl": True}},
        **(meta_extra or {}),
    }
    (data / "meta.json").write_text(json.dumps(meta))
    lines = []
    for i, ((q, f, last, out), prompt) in enumerate(zip(MEASURED, PROMPTS)):
        lines.append(json.dumps({"request_id": f"bench-{i}", "input_toks": prompt, "output_toks": out,
                                 "arrival_time": 1.7e9 + 7 * i, "queued_ts": q, "scheduled_ts": q + 0.01,
                                 "first_token_ts": f, "last_token_ts": last}))
    (data / "requests.jsonl").write_text("\n".join(reversed(lines)) + "\n")  # any order: sorted by queued_ts
    (data / "timeseries.csv").write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                                         "1.0,0,0,1,0,10.0\n2.0,0,0,2,1,30.0\n4.0,0,0,1,0,50.0\n")
    ids = [[(17 * i + j) % 1000 for j in range(p)] for i, p in enumerate(PROMPTS)]
    ids[1][:16] = ids[0][:16]  # request 1 shares request 0's first block
    (root / "workload" / "tiny.jsonl").write_text("".join(
        json.dumps({"input_toks": p, "output_toks": m[3], "arrival_time_ns": int((m[0] - 100.0) * 1e9),
                    "input_tok_ids": t}) + "\n" for p, m, t in zip(PROMPTS, MEASURED, ids)))
    return root


def test_measured_numbers_worked_out_by_hand(tmp_path):
    folder = read_run_folder(make_folder(tmp_path / "run"))
    lat = measured_latencies(folder.requests)
    np.testing.assert_allclose(lat.ttft, [0.5, 1.0, 2.0, 0.5])  # from queued_ts, not the wall clock
    np.testing.assert_allclose(lat.e2e, [1.5, 3.0, 3.0, 2.5])
    np.testing.assert_allclose(lat.tpot, [0.5, 0.5, np.nan, 0.4])
    s = latency_stats(lat)
    assert s["ttft_mean"] == pytest.approx(1.0)
    # sorted TTFT 0.5, 0.5, 1.0, 2.0; linear interpolation at (n - 1) p / 100
    assert s["ttft_p50"] == pytest.approx(0.75)
    assert s["ttft_p90"] == pytest.approx(1.0 + 0.7 * 1.0)
    assert s["ttft_p99"] == pytest.approx(1.0 + 0.97 * 1.0)
    assert s["tpot_mean"] == pytest.approx(1000 * 1.4 / 3)  # ms, over the 3 requests with > 1 token
    assert s["tpot_p50"] == pytest.approx(500.0)
    assert s["e2e_mean"] == pytest.approx(2.5) and s["e2e_p50"] == pytest.approx(2.75)
    assert s["makespan_s"] == pytest.approx(5.5)  # last token 105.5 - first queued 100.0
    assert s["output_throughput"] == pytest.approx(15 / 5.5)
    assert s["request_throughput"] == pytest.approx(4 / 5.5)


def test_simulated_latencies_start_at_the_first_arrival():
    table = pd.DataFrame({"request_id": [1, 0], "arrival_s": [1.0, 0.0], "first_token_s": [3.0, 0.5],
                          "finish_s": [4.0, 1.5], "output_tokens": [1, 3]})
    lat = simulated_latencies(table)
    np.testing.assert_allclose(lat.ttft, [0.5, 2.0])
    np.testing.assert_allclose(lat.e2e, [1.5, 3.0])
    np.testing.assert_allclose(lat.tpot, [0.5, np.nan])
    assert lat.makespan_s == pytest.approx(4.0)


def _steps(start, duration, waiting, free, swapped=None, iterations=None) -> pd.DataFrame:
    n = len(start)
    return pd.DataFrame({"start_s": start, "duration_s": duration, "waiting": waiting,
                         "swapped": swapped or [0] * n, "iterations": iterations or [1] * n,
                         "external_frag": [0.0] * n, "stranded_free": [0.0] * n, "idle_free": free})


def test_simulated_curves_sample_the_last_step_of_each_second():
    steps = _steps([0.0, 0.4, 0.9, 2.5], [0.4, 0.5, 0.3, 0.2], [2, 1, 0, 0], [90.0, 80.0, 60.0, 75.0])
    requests = pd.DataFrame({"arrival_s": [0.0, 0.3, 0.95, 2.0], "finish_s": [1.0, 2.6, np.nan, 3.0]})
    c = simulated_curves(steps, requests, capacity_slots=100)
    # ends 0.4, 0.9 | 1.2 | 2.7 -> seconds 1, 2, 3; the last step of second 1 is the one starting at 0.4
    assert c["t"].tolist() == [1, 2, 3]
    # running = arrived - ended - waiting at the step's start (request 2 was rejected at 0.95)
    assert c["running"].tolist() == [2 - 0 - 1, 2 - 0 - 0, 4 - 2 - 0]
    assert c["waiting"].tolist() == [1, 0, 0]
    assert c["kv_pct"].tolist() == pytest.approx([20.0, 40.0, 25.0])
    with pytest.raises(ValueError, match="macro_steps"):
        simulated_curves(_steps([0.0], [1.0], [0], [1.0], iterations=[5]), requests, 100)


def test_curve_error_carries_skipped_seconds_and_reads_zero_after_the_end():
    measured = pd.DataFrame({"t": [1, 2, 4], "kv_pct": [10.0, 30.0, 50.0]})
    simulated = pd.DataFrame({"t": [1, 2, 3], "kv_pct": [20.0, 30.0, 40.0]})
    seconds = np.arange(1, 5)
    assert aligned(measured, seconds, "kv_pct").tolist() == [10, 30, 30, 50]
    assert aligned(simulated, seconds, "kv_pct").tolist() == [20, 30, 40, 0]
    assert curve_mae(measured, simulated, "kv_pct") == pytest.approx((10 + 0 + 10 + 50) / 4)


def test_a_synthetic_folder_end_to_end(tmp_path):
    v = validate_run(make_folder(tmp_path / "tiny-run"), cost_model="roofline")
    assert v.folder.name == "tiny-run"
    assert v.measured["kv_peak_pct"] == 50.0 and v.measured["kv_mean_pct"] == pytest.approx(30.0)
    assert math.isnan(v.measured["preemptions"]) and not v.preemptions_recorded
    policies = [r.policy for r in v.replays]
    assert "vllm-v0" in policies and ("vllm-v1" in policies) == policy_available("vllm-v1")
    for r in v.replays:
        assert r.cost_model == "roofline"  # no profiled reference without a profile
        assert r.summary["kv_num_gpu_blocks"] == 100  # 101 recorded, minus vLLM's null block
        assert r.summary["completed"] == 4
    assert any("minus 1" in n and "null block" in n for n in v.notes)
    assert any("Measured preemptions: not recorded" in n for n in v.notes)
    out = write_validation(v, tmp_path / "out", plot=False)
    report = json.loads((out / "report.json").read_text())
    assert report["measured"]["makespan_s"] == pytest.approx(5.5)
    assert report["measured"]["preemptions"] is None
    # scheduled 10 ms after being queued: all four went straight in; their measured TTFT mean is 1.0 s
    assert report["unqueued_requests"] == 4 and report["measured_unqueued_ttft_mean_s"] == pytest.approx(1.0)
    assert "Requests that did not queue" in (out / "report.md").read_text()
    assert (out / "report.md").read_text().count("not recorded") >= 1
    assert (out / ".kvsim-run").is_file()
    # the same folder gives the same report, byte for byte
    again = write_validation(validate_run(tmp_path / "tiny-run", cost_model="roofline"), tmp_path / "out2",
                             plot=False)
    assert (again / "report.json").read_bytes() == (out / "report.json").read_bytes()
    assert (again / "report.md").read_bytes() == (out / "report.md").read_bytes()


def test_without_a_recorded_block_count_the_capacity_is_computed_and_said(tmp_path):
    v = validate_run(make_folder(tmp_path / "run", blocks=None), cost_model="roofline")
    expected = validate_config({"model": {"name": "llama-2-7b", "context_len_tokens": 1024},
                                "hardware": {"gpu": "a100-80gb", "gpu_memory_utilization": 0.9},
                                # vLLM sizes its activation peak at the run's own batch limits
                                "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
                                "workload": {"arrivals": {"kind": "poisson", "rate": 1},
                                             "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1},
                                             "num_requests": 1}}).kv_slots // 16
    assert all(r.summary["kv_num_gpu_blocks"] == expected for r in v.replays)
    assert any("does not record num_gpu_blocks" in n and "computed" in n for n in v.notes)
    assert "does not record num_gpu_blocks" in readme_snippet(v)


def test_a_model_outside_the_catalogue_is_read_from_the_resolved_config(tmp_path):
    hf = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
          "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096, "hidden_act": "silu"}
    root = make_folder(tmp_path / "run", model="acme/Tiny-LM")
    meta = json.loads((root / "vllm" / "meta.json").read_text())
    meta["resolved_config"]["model_config"]["hf_config"] = hf
    (root / "vllm" / "meta.json").write_text(json.dumps(meta))
    v = validate_run(root, cost_model="roofline")
    spec = v.replays[0].config.model.spec
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads) == (4, 512, 2)
    assert any("not in kvsim's catalogue" in n for n in v.notes)
    assert report_dict(v)["model"] == "acme/Tiny-LM"


def _error(capsys, *argv) -> str:
    assert main(["validate", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


def test_bad_folders_are_one_line_errors(tmp_path, capsys):
    assert "not a folder" in _error(capsys, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert "no meta.json" in _error(capsys, tmp_path / "empty")
    root = make_folder(tmp_path / "a")
    (root / "vllm" / "meta.json").write_text("{oops")
    assert f"{root / 'vllm' / 'meta.json'}: not valid JSON" in _error(capsys, root)
    root = make_folder(tmp_path / "b")
    with open(root / "vllm" / "requests.jsonl", "a") as f:
        f.write('{"input_toks": 3}\n')
    assert f"{root / 'vllm' / 'requests.jsonl'}:5: missing key 'output_toks'" in _error(capsys, root)
    root = make_folder(tmp_path / "c")
    (root / "vllm" / "timeseries.csv").write_text("t,running\n1,2\n")
    assert "missing column 'waiting', 'kv_cache_pct'" in _error(capsys, root)
    root = make_folder(tmp_path / "d")
    (root / "workload" / "tiny.jsonl").unlink()
    assert "workload file not found" in _error(capsys, root)
    root = make_folder(tmp_path / "e", device="Tesla T4")
    assert "'Tesla T4' is no GPU in kvsim's catalogue; give --gpu" in _error(capsys, root)
    root = make_folder(tmp_path / "f", model="acme/Unknown-7B")
    assert "'acme/Unknown-7B' is not in kvsim's catalogue" in _error(capsys, root)
    root = make_folder(tmp_path / "g")
    assert "no shipped operator profile" in _error(capsys, root)  # profiled is the default
    root = make_folder(tmp_path / "h", nested=False)
    lines = (root / "requests.jsonl").read_text().splitlines()
    (root / "requests.jsonl").write_text("\n".join(lines[1:]) + "\n")
    assert "3 records 3" not in (err := _error(capsys, root, "--cost-model", "roofline"))
    assert "not this run's workload" in err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("not kvsim's")
    assert "not written by kvsim" in _error(capsys, make_folder(tmp_path / "i"), "--cost-model", "roofline",
                                            "--out", tmp_path / "out")
    assert (tmp_path / "out" / "mine.txt").is_file()


def test_the_real_vllm_run(tmp_path, capsys, monkeypatch):
    """The shipped measurement: the report exists with every policy kvsim has, its numbers are
    finite, the accuracy targets that hold today still hold, and the README's section is the
    command's snippet."""
    out = tmp_path / "report"
    monkeypatch.chdir(REAL.parents[2])
    assert main(["validate", str(REAL.relative_to(REAL.parents[2])), "--out", str(out), "--readme-snippet"]) == 0
    snippet = capsys.readouterr().out
    readme = (REAL.parents[2] / "README.md").read_text()
    section = "## How close to a real engine\n" + readme.split("\n## How close to a real engine\n")[1].split("\n## ")[0]
    assert section.strip() == snippet.strip(), "regenerate the README section: kvsim validate RUN --readme-snippet"
    for name in ("report.md", "report.json", "readme_snippet.md", "cdf_latency.png", "curves.png",
                 "scatter_e2e.png"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert report["recorded_num_gpu_blocks"] == 2588 and report["simulated_num_gpu_blocks"] == 2587
    replays = {(r["policy"], r["cost_model"]): r for r in report["replays"]}
    expected = {p for p in ("vllm-v1", "vllm-v0") if policy_available(p)}
    assert {p for p, _ in replays} == expected and "vllm-v0" in expected
    assert {c for _, c in replays} == {"profiled", "roofline"}
    for r in replays.values():
        for key, value in r["simulated"].items():
            assert value is not None and math.isfinite(value), (r["policy"], key)
    # The accuracy targets with the profiled model hold for every policy (today: vllm-v1 within 0.7%
    # and a KV-curve error of 1.4 points; vllm-v0 within 1.7% and 2.5 points).
    for policy in expected:
        r = replays[(policy, "profiled")]
        d = r["difference_pct"]
        assert abs(d["makespan_s"]) <= 3, policy
        for key in ("ttft_mean", "ttft_p50", "tpot_mean", "e2e_mean"):
            assert abs(d[key]) <= 5, (policy, key)
        for key in ("ttft_p99", "tpot_p99", "e2e_p99"):
            assert abs(d[key]) <= 10, (policy, key)
        assert r["kv_usage_mae_pp"] <= 5, policy
        assert all(t["holds"] for t in report["targets"] if t["policy"] == policy)
    if "vllm-v1" in expected:  # v1's rules follow the engine's queues more closely than v0's
        assert replays[("vllm-v1", "profiled")]["waiting_mae"] < replays[("vllm-v0", "profiled")]["waiting_mae"]
    # the roofline's default constants are fitted to this GPU's operator profile
    # (roofline_fit; not to this run): close here, but still further off than the profile itself
    for policy in expected:
        roof, prof = replays[(policy, "roofline")], replays[(policy, "profiled")]
        assert abs(roof["difference_pct"]["makespan_s"]) > abs(prof["difference_pct"]["makespan_s"]), policy
        assert roof["kv_usage_mae_pp"] > prof["kv_usage_mae_pp"], policy
    assert (out / "readme_snippet.md").read_text() == snippet


def test_validate_error_is_a_plain_exception():
    assert issubclass(ValidateError, Exception) and str(ValidateError("x: y")) == "x: y"


def test_running_counts_derived_from_the_tables_equal_the_schedulers(monkeypatch):
    """The step table records waiting and swapped requests; running ones are derived (arrived -
    ended - waiting - swapped at each step's start). They must equal the scheduler's own list."""
    from kvsim.simulator.app.validate import plan_replay, replay_config
    from kvsim.simulator.engine import simulation as engine
    from kvsim.simulator.engine.runner import run_experiment

    seen = []
    state = engine.Simulation._state

    def spy(replica, *args):
        seen.append(len(replica.scheduler.running))
        return state(replica, *args)

    monkeypatch.setattr(engine.Simulation, "_state", staticmethod(spy))
    folder = read_run_folder(REAL)
    for policy in [p for p in ("vllm-v0", "vllm-v1") if policy_available(p)]:
        seen.clear()
        cfg = replay_config(folder, plan_replay(folder, cost_model="roofline"), policy)
        result = run_experiment(cfg)
        steps = result.steps
        curves = simulated_curves(steps, result.requests, result.summary["kv_capacity_slots"])
        start = steps["start_s"].to_numpy()
        req = result.requests
        arrived = np.searchsorted(np.sort(req["arrival_s"].to_numpy()), start, "right")
        ended = np.searchsorted(np.sort(req["finish_s"].to_numpy()), start, "right")
        derived = arrived - ended - steps["waiting"].to_numpy() - steps["swapped"].to_numpy()
        assert len(seen) == len(steps) and (derived == np.array(seen)).all(), policy
        assert max(seen) > 20  # the KV cache binds: tens of requests run at once
        assert set(curves["running"].astype(int)) <= set(seen)  # the curve samples these counts


def test_other_runs_tp_profile_model_and_gpu_options_and_layouts(tmp_path):
    root = make_folder(tmp_path / "tp-run", meta_extra={"engine_kwargs": {
        "tensor_parallel_size": 2, "max_num_seqs": 8, "max_num_batched_tokens": 4096}})
    v = validate_run(root / "vllm", cost_model="roofline")  # the data folder itself, workload beside it
    assert v.folder.name == "tp-run"
    assert all(r.config.hardware.tensor_parallel == 2 for r in v.replays)
    v = validate_run(root, profile="rtx4090-llama-3.1-8b", gpu="rtx4090", model="llama-3.1-8b")
    main_replays = v.main_replays()
    assert {r.config.cost_model.profile for r in main_replays} == {"rtx4090-llama-3.1-8b"}
    assert {r.config.model.name for r in v.replays} == {"llama-3.1-8b"}
    assert {r.config.hardware.gpu for r in v.replays} == {"rtx4090"}
    assert {r.cost_model for r in v.reference_replays()} == {"roofline"}
    moved = tmp_path / "elsewhere.jsonl"
    (root / "workload" / "tiny.jsonl").rename(moved)
    with pytest.raises(ValidateError, match="workload file not found"):
        validate_run(root, cost_model="roofline")
    assert validate_run(root, cost_model="roofline", workload=moved).folder.workload == moved
