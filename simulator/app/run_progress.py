"""A progress bar for one simulation: simulated time, requests done, their rate and an ETA.

A run of a million requests takes minutes; without a sign of life it looks hung. Progress
goes to stderr (stdout keeps the summary table, so it can be piped): a bar when stderr is a
terminal, else (a log file, a pipe, CI) a plain line every few seconds, none for a run that
ends sooner. When the run is done the bar's ETA and the last line's read 0. ``kvsim run
--quiet`` turns both off.

The engine is not touched: a daemon thread samples the simulation (four times a second for
the bar, at each line for lines): ``Simulation.env.now`` and the length of its request log,
both read without locks (a float and an int, each read atomically under the GIL), so the
simulation runs as fast with progress as without it.

    simulating quickstart ━━━━━━━━━━━╺━━━━━━━━  5,012/9,000 requests  312.4 s simulated
    2,304 req/s  0:00:02 ETA 0:00:01

    simulating quickstart: 5,012/9,000 requests, 312.4 s simulated, 2,304 req/s, 0:00:02 elapsed, ETA 0:00:01
"""

from __future__ import annotations

import math
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads only to draw a bar: a quiet or logged run starts without it
    from rich.console import Console
    from rich.progress import Progress


class RunProgress:
    """Context manager: ``with RunProgress(name, total) as bar: bar.watch(sim); sim.run()``.

    ``total``: requests the run will end; else ``total_sim_s``, the simulated seconds it will
    span (the bar then follows the clock); neither: the bar only counts. ``console``: where
    to draw (default: stderr, unless ``quiet``): a bar on a terminal (``enabled``), else a line
    every ``line_every_s`` (``lines``); nothing when quiet.
    """

    def __init__(self, name: str, total: int | None, console: Console | None = None,
                 interval_s: float = 0.25, total_sim_s: float | None = None, line_every_s: float = 5.0,
                 quiet: bool = False):
        if console is None and not quiet and sys.stderr.isatty():
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console  # None: plain lines on stderr, or nothing when quiet
        quiet = quiet or (console is not None and console.quiet)
        terminal = console.is_terminal if console is not None else False
        self.enabled = terminal and not quiet
        self.lines = not terminal and not quiet
        self.name = name
        self.total = total
        self.total_sim_s = total_sim_s
        self.by_clock = total is None and total_sim_s is not None  # progress = simulated time
        self.interval_s = interval_s
        self.line_every_s = line_every_s
        self.lines_printed = 0
        self._started = time.monotonic()
        self._sim = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bar: Progress | None = None
        if self.enabled:
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]simulating {task.description}"), BarColumn(),
                TextColumn("{task.fields[done]:,}{task.fields[of]} requests"),
                TextColumn("{task.fields[sim_s]:,.1f} s simulated"),
                TextColumn("{task.fields[rate]:,.0f} req/s"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=True)
            self.task = self.bar.add_task(name, total=total_sim_s if self.by_clock else total, sim_s=0.0,
                                          rate=0.0, done=0, of=f"/{total:,}" if total else "")

    def watch(self, sim) -> None:
        """Follow ``sim`` (a :class:`simulator.engine.simulation.Simulation`) until the context ends."""
        self._sim = sim
        if (self.bar is not None or self.lines) and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="kvsim-progress", daemon=True)
            self._thread.start()

    def sample(self) -> None:
        """Read the simulation's clock and request count into the bar (the thread's step)."""
        if self.bar is None or self._sim is None:
            return
        done = len(self._sim.request_rows)
        elapsed = self.bar.tasks[0].elapsed or 0.0
        now = float(self._sim.env.now)
        self.bar.update(self.task, completed=now if self.by_clock else done, done=done, sim_s=now,
                        rate=done / elapsed if elapsed > 0 else 0.0)

    def line(self, done_now: bool = False) -> str:
        """The plain progress line (``done_now``: the run has ended, ETA 0)."""
        done = len(self._sim.request_rows) if self._sim is not None else 0
        now = float(self._sim.env.now) if self._sim is not None else 0.0
        elapsed = time.monotonic() - self._started
        if self.by_clock:
            share = now / self.total_sim_s if self.total_sim_s else None
        else:
            share = done / self.total if self.total else None
        if done_now:
            eta = ", ETA 0:00:00" if share is not None else ", done"
        elif share and share < 1:
            eta = f", ETA {clock(math.ceil(elapsed * (1 - share) / share))}"  # (0 only when done)
        else:  # nothing yet, or past the arrivals' span and draining: not known
            eta = ", ETA -:--:--" if share is not None else ""
        of = f"/{self.total:,}" if self.total else ""
        rate = done / elapsed if elapsed > 0 else 0.0
        return (f"simulating {self.name}: {done:,}{of} requests, {now:,.1f} s simulated, {rate:,.0f} req/s, "
                f"{clock(elapsed)} elapsed{eta}")

    def _print_line(self, done_now: bool = False) -> None:
        if self.console is None:
            print(self.line(done_now), file=sys.stderr, flush=True)
        else:
            self.console.print(self.line(done_now), markup=False, highlight=False, soft_wrap=True)
        self.lines_printed += 1

    def _poll(self) -> None:
        if self.bar is not None:
            while not self._stop.wait(self.interval_s):
                self.sample()
        else:
            while not self._stop.wait(self.line_every_s):
                self._print_line()

    def __enter__(self) -> RunProgress:
        self._started = time.monotonic()
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:  # done: the last state shown is the end, ETA 0
            if self.bar is not None:
                self.sample()
                task = self.bar.tasks[0]
                if task.total is not None:
                    self.bar.update(self.task, completed=max(task.completed, task.total))
            elif self.lines and self.lines_printed:
                self._print_line(done_now=True)
        if self.bar is not None:
            self.bar.stop()


def clock(seconds: float) -> str:
    """``h:mm:ss``, as the bar's clocks."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
