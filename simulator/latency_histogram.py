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
    """Counts of latencies (seconds) by log bucket, plus their exact sum."""

    __slots__ = ("_counts", "total", "count")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.total = 0.0  # seconds, sum of all samples
        self.count = 0

    def add(self, seconds: float, times: int = 1) -> None:
        """Record ``times`` samples equal to ``seconds``."""
        b = math.floor(math.log(seconds) / _LOG_BASE) if seconds > 0 else -(10**9)
        c = self._counts
        c[b] = c.get(b, 0) + times
        self.total += seconds * times
        self.count += times

    def add_many(self, seconds: np.ndarray, times: int = 1) -> None:
        """Record each value of ``seconds`` ``times`` times (vectorised)."""
        if len(seconds) == 0:
            return
        first, last = float(seconds[0]), float(seconds[-1])
        if 0 < first <= last and (len(seconds) < 3 or np.all(seconds[1:] >= seconds[:-1])):
            # A run's gaps only grow: cut the sorted values at the bucket edges they span.
            b0 = math.floor(math.log(first) / _LOG_BASE)
            b1 = math.floor(math.log(last) / _LOG_BASE)
            if b0 == b1:
                counts = [len(seconds)]
            else:
                edges = np.exp(np.arange(b0 + 1, b1 + 1) * _LOG_BASE)
                cuts = np.searchsorted(seconds, edges, side="left")
                counts = np.diff(np.concatenate(([0], cuts, [len(seconds)]))).tolist()
            c = self._counts
            for b, n in zip(range(b0, b1 + 1), counts):
                if n:
                    c[b] = c.get(b, 0) + n * times
            self.total += float(seconds.sum()) * times
            self.count += len(seconds) * times
            return
        buckets = np.floor(np.log(np.maximum(seconds, 1e-300)) / _LOG_BASE).astype(np.int64)
        uniq, counts = np.unique(buckets, return_counts=True)
        c = self._counts
        for b, n in zip(uniq.tolist(), counts.tolist()):
            c[b] = c.get(b, 0) + n * times
        self.total += float(seconds.sum()) * times
        self.count += len(seconds) * times

    def add_linear(self, first: float, slope: float, count: int, times: int = 1) -> None:
        """Record ``first + slope * i`` for i = 0..count-1, each ``times`` times: a run's
        gaps grow by a constant, so each bucket's share is cut at its edges in closed form."""
        if count <= 0:
            return
        last = first + slope * (count - 1)
        if first <= 0 or slope < 0:
            self.add_many(first + slope * np.arange(count, dtype=np.float64), times)
            return
        c = self._counts
        b = math.floor(math.log(first) / _LOG_BASE)
        b_last = math.floor(math.log(last) / _LOG_BASE)
        self.total += (count * first + slope * (count * (count - 1) / 2)) * times
        self.count += count * times
        if b == b_last:  # the whole run in one bucket (the common case)
            c[b] = c.get(b, 0) + count * times
            return
        done = 0  # values already filed
        if count < b_last - b:  # fewer values than buckets: file each value
            for i in range(count):
                v = math.floor(math.log(first + slope * i) / _LOG_BASE)
                c[v] = c.get(v, 0) + times
            b = b_last + 1
            done = count
        while b < b_last:
            edge = math.exp((b + 1) * _LOG_BASE)  # values below it belong to bucket b
            below = min(count, max(done, math.ceil((edge - first) / slope)))
            if below > done:
                c[b] = c.get(b, 0) + (below - done) * times
                done = below
            b += 1
        if done < count:
            c[b_last] = c.get(b_last, 0) + (count - done) * times

    def merge(self, other: LatencyHistogram) -> None:
        for b, n in other._counts.items():
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
        buckets = sorted(self._counts)
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for b in buckets:
            seen += self._counts[b]
            if seen >= rank:
                return math.exp((b + 0.5) * _LOG_BASE)
        return math.exp((buckets[-1] + 0.5) * _LOG_BASE)
