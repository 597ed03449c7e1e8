"""``make bench`` (start-up): from a fresh process to the engine's first event.

``kvsim run quickstart`` on a 5-second window (a handful of requests), as a user runs it, in a
fresh interpreter each time: the time from the process's start to the moment the engine starts
simulating (``Simulation.run``), which is what a user waits for before the first step. It
counts the interpreter, the CLI, the config and the trace, and not the run itself or its
outputs. Reported per try: CPU seconds of the process by then (``getrusage``: close to the
idle single-core wall time on a shared machine) and wall seconds since the parent spawned it,
best of ``--repeat``; and which heavy libraries were already loaded (the run path loads
pandas, pyarrow and matplotlib only after the run, to write and draw its results, and rich
only to print: a quiet run, as measured here, or one logged to a file draws no bar).

Usage: ``python -m benchmarks.startup [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

PROBE = """
import json, os, resource, sys, time
from kvsim.simulator.engine.simulation import Simulation

HEAVY = ("pandas", "pyarrow", "matplotlib", "scipy", "rich")

def first_event(self):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "at": time.time(),
                      "loaded": [m for m in HEAVY if m in sys.modules]}), flush=True)
    os._exit(0)  # the run itself is not measured

Simulation.run = first_event
from kvsim.simulator.app.cli import main
sys.exit(main(["run", "quickstart", "--quiet", "--no-plot", "--out", sys.argv[1],
               "--set", "workload.window.duration_s=5"]))
"""


def measure_once(out_dir: str) -> dict:
    """One fresh process: CPU and wall seconds to the first event, heavy modules loaded by then."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", PROBE, out_dir], capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"start-up probe failed (status {proc.returncode}): {proc.stderr.strip()[-500:]}")
    r = json.loads(lines[-1])
    return {"cpu_s": r["cpu_s"], "wall_s": r["at"] - t0, "loaded": r["loaded"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5, help="fresh processes to start (best of them)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        tries = [measure_once(out) for _ in range(max(1, args.repeat))]
    cpu, wall = min(t["cpu_s"] for t in tries), min(t["wall_s"] for t in tries)
    loaded = sorted({m for t in tries for m in t["loaded"]})
    print(f"start-up (process start to first event, kvsim run quickstart, best of {len(tries)}): "
          f"{cpu:.3f} s CPU, {wall:.3f} s wall; heavy modules loaded by then: {', '.join(loaded) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
