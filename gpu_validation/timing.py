"""Median-of-repetitions timing with CUDA events (or the wall clock on a CPU smoke run).

Each repetition first overwrites a buffer larger than the GPU's L2 cache (outside the
timed region), so a kernel that re-reads the same few MB is timed from HBM, as it would
run inside a model where other layers evict its data between steps. Then the GPU spins
for ~0.1 ms (``torch.cuda._sleep``) while Python queues the timed call, so a short
kernel is timed on the GPU alone, not waiting for its own launch: engines replay decode
steps as CUDA graphs, where launch overhead is not per kernel. (Work that Python issues
piece by piece for longer than that, like per-block swaps, is timed as issued.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024**2  # larger than any current GPU's L2 (H100/H200: 50 MB)
SPIN_CYCLES = 200_000  # ~0.1 ms at H100/H200 clocks (~1.8-2 GHz)


class Timer:
    """``timer(fn)`` returns the median seconds of ``reps`` calls after ``warmup`` calls."""

    def __init__(self, device: torch.device, warmup: int = 2, reps: int = 7, flush_l2: bool = True):
        self.device = device
        self.warmup = warmup
        self.reps = reps
        self.cuda = device.type == "cuda"
        self._flush = (
            torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            if (flush_l2 and self.cuda)
            else None
        )

    def __call__(self, fn: Callable[[], object], reps: int | None = None) -> float:
        reps = reps or self.reps
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            if self._flush is not None:
                self._flush.zero_()
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(SPIN_CYCLES)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
