"""``kvsim validate`` on run folders that record less than the shipped one: settings from flags,
the operator profile or vLLM's defaults (all missing ones named at once, every assumed one
reported), ``max_model_len: null``, a replay that fails or rejects requests, metrics the run did
not record, and data-parallel runs. Every fixture is the shipped run folder, copied and cut."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.simulator.app import validate as validate_module
from kvsim.simulator.app.cli import main
from kvsim.simulator.app.validate import (
    ValidateError,
    match_workload,
    read_run_folder,
    simulated_curves,
    simulated_latencies,
    validate_run,
)
from kvsim.simulator.app.validate_report import markdown, readme_snippet, report_dict, targets

REAL = Path(__file__).resolve().parents[3] / "gpu_validation" / "runs" / "vllm-0.19-rtx4090-llama-3.1-8b"


def copy_run(tmp_path: Path, name: str = "run", strip: tuple[str, ...] = (), **engine_kwargs) -> Path:
    """The shipped run folder in ``tmp_path``, without meta.json's sections ``strip`` and with
    ``engine_kwargs`` set (None: recorded as null)."""
    root = tmp_path / name
    shutil.copytree(REAL, root)
    meta_path = root / "vllm" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for key in strip:
        meta.pop(key)
    meta["engine_kwargs"].update(engine_kwargs)
    meta_path.write_text(json.dumps(meta))
    return root


def rewrite_requests(root: Path, change) -> None:
    path = root / "vllm" / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


BARE = ("hardware", "kv_cache", "resolved_config")  # what the RTX PRO 6000 run folders lack


def test_every_missing_setting_is_named_in_one_error(tmp_path, capsys):
    root = copy_run(tmp_path, strip=BARE, max_num_seqs=None)
    with pytest.raises(ValidateError) as e:
        validate_run(root)
    msg = str(e.value)
    for what in ("hardware.device_name (give --gpu NAME", "kv_cache.block_size (give --block-size N)",
                 "max_num_seqs (give --max-num-seqs N)"):
        assert what in msg
    # the command says it on one line too
    assert main(["validate", str(root), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu" in err and "--block-size" in err and "--max-num-seqs" in err


def test_a_bare_folder_validates_from_flags_the_profile_and_defaults(tmp_path, capsys):
    """meta.json without hardware, kv_cache or resolved_config and max_model_len null: the GPU
    from --gpu, the block size from the profile's measurement, the context window from the
    model (capped at the KV cache, as vLLM would have to), the rest vLLM's defaults; both
    policies replay, and the report lists each assumed value with its source."""
    root = copy_run(tmp_path, strip=BARE, max_model_len=None)
    out = tmp_path / "out"
    assert main(["validate", str(root), "--gpu", "rtx4090", "--out", str(out), "--no-plot"]) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert {r["policy"] for r in report["replays"]} == {"vllm-v1", "vllm-v0"}  # max_model_len null: v0 runs too
    assert report["failed_replays"] == []
    assumed = {a["setting"]: (a["value"], a["source"]) for a in report["assumed"]}
    assert assumed["hardware.device_name"] == ("rtx4090", "--gpu")
    assert assumed["kv_cache.block_size"][0] == "16" and "rtx4090-llama-3.1-8b" in assumed["kv_cache.block_size"][1]
    assert assumed["enable_prefix_caching"][0] == "true" and "vLLM's default" in assumed["enable_prefix_caching"][1]
    assert assumed["gpu_memory_utilization"] == ("0.9", "vLLM's default")
    blocks = report["simulated_num_gpu_blocks"]
    assert int(assumed["max_model_len"][0]) == blocks * 16 and "131,072" in assumed["max_model_len"][1]
    text = (out / "report.md").read_text()
    assert "## Settings the run folder does not record" in text and "| kv_cache.block_size | 16 |" in text
    # a flag wins over meta.json, and says so
    v = validate_run(copy_run(tmp_path, "full"), cost_model="roofline", given={"max_num_seqs": 64},
                     policies=("vllm-v1",))
    assert v.replays[0].config.scheduler.max_num_seqs == 64
    assert ("max_num_seqs", "64", "--max-num-seqs") in v.plan.assumed


def test_the_gpu_and_block_size_can_come_from_the_profile(tmp_path):
    v = validate_run(copy_run(tmp_path, strip=BARE), profile="rtx4090-llama-3.1-8b", policies=("vllm-v1",))
    assumed = {k: (val, src) for k, val, src in v.plan.assumed}
    assert v.plan.gpu == "rtx4090"
    assert assumed["hardware.device_name"] == ("NVIDIA GeForce RTX 4090 (rtx4090)",
                                               "operator profile rtx4090-llama-3.1-8b (provenance.gpu)")
    assert assumed["kv_cache.block_size"][0] == "16"
    assert v.replays[0].config.hardware.gpu == "rtx4090" and v.replays[0].config.allocator.block_size == 16


def test_the_shipped_run_assumes_nothing_and_stays_within_its_targets():
    v = validate_run(REAL, policies=("vllm-v1",))
    assert v.plan.assumed == [] and "Settings the run folder" not in markdown(v)
    d = {k: 100 * (v.replays[0].stats[k] / v.measured[k] - 1) for k in ("makespan_s", "ttft_mean", "e2e_mean")}
    assert abs(d["makespan_s"]) <= 3 and abs(d["ttft_mean"]) <= 5 and abs(d["e2e_mean"]) <= 5


def test_one_failing_replay_does_not_stop_the_others(tmp_path, monkeypatch):
    run_replay = validate_module.run_replay

    def v0_fails(folder, plan, policy, *args, **kwargs):
        if policy == "vllm-v0":
            raise ValidateError("replay of run (vllm-v0): something v0 cannot do")
        return run_replay(folder, plan, policy, *args, **kwargs)

    monkeypatch.setattr(validate_module, "run_replay", v0_fails)
    v = validate_run(copy_run(tmp_path), cost_model="roofline")
    assert [r.policy for r in v.replays] == ["vllm-v1"]
    assert v.failures == [("vllm-v0", "roofline", "replay of run (vllm-v0): something v0 cannot do")]
    report = report_dict(v)
    assert report["failed_replays"][0]["policy"] == "vllm-v0"
    assert "vllm-v0: replay failed (roofline): replay of run (vllm-v0): something v0 cannot do" in markdown(v)
    monkeypatch.setattr(validate_module, "run_replay", lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValidateError, match="every replay failed: vllm-v1 .roofline. and vllm-v0 .roofline.: boom"):
        validate_run(copy_run(tmp_path, "again"), cost_model="roofline")


def test_a_replay_that_rejects_requests_the_engine_served_is_refused(tmp_path, capsys):
    """A context window shorter than the run's rejects 40 of its 300 requests: never a report
    that counts them as completed with an E2E of 0."""
    assert main(["validate", str(REAL), "--cost-model", "roofline", "--max-model-len", "2048", "--no-plot",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "did not serve 40 of the 300 requests the engine served" in err and "40 rejected" in err
    assert "exceeds the context window" in err and "--max-model-len" in err
    assert not (tmp_path / "out").exists()


def test_rejected_requests_have_no_latencies():
    table = pd.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0], "first_token_s": [0.5, np.nan, 2.5],
                          "finish_s": [1.5, 1.0, 3.0], "output_tokens": [3, 5, 2],
                          "status": ["finished", "rejected", "finished"]})
    lat = simulated_latencies(table)
    assert math.isnan(lat.e2e[1]) and math.isnan(lat.ttft[1]) and math.isnan(lat.tpot[1])
    np.testing.assert_allclose(lat.e2e[[0, 2]], [1.5, 1.0])


def test_a_metric_the_run_did_not_record_is_not_a_miss(tmp_path):
    root = copy_run(tmp_path)
    ts = pd.read_csv(root / "vllm" / "timeseries.csv")
    ts["kv_cache_pct"] = 0.0
    ts.to_csv(root / "vllm" / "timeseries.csv", index=False)
    v = validate_run(root, cost_model="roofline", policies=("vllm-v1",))
    assert math.isnan(v.measured["kv_peak_pct"]) and math.isnan(v.measured["kv_mean_pct"])
    assert "kv_usage_mae_pp" in v.not_recorded and math.isnan(v.replays[0].kv_mae_pp)
    kv = [t for t in targets(v) if t["metric"] == "kv_usage_mae_pp"]
    assert kv and all(t["holds"] is None and "0 in every row" in t["not_recorded"] for t in kv)
    text = markdown(v)
    assert "KV usage MAE n/a points (target <= 5): not recorded" in text
    assert "| KV usage peak (%) | not recorded |" in text
    assert "kv_usage_mae_pp" not in readme_snippet(v).split("met:")[1].split("\n")[0]  # neither met nor missed
    json.dumps(report_dict(v), allow_nan=False)  # the report stays valid JSON


def _data_parallel_run(tmp_path: Path, ids: str) -> Path:
    """The shipped run as if served by two engines: data_parallel_size 2, and near-simultaneous
    arrivals queued out of order (each engine stamps its own queued_ts)."""
    root = copy_run(tmp_path, f"dp-{ids}", strip=("kv_cache",), data_parallel_size=2)
    meta = json.loads((root / "vllm" / "meta.json").read_text())
    meta["resolved_config"]["parallel_config"]["data_parallel_size"] = 2
    (root / "vllm" / "meta.json").write_text(json.dumps(meta))

    def swap_ties(rows):
        swapped = 0
        for a, b in zip(rows, rows[1:]):
            if 0 < b["queued_ts"] - a["queued_ts"] < 0.05 and a["input_toks"] != b["input_toks"]:
                a["queued_ts"], b["queued_ts"] = b["queued_ts"], a["queued_ts"]
                swapped += 1
        assert swapped >= 5
        if ids == "opaque":
            for i, r in enumerate(rows):
                r["request_id"] = f"cmpl-{(i * 7919) % 1000:03d}x"

    rewrite_requests(root, swap_ties)
    return root


@pytest.mark.parametrize("ids", ["numbered", "opaque"])
def test_a_data_parallel_run_validates(tmp_path, ids):
    root = _data_parallel_run(tmp_path, ids)
    v = validate_run(root, cost_model="roofline", policies=("vllm-v1",))
    cfg = v.replays[0].config
    assert cfg.hardware.num_replicas == 2 and cfg.scheduler.router == "least_outstanding_tokens"
    assert any("Data parallel: 2 engines" in n for n in v.notes)
    # measured requests are in the workload's order again
    lengths = v.folder.requests[["input_toks", "output_toks"]].to_numpy(int)
    expected = read_run_folder(REAL).requests[["input_toks", "output_toks"]].to_numpy(int)
    assert (lengths == expected).all()


def test_matching_the_workload_tolerates_only_near_ties(tmp_path):
    root = _data_parallel_run(tmp_path, "opaque")
    folder = read_run_folder(root)
    workload = read_run_folder(REAL).requests[["input_toks", "output_toks"]].to_numpy(int)
    assert not (folder.requests[["input_toks", "output_toks"]].to_numpy(int) == workload).all()
    matched = match_workload(folder, workload)
    assert (matched.requests[["input_toks", "output_toks"]].to_numpy(int) == workload).all()
    far = workload.copy()
    far[[0, -1]] = far[[-1, 0]]  # the first and the last request swapped: minutes apart, not a tie
    assert match_workload(folder, far) is folder


def test_the_waiting_curve_adds_the_engines():
    """Two engines sampled in the same seconds: their running and waiting requests add up and
    their KV usage is averaged (a curve of engine 0 alone would read 2 waiting, not 5)."""
    def steps(replica, start, waiting, free):
        n = len(start)
        return pd.DataFrame({"replica": [replica] * n, "start_s": start, "duration_s": [0.1] * n,
                             "waiting": waiting, "swapped": [0] * n, "iterations": [1] * n,
                             "external_frag": [0.0] * n, "stranded_free": [0.0] * n, "idle_free": free})
    table = pd.concat([steps(0, [0.2, 1.2], [2, 1], [60.0, 50.0]), steps(1, [0.3, 1.3], [3, 0], [80.0, 40.0])])
    requests = pd.DataFrame({"replica": [0] * 4 + [1] * 5, "arrival_s": [0.0] * 4 + [0.0] * 5,
                             "finish_s": [10.0] * 9})  # all still in the engines
    c = simulated_curves(table, requests, capacity_slots=100)
    assert c["t"].tolist() == [1, 2]
    assert c["waiting"].tolist() == [5, 1]
    assert c["running"].tolist() == [(4 - 2) + (5 - 3), (4 - 1) + (5 - 0)]
    assert c["kv_pct"].tolist() == pytest.approx([(40 + 20) / 2, (50 + 60) / 2])


def test_workload_mismatch_prints_plain_numbers(tmp_path):
    root = copy_run(tmp_path)
    rewrite_requests(root, lambda rows: rows[3].update(output_toks=rows[3]["output_toks"] + 1))
    with pytest.raises(ValidateError) as e:
        validate_run(root, cost_model="roofline", policies=("vllm-v1",))
    msg = str(e.value)
    assert "np." not in msg and "not this run's workload" in msg
    r = read_run_folder(REAL).requests.iloc[3]
    assert f"({int(r['input_toks'])}, {int(r['output_toks']) + 1}) differ" in msg


def test_a_bad_timeseries_cell_prints_plain_numbers(tmp_path):
    root = copy_run(tmp_path)
    ts = pd.read_csv(root / "vllm" / "timeseries.csv")
    ts["waiting"] = ts["waiting"].astype(float)
    ts.loc[4, "waiting"] = np.inf
    ts.to_csv(root / "vllm" / "timeseries.csv", index=False)
    with pytest.raises(ValidateError) as e:
        read_run_folder(root)
    assert str(e.value).endswith("timeseries.csv:6: column 'waiting' is not a number: inf")


def test_numbered_request_ids_give_the_order_sent(tmp_path):
    """Ids that number the requests (``bench-17``) order them even when the engines' queueing
    stamps disagree by more than a near-tie (clocks of two engines)."""
    root = copy_run(tmp_path)

    def far_swap(rows):  # one request stamped 3 s late: about 30 requests later in queueing order
        late = next(r for r in rows if r["first_token_ts"] - r["queued_ts"] > 5)
        late["queued_ts"] += 3.0
    rewrite_requests(root, far_swap)
    ids = read_run_folder(root).requests["request_id"].tolist()
    assert ids == [f"bench-{i}" for i in range(300)]


def test_a_data_and_expert_parallel_moe_run_replays_as_one_deployment(tmp_path):
    """A run of a MoE model on two engines with vLLM's --enable-expert-parallel (as the RTX PRO
    6000 Qwen3-30B-A3B run records it: data_parallel_size 2, no hardware section): the replay's
    two engines are one deployment (``hardware.data_parallel``) whose experts are split whole
    over both GPUs (``hardware.expert_parallel``), so each GPU holds half the experts' weights."""
    model = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    root = copy_run(tmp_path, strip=BARE, model=model, data_parallel_size=2, enable_expert_parallel=True)
    meta_path = root / "vllm" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "model": model}))
    v = validate_run(root, cost_model="roofline", gpu="rtx-pro-6000", policies=("vllm-v1",),
                     given={"block_size": 16})
    cfg = v.replays[0].config
    hw = cfg.hardware
    assert (hw.num_replicas, hw.data_parallel, hw.expert_parallel) == (2, True, True)
    assert cfg.model.spec.moe is not None and cfg.expert_group.size == 2
    without = copy_run(tmp_path, "no-ep", strip=BARE, model=model, data_parallel_size=2)
    meta_path = without / "vllm" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "model": model}))
    w = validate_run(without, cost_model="roofline", gpu="rtx-pro-6000", policies=("vllm-v1",),
                     given={"block_size": 16})
    assert w.replays[0].config.hardware.expert_parallel is False  # engine_kwargs records false
