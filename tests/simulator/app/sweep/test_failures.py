"""A failing run is recorded with its error; the other runs complete."""

import copy
import subprocess
import sys
from pathlib import Path

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.executors import InProcessExecutor, execute_run
from kvsim.simulator.app.sweep import load_sweep, run_sweep

SCRIPT = Path(__file__).with_name("sweep_script.py")
# Valid config, fails when run: the trace file does not exist.
MISSING_TRACE = {"trace": {"format": "azure", "path": "/nonexistent/kvsim-missing-trace.csv"}}


def _three_workloads(tiny_base):
    good = tiny_base["workload"]
    other = copy.deepcopy(good)
    other["arrivals"]["rate"] = 3.0
    return {"zip": {"label": ["good", "bad", "other"], "workload": [good, MISSING_TRACE, other]}}


def test_a_failing_run_is_recorded_and_the_others_complete(write_sweep, tiny_base):
    spec = load_sweep(write_sweep(_three_workloads(tiny_base)))
    result = run_sweep(spec, "local", workers=2)
    t = result.table
    assert list(t["system"]) == ["good", "bad", "other"]
    assert list(t["status"]) == ["ok", "failed", "ok"]
    assert result.failed == 1
    bad = t.iloc[1]
    assert (
        bad["error"].startswith("FileNotFoundError:") and "kvsim-missing-trace.csv" in bad["error"]
    )
    run_dir = spec.dir / "runs" / bad["run_id"]
    assert (run_dir / "error.txt").read_text().splitlines()[0] == bad["error"]
    assert not (run_dir / "summary.json").exists()
    assert t.iloc[[0, 2]]["completed"].tolist() == [40, 40]


def test_failures_are_retried_only_when_asked(write_sweep, tiny_base):
    spec = load_sweep(write_sweep(_three_workloads(tiny_base)))
    run_sweep(spec, workers=1)
    calls: list[str] = []

    def counting(job):
        calls.append(job.config["workload"].get("trace", {}) and "bad" or "good")
        return execute_run(job)

    again = run_sweep(spec, InProcessExecutor(counting))
    assert (
        calls == []
        and again.executed == 0
        and list(again.table["status"]) == ["ok", "failed", "ok"]
    )
    retried = run_sweep(spec, InProcessExecutor(counting), retry_failed=True)
    assert calls == ["bad"] and retried.executed == 1 and retried.failed == 1


def test_cli_reports_failures_with_exit_status_1(write_sweep, tiny_base, capsys):
    path = write_sweep(_three_workloads(tiny_base))
    assert main(["sweep", str(path), "--workers", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "1 runs failed" in err and "--retry-failed" in err


def test_a_worker_process_that_dies_fails_only_its_run(write_sweep, tiny_base, tmp_path):
    rates = [1.0, 3.0, 5.0, 7.0]
    path = write_sweep({"grid": {"workload.arrivals.rate": rates}})
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), str(tmp_path), "crash"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "executed=4 failed=1" in proc.stdout
    import pandas as pd

    t = pd.read_csv(tmp_path / "results" / "s" / "sweep.csv")
    assert list(t["status"]) == ["ok", "failed", "ok", "ok"]
    assert t.loc[1, "error"].startswith("WorkerCrashed")
