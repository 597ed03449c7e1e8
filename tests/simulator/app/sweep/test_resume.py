"""A sweep stopped midway and started again loses nothing and repeats nothing."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kvsim.simulator.app.executors import InProcessExecutor, execute_run
from kvsim.simulator.app.sweep import load_sweep, run_sweep

SCRIPT = Path(__file__).with_name("sweep_script.py")
RATES = [1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0]
METRICS = [
    "normalized_latency_s_per_token",
    "mean_batched_requests",
    "completed",
    "mem_token_states_perc",
]


def _sweep(write_sweep, name="s"):
    return write_sweep({"name": name, "grid": {"workload.arrivals.rate": RATES}})


def _done(runs: Path) -> set[str]:
    """Finished runs (a folder being written is hidden: ``.<id>.<random>``)."""
    if not runs.is_dir():
        return set()
    return {
        p.name
        for p in runs.iterdir()
        if not p.name.startswith(".") and (p / "summary.json").is_file()
    }


def _reference(write_sweep) -> pd.DataFrame:
    """The same grid run without interruption, in another folder."""
    spec = load_sweep(_sweep(write_sweep, "reference"), name="reference")
    return run_sweep(spec, workers=1).table


def test_interrupt_midway_then_resume_runs_exactly_the_rest(write_sweep):
    spec = load_sweep(_sweep(write_sweep))
    first: list[str] = []

    def interrupted_after_three(job):
        if len(first) == 3:
            raise KeyboardInterrupt
        first.append(job.run_id)
        return execute_run(job)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, InProcessExecutor(interrupted_after_three))
    partial = pd.read_csv(spec.dir / "sweep.csv")
    assert list(partial["status"]) == ["ok"] * 3 + ["pending"] * (len(RATES) - 3)

    second: list[str] = []

    def counting(job):
        second.append(job.run_id)
        return execute_run(job)

    result = run_sweep(spec, InProcessExecutor(counting))
    assert set(first).isdisjoint(second) and len(second) == len(set(second)) == len(RATES) - 3
    assert result.executed == len(RATES) - 3 and result.reused == 3
    ref = _reference(write_sweep)
    assert (result.table["status"] == "ok").all()
    pd.testing.assert_frame_equal(result.table[["run_id", *METRICS]], ref[["run_id", *METRICS]])


def test_killed_sweep_restarts_without_losing_or_repeating_a_finished_run(write_sweep, tmp_path):
    path = _sweep(write_sweep)
    spec = load_sweep(path)
    runs = spec.dir / "runs"
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(path), str(markers), "slow"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while len(_done(runs)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, the pool's workers and its fork server
    proc.wait()
    done_at_kill = _done(runs)
    assert 3 <= len(done_at_kill) < len(RATES), proc.stderr.read().decode()[-2000:]
    started_first = {m.name.split(".")[0] for m in markers.iterdir()}
    assert done_at_kill <= started_first

    second: list[str] = []

    def counting(job):
        second.append(job.run_id)
        return execute_run(job)

    result = run_sweep(spec, InProcessExecutor(counting))
    all_ids = set(result.table["run_id"])
    assert len(all_ids) == len(RATES)
    assert sorted(second) == sorted(
        all_ids - done_at_kill
    )  # the rest, each once; nothing finished again
    assert (result.table["status"] == "ok").all()
    ref = _reference(write_sweep)
    pd.testing.assert_frame_equal(result.table[["run_id", *METRICS]], ref[["run_id", *METRICS]])
