"""One exclusive lock per run folder, so concurrent sweeps into one folder share the work.

Two sweeps started at once into the same ``runs/`` folder (the same command in two
terminals, or two sweeps whose grids overlap) would otherwise both simulate every run and
both write its folder. Before a sweep simulates a run it takes the run's lock::

    runs/
      .3f9c2a...lock     <- held (flock, exclusive) by the sweep simulating run 3f9c2a...
      3f9c2a.../         <- written, atomically, by that sweep only

A sweep that finds a run locked leaves it to the holder and waits for the folder to
appear; if the holder dies, the kernel drops its lock and the waiting sweep runs it. The
lock is an advisory ``flock`` on a hidden file next to the folder: the kernel releases it
when the process holding it ends, however it ends, so a killed sweep never leaves a stale
lock behind. The lock files stay (removing one while another process opens it would let
two holders lock two different files).

Where ``fcntl`` does not exist (Windows), locking is a no-op: sweeps there do not share
work, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunLock:
    """An exclusive, non-blocking lock on ``runs/.<run_id>.lock``."""

    def __init__(self, runs_dir: Path, run_id: str):
        self.path = Path(runs_dir) / f".{run_id}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; True when this object now holds it."""
        if self._fd is not None:
            return True
        if fcntl is None:  # pragma: no cover - Windows
            self._fd = -1
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another process (BlockingIOError), or not lockable
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None


__all__ = ["RunLock"]
