"""Where a sweep's runs execute: in this process, on a local process pool, or on Ray.

A run travels as a :class:`RunJob`: the resolved config as a plain dict, the folder its
relative paths start from, and the folder its results go to - nothing that needs the
driver's objects, so it pickles cleanly to any worker. :func:`execute_run` is what a worker
does with it; it never raises for a failing run: the error comes back as a failed
:class:`RunOutcome` and the sweep goes on.

Every executor has the same small interface, so a sweep (or a rate search, which decides
its next run from the last result) can keep submitting while results come back:

    ex.submit(job)               # queue a run
    job, outcome = ex.next_done() # block until some run finishes (any order)
    ex.close(cancel=False)       # release workers (cancel=True drops queued runs)

* :class:`InProcessExecutor` (``--workers 1``): runs each job when its result is asked
  for, in this process; ``KeyboardInterrupt`` behaves as in a plain loop, which makes it
  the one to debug with.
* :class:`LocalExecutor`: a ``ProcessPoolExecutor``, one worker per core by default. The
  workers write the folders of successful runs themselves (same filesystem); failures
  come back to the driver, which records them. If a worker process dies (killed, out of
  memory), the pool is rebuilt and the runs it held are run again one at a time: the one
  that kills its worker again is recorded as failed, the others complete.
  Workers exit when the sweep's process dies, however it dies (``SIGKILL`` included):
  each runs a watchdog thread that polls the driver's process (and, on Linux, asks the
  kernel for ``SIGKILL`` when its own parent, the fork server, goes). Without it a pool
  worker blocks forever on its task queue, and keeps the fork server and the resource
  tracker alive with it.
* :class:`RayExecutor`: one Ray task per run (``num_cpus=1``), gathered with ``ray.wait``.
  It joins the cluster at ``address`` or starts a local Ray with ``num_cpus``. Tasks return
  the run's tables and the driver writes them, so workers on other machines need no
  shared filesystem - but they do need the same Python environment and any trace files at
  the same paths (or an absolute path that exists on every node).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvsim.simulator.engine.runner import RunResult


@dataclass(frozen=True)
class RunJob:
    """One run to execute: everything a worker needs, as plain data."""

    run_id: str  # the config hash; also the run folder's name
    config: dict  # the experiment as a raw mapping (what a YAML file holds), overrides applied
    base_dir: str  # folder that relative paths in the config start from
    run_dir: str  # where the run's outputs go
    plot: bool = False  # draw the run's memory timeline
    write: bool = True  # the worker writes ``run_dir`` itself (False: return the tables)


@dataclass
class RunOutcome:
    """What came back from a run."""

    run_id: str
    ok: bool
    summary: dict | None = None
    error: str | None = None  # one line: "ExceptionType: message"
    details: str | None = None  # traceback, for error.txt
    wall_s: float = 0.0  # seconds the simulation took
    result: RunResult | None = field(default=None, repr=False)  # the tables, when not written


def _error_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or repr(e)
    return f"{type(e).__name__}: {text}"


def execute_run(job: RunJob) -> RunOutcome:
    """Simulate one job; write its folder (if ``job.write``); never raise for a bad run."""
    from kvsim.simulator.app.results import write_run
    from kvsim.simulator.config import validate_config
    from kvsim.simulator.engine.runner import run_experiment

    try:
        cfg = validate_config(copy.deepcopy(job.config), source=f"run {job.run_id}")
        result = run_experiment(cfg, Path(job.base_dir))
        if job.write:
            write_run(result, Path(job.run_dir), plot=job.plot)
            return RunOutcome(job.run_id, True, summary=dict(result.summary), wall_s=result.wall_s)
        return RunOutcome(
            job.run_id, True, summary=dict(result.summary), wall_s=result.wall_s, result=result
        )
    except (
        Exception
    ) as e:  # a failing run is data, not a crash of the sweep (the driver records it)
        return RunOutcome(job.run_id, False, error=_error_line(e), details=traceback.format_exc())


RunFn = Callable[[RunJob], RunOutcome]


class Executor(Protocol):
    def submit(self, job: RunJob) -> None: ...

    def next_done(self) -> tuple[RunJob, RunOutcome]: ...

    def pending(self) -> int: ...

    def close(self, cancel: bool = False) -> None: ...


class InProcessExecutor:
    """Runs each job in this process, in submission order, when its result is asked for."""

    def __init__(self, fn: RunFn = execute_run):
        self.fn = fn
        self._queue: deque[RunJob] = deque()

    def submit(self, job: RunJob) -> None:
        self._queue.append(job)

    def pending(self) -> int:
        return len(self._queue)

    def next_done(self) -> tuple[RunJob, RunOutcome]:
        job = self._queue.popleft()
        return job, self.fn(job)

    def close(self, cancel: bool = False) -> None:
        self._queue.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close(cancel=exc[0] is not None)


WATCHDOG_POLL_S = 0.5  # seconds between a pool worker's checks that the driver is alive


def _process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: no such process, or a zombie (dead, not yet reaped:
    ``kill(pid, 0)`` still succeeds on one, so Linux's /proc state is read too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, owned by someone else
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (macOS): kill(pid, 0) is all there is
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _die_with_parent_signal() -> None:
    """Linux: have the kernel send SIGKILL to this process when its parent exits
    (``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing (the watchdog thread covers it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def exit_with_driver(driver_pid: int, poll_s: float = WATCHDOG_POLL_S) -> None:
    """Pool-worker initializer: exit as soon as the sweep's process ``driver_pid`` is gone.

    A daemon thread polls the driver every ``poll_s`` seconds and, once it is gone (or this
    worker was handed to another parent: the fork server died), ends the process with
    ``os._exit`` even while a simulation runs in the main thread. Never raises: a failing
    initializer would break the pool.
    """
    parent = os.getppid()
    if parent != driver_pid:
        # Forked by the fork server (single-threaded: the signal cannot fire because some
        # thread of a live parent ended, as it could for a worker the driver started itself).
        _die_with_parent_signal()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent or _process_gone(driver_pid):
                os._exit(1)

    threading.Thread(target=watch, name="kvsim-driver-watchdog", daemon=True).start()


def _pool_context():
    """``forkserver`` where available: workers fork from a clean server that has already
    imported the simulator (fast start, no inherited threads); else ``spawn``. The main
    script is preloaded too (as multiprocessing does by default), so a run function defined
    in it can be sent to workers."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(
            ["__main__", "kvsim.simulator.app.executors", "kvsim.simulator.engine.runner", "kvsim.simulator.app.results"]
        )
        return ctx
    return mp.get_context("spawn")


class LocalExecutor:
    """A local process pool; ``workers`` processes (default: one per core).

    At most ``workers`` runs are handed to the pool at a time (the rest wait here), so a
    worker that dies takes down only the runs in flight. Those are run again one at a
    time, alone in the pool: a run whose worker dies while it runs alone is the culprit
    and is recorded as failed; the others complete.
    """

    CRASH = (
        "WorkerCrashed: the worker process died while running this config "
        "(killed, or out of memory?)"
    )

    def __init__(self, fn: RunFn = execute_run, workers: int | None = None):
        self.fn = fn
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._ctx = _pool_context()
        self._pool: ProcessPoolExecutor | None = None
        self._queue: deque[RunJob] = deque()  # not yet handed to the pool
        self._suspects: deque[RunJob] = deque()  # in flight during a crash: rerun alone
        self._alone: RunJob | None = None  # the suspect running alone now
        self._futures: dict[Future, RunJob] = {}
        self._ready: deque[tuple[RunJob, RunOutcome]] = deque()

    def submit(self, job: RunJob) -> None:
        self._queue.append(job)

    def pending(self) -> int:
        return len(self._queue) + len(self._suspects) + len(self._futures) + len(self._ready)

    def _start(self, job: RunJob) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=self._ctx,
                initializer=exit_with_driver,
                initargs=(os.getpid(),),
            )
        self._futures[self._pool.submit(self.fn, job)] = job

    def _fill(self) -> None:
        """Hand runs to the pool: a suspect alone, else up to ``workers`` runs."""
        if self._alone is not None:
            return
        if self._suspects:
            if not self._futures:
                self._alone = self._suspects.popleft()
                self._start(self._alone)
            return
        while self._queue and len(self._futures) < self.workers:
            self._start(self._queue.popleft())

    def next_done(self) -> tuple[RunJob, RunOutcome]:
        while not self._ready:
            self._fill()
            if not self._futures:
                raise RuntimeError("next_done() with nothing submitted")
            done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
            crashed = False
            for fut in done:
                job = self._futures.pop(fut)
                try:
                    self._ready.append((job, fut.result()))
                except BrokenProcessPool:
                    crashed = True
                    self._futures[fut] = job  # handled with the rest of the pool below
                    continue
                except Exception as e:  # the run function itself raised (or failed to pickle)
                    self._ready.append(
                        (
                            job,
                            RunOutcome(
                                job.run_id,
                                False,
                                error=_error_line(e),
                                details=traceback.format_exc(),
                            ),
                        )
                    )
                if job is self._alone:
                    self._alone = None
            if crashed:
                self._recover()
        return self._ready.popleft()

    def _recover(self) -> None:
        """A worker died, and with it every run in the pool: blame or requeue each."""
        broken = list(self._futures.values())
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for job in broken:
            if job is self._alone:
                self._ready.append(
                    (job, RunOutcome(job.run_id, False, error=self.CRASH, details=self.CRASH))
                )
                self._alone = None
            else:
                self._suspects.append(job)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None
        self._futures.clear()
        self._queue.clear()
        self._suspects.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close(cancel=exc[0] is not None)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nobody listens at; ``ray.init``
    itself keeps retrying for minutes."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: leave them to Ray
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"no Ray cluster answers at {address} ({e.strerror or e})") from None


class RayExecutor:
    """One Ray task per run; joins ``address`` or starts a local Ray of ``num_cpus`` CPUs."""

    def __init__(
        self, fn: RunFn = execute_run, address: str | None = None, num_cpus: int | None = None
    ):
        try:
            import ray
        except ImportError:
            raise ImportError("the ray executor needs Ray: pip install 'kvsim[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            if address:
                _check_reachable(address)
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=num_cpus or os.cpu_count(),
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            self._started = True
        # max_retries: a task whose worker died is tried once more (as the local pool does).
        self._remote = ray.remote(num_cpus=1, max_retries=1)(fn)
        self._refs: dict = {}

    def submit(self, job: RunJob) -> None:
        if job.write:  # the driver writes: workers may be on machines without our disk
            job = RunJob(job.run_id, job.config, job.base_dir, job.run_dir, job.plot, write=False)
        self._refs[self._remote.remote(job)] = job

    def pending(self) -> int:
        return len(self._refs)

    def next_done(self) -> tuple[RunJob, RunOutcome]:
        if not self._refs:
            raise RuntimeError("next_done() with nothing submitted")
        (ref,), _ = self._ray.wait(list(self._refs), num_returns=1)
        job = self._refs.pop(ref)
        try:
            return job, self._ray.get(ref)
        except Exception as e:  # the worker died twice, or the task could not run
            return job, RunOutcome(
                job.run_id, False, error=_error_line(e), details=traceback.format_exc()
            )

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in self._refs:
                self._ray.cancel(ref, force=True)
        self._refs.clear()
        if self._started:
            self._ray.shutdown()
            self._started = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close(cancel=exc[0] is not None)


def make_executor(
    kind: str = "local",
    fn: RunFn = execute_run,
    workers: int | None = None,
    address: str | None = None,
) -> InProcessExecutor | LocalExecutor | RayExecutor:
    """``local`` (a process pool; ``workers=1`` runs in this process) or ``ray``
    (``address`` of a cluster, or a local Ray of ``workers`` CPUs)."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")
    if kind == "local":
        return InProcessExecutor(fn) if workers == 1 else LocalExecutor(fn, workers)
    if kind == "ray":
        return RayExecutor(fn, address=address, num_cpus=workers)
    raise ValueError(f"unknown executor {kind!r}; choose local or ray")


__all__ = [
    "Executor",
    "InProcessExecutor",
    "LocalExecutor",
    "RayExecutor",
    "RunJob",
    "RunOutcome",
    "execute_run",
    "exit_with_driver",
    "make_executor",
]
