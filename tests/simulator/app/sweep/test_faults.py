"""Sweeps under faults: a killed sweep takes its workers with it, concurrent sweeps into one
folder share the runs, and successive sweeps of one config keep their own tables."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.executors import _process_gone
from kvsim.simulator.app.sweep import load_sweep, run_sweep

SCRIPT = Path(__file__).with_name("sweep_script.py")
RATES = [1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0]


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[-1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return {c for c in found if not _process_gone(c)}


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_workers_exit_when_only_the_sweep_process_is_killed(write_sweep, tmp_path):
    path = write_sweep({"grid": {"workload.arrivals.rate": RATES}})
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(path), str(markers), "hang"])
    helpers: set[int] = set()
    try:
        # Both workers are inside a (minute-long) run: the pool is at its fullest.
        assert _wait_for(lambda: len(list(markers.iterdir())) >= 2, 60)
        workers = {int(m.name.split(".")[1]) for m in markers.iterdir()}
        helpers = _children(proc.pid)  # workers, fork server, resource tracker
        assert workers <= helpers and len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)  # the parent only; it stays a zombie until reaped
        assert _wait_for(lambda: all(_process_gone(p) for p in helpers), 5.0), [
            p for p in helpers if not _process_gone(p)
        ]
    finally:
        proc.kill()
        proc.wait()
        for p in helpers:  # leave nothing behind if the test failed
            if not _process_gone(p):
                os.kill(p, signal.SIGKILL)


def test_two_identical_sweeps_at_once_share_the_runs(write_sweep, tmp_path):
    path = write_sweep({"grid": {"workload.arrivals.rate": RATES}})
    markers = tmp_path / "markers"
    markers.mkdir()
    cmd = [sys.executable, str(SCRIPT), str(path), str(markers), "slow"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # Every run was simulated exactly once, by one of the two sweeps.
    runs = Counter(m.name.split(".")[0] for m in markers.iterdir())
    assert len(runs) == len(RATES) and set(runs.values()) == {1}, runs
    executed = [int(o.split("executed=")[1].split()[0]) for o in outs]
    assert sum(executed) == len(RATES)
    spec = load_sweep(path)
    table = pd.read_csv(spec.dir / "sweep.csv")
    assert (table["status"] == "ok").all() and sorted(table["run_id"]) == sorted(runs)


def test_a_sweep_takes_over_a_run_whose_holder_died(write_sweep):
    # The lock of a run whose sweep died is released by the kernel: the run is done here.
    from kvsim.simulator.app.run_lock import RunLock

    path = write_sweep({"grid": {"workload.arrivals.rate": [1.0, 2.0]}})
    spec = load_sweep(path)
    first = run_sweep(spec, workers=1)
    victim = first.table["run_id"].iloc[0]
    import shutil

    shutil.rmtree(spec.dir / "runs" / victim)
    other = RunLock(spec.dir / "runs", victim)
    assert other.try_acquire()  # "another sweep" holds it...
    assert not RunLock(spec.dir / "runs", victim).try_acquire()
    other.release()  # ...and dies
    again = run_sweep(spec, workers=1)
    assert again.executed == 1 and (again.table["status"] == "ok").all()


def test_successive_sweeps_of_one_config_keep_their_own_tables(tiny_base, tmp_path):
    import yaml

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_base))
    out = tmp_path / "out"
    common = ["--workers", "1", "--no-progress", "--out", str(out)]
    kinds = [
        ["--grid", "allocator.block_size=8,32"],
        ["--zip", "label=a,b", "--zip", "allocator.block_size=16,64"],
        ["--find-rate", "lo=1,hi=16,tolerance=4,max_normalized_latency=0.05"],
        ["--grid", "allocator.block_size=8,32,128"],  # the same key, other values
    ]
    tables = []
    for args in kinds:
        assert main(["sweep", str(cfg), *args, *common]) == 0
        folders = sorted(out.iterdir(), key=lambda p: p.stat().st_mtime)
        tables.append((folders[-1], (folders[-1] / "sweep.csv").read_bytes()))
    assert len({folder for folder, _ in tables}) == len(kinds)  # a folder per sweep
    names = [folder.name for folder, _ in tables]
    assert names[0].startswith("tiny-sweep-grid-block_size-")
    assert names[1].startswith("tiny-sweep-zip-label-block_size-")
    assert names[2].startswith("tiny-sweep-rate-")
    for folder, content in tables:  # no later sweep touched an earlier one's table
        assert (folder / "sweep.csv").read_bytes() == content
        assert (folder / "rates.csv").exists() == ("rate" in folder.name)
    # The same command again resumes in the same folder.
    assert main(["sweep", str(cfg), *kinds[0], *common]) == 0
    assert len(list(out.iterdir())) == len(kinds)


def test_a_sweep_without_a_search_removes_the_rates_table_an_earlier_search_left(write_sweep):
    rate = write_sweep(
        {"find_rate": {"lo": 1.0, "hi": 16.0, "tolerance": 4.0, "max_normalized_latency": 0.05}}
    )
    spec = load_sweep(rate)
    run_sweep(spec, workers=1)
    assert (spec.dir / "rates.csv").exists()
    grid = write_sweep({"grid": {"allocator.block_size": [8, 16]}})  # same name, same folder
    result = run_sweep(load_sweep(grid), workers=1)
    assert result.rates is None
    assert not (spec.dir / "rates.csv").exists() and not (spec.dir / "rates.parquet").exists()
    assert len(pd.read_csv(spec.dir / "sweep.csv")) == 2
