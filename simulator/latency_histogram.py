"""Inter-token latencies in bounded memory: a log-bucketed histogram.

A million-request run emits hundreds of millions of tokens; keeping every gap
would take gigabytes. Gaps fall into buckets of relative width 0.1%
(``bucket = floor(ln(gap) / ln(1.001))``), so a quantile is exact to within
0.05% of its value; the mean is kept exactly as a running sum.
"""

from __future__ import annotations

import math

import numpy as np

_LOG_BASE = math.log1p(1e-3)


class LatencyHistogram:
    """Counts of latencies (seconds) by log bucket, plus their exact sum.

    Samples and runs of growing gaps (``add_linear``) are filed in batches: each
    costs a tuple until many have gathered, then numpy buckets all their values at once.
    """

    __slots__ = ("_counts", "total", "count", "_runs", "_pending")

    _BATCH = 1 << 16  # values filed together (bounds the pending tuples and arrays to a few MiB)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.total = 0.0  # seconds, sum of all samples
        self.count = 0
        self._runs: list[tuple[float, float, int, int]] = []  # (first, slope, count, times) not yet filed
        self._pending = 0  # values in those runs

    def add(self, seconds: float, times: int = 1) -> None:
        """Record ``times`` samples equal to ``seconds`` (filed with the next batch)."""
        self.total += seconds * times
        self.count += times
        self._runs.append((seconds, 0.0, 1, times))
        self._pending += 1
        if self._pending >= self._BATCH:
            self._file_runs()

    def add_linear(self, first: float, slope: float, count: int, times: int = 1) -> None:
        """Record ``first + slope * i`` for i = 0..count-1, each ``times`` times (a run's
        gaps grow by a constant). The sum is kept at once; the buckets a batch later."""
        if count <= 0:
            return
        self.total += (count * first + slope * (count * (count - 1) / 2)) * times
        self.count += count * times
        self._runs.append((first, slope, count, times))
        self._pending += count
        if self._pending >= self._BATCH:
            self._file_runs()

    def _file_runs(self) -> None:
        """Bucket every value of the gathered runs, vectorised."""
        if not self._runs:
            return
        first, slope, count, times = (np.array(col) for col in zip(*self._runs))
        self._runs.clear()
        self._pending = 0
        run = np.repeat(np.arange(len(count)), count)
        step = np.arange(len(run)) - np.repeat(np.cumsum(count) - count, count)
        values = first[run] + slope[run] * step
        buckets = np.where(values > 0, np.floor(np.log(np.maximum(values, 1e-300)) / _LOG_BASE), -(10**9))
        uniq, where = np.unique(buckets.astype(np.int64), return_inverse=True)
        c = self._counts
        for b, n in zip(uniq.tolist(), np.bincount(where, weights=times[run]).tolist()):
            c[b] = c.get(b, 0) + int(n)

    def buckets(self) -> dict[int, int]:
        """Samples per log bucket (``floor(ln(seconds) / ln(1.001))``)."""
        self._file_runs()
        return self._counts

    def merge(self, other: LatencyHistogram) -> None:
        for b, n in other.buckets().items():
            self._counts[b] = self._counts.get(b, 0) + n
        self.total += other.total
        self.count += other.count

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def quantile(self, q: float) -> float:
        """The q-quantile (nearest rank), as its bucket's geometric centre."""
        if not self.count:
            return float("nan")
        self._file_runs()
        buckets = sorted(self._counts)
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for b in buckets:
            seen += self._counts[b]
            if seen >= rank:
                return math.exp((b + 0.5) * _LOG_BASE)
        return math.exp((buckets[-1] + 0.5) * _LOG_BASE)
