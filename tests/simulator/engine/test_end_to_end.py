"""End to end on the real Azure conversation trace: conservation and determinism."""

from pathlib import Path

import pandas as pd

from kvsim.simulator.config import load_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.traces.loaders import load_trace

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def run(*overrides):
    cfg, base = load_config(QUICKSTART, ["workload.window.duration_s=120", *overrides])
    return run_experiment(cfg, base)


def test_every_request_ends_exactly_once_with_its_tokens():
    result = run()
    df = result.requests
    trace = [r for r in load_trace(ROOT / "traces/data/AzureLLMInferenceTrace_conv.csv") if r.arrival_time < 120]
    assert len(df) == len(trace) and df["request_id"].is_unique
    assert set(df["status"]) <= {"finished", "rejected"}
    done = df[df.status == "finished"]
    expected = pd.Series({r.request_id: r.output_tokens for r in trace})
    assert (done["generated_tokens"].to_numpy() == expected[done["request_id"]].to_numpy()).all()
    rejected = df[df.status == "rejected"]
    assert rejected["reason"].notna().all()
    # Llama-2-7B's window is 4096 tokens: exactly the longer requests are rejected.
    too_long = {r.request_id for r in trace if r.prompt_tokens + r.output_tokens > 4096}
    assert set(rejected["request_id"]) == too_long
    s = result.summary
    assert s["completed"] + s["rejected"] + s["aborted"] == len(trace)


def test_same_config_and_seed_give_identical_summary():
    a, b = run(), run()
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)


def test_memory_classes_sum_to_capacity_every_step():
    steps = run().steps
    classes = ["token_states", "reserved", "internal_frag", "external_frag", "stranded_free", "idle_free"]
    total = steps[classes].sum(axis=1)
    cap = load_config(QUICKSTART)[0].kv_slots // 16 * 16
    assert ((total - cap).abs() < 1e-6 * cap).all()


def test_contiguous_memory_classes_sum_to_capacity_every_step():
    result = run("allocator.kind=contiguous", "allocator.preset=orca-max")
    classes = ["token_states", "reserved", "internal_frag", "external_frag", "stranded_free", "idle_free"]
    total = result.steps[classes].sum(axis=1)
    cap = result.summary["kv_capacity_slots"]
    assert ((total - cap).abs() < 1e-6 * cap).all()
    assert result.summary["mem_internal_frag_perc"] > 10  # max-length reservations waste memory


def test_resolved_config_of_a_trace_run_loads_again(tmp_path):
    from kvsim.simulator.app.results import config_hash, write_run

    result = run()
    run_dir = write_run(result, tmp_path / "r", plot=False)
    again, _ = load_config(run_dir / "config.yaml")
    assert config_hash(again) == config_hash(result.config)


def test_bad_trace_row_found_mid_run_is_one_clear_error(tmp_path, capsys):
    from kvsim.simulator.app.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.6805900,abc,44\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for path, line in ((bad, ":3:"), (empty, "")):
        assert main(["run", str(QUICKSTART), "--set", f"workload.trace.path={path}", "--no-plot",
                     "--out", str(tmp_path / "res")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}{line}") and "Traceback" not in err
