"""A sweep in its own process, for tests that kill it or crash its workers.

    python sweep_script.py SWEEP.yaml MARKERS_DIR slow|crash|hang

``slow``: every run first drops a marker file ``<run_id>.<pid>.<n>`` into MARKERS_DIR and
sleeps 0.3 s (so a test can kill the sweep midway). ``hang``: the same, then sleeps a minute
(a worker busy with a long run). ``crash``: the worker process running
the config whose arrival rate is 3.0 req/s dies (``os._exit``), as on an out-of-memory kill.
Runs on the local process pool with 2 workers.
"""

import os
import sys
import time
import uuid
from pathlib import Path

from kvsim.simulator.app.executors import execute_run
from kvsim.simulator.app.sweep import load_sweep, run_sweep


def slow_run(job):
    markers = Path(os.environ["KVSIM_TEST_MARKERS"])
    (markers / f"{job.run_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}").touch()
    time.sleep(0.3)
    return execute_run(job)


def hanging_run(job):
    markers = Path(os.environ["KVSIM_TEST_MARKERS"])
    (markers / f"{job.run_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}").touch()
    time.sleep(60)
    return execute_run(job)


def crashing_run(job):
    if job.config["workload"]["arrivals"]["rate"] == 3.0:
        os._exit(17)
    return execute_run(job)


if __name__ == "__main__":
    sweep, markers, mode = sys.argv[1:4]
    os.environ["KVSIM_TEST_MARKERS"] = markers
    fn = {"slow": slow_run, "hang": hanging_run, "crash": crashing_run}[mode]
    result = run_sweep(load_sweep(sweep), "local", workers=2, run_fn=fn)
    print(f"executed={result.executed} failed={result.failed}")
