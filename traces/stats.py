"""Summary statistics of a trace (what ``kvsim trace stats`` prints)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from kvsim.traces.request import Request


def trace_stats(requests: Iterable[Request]) -> dict[str, float | int | None]:
    """Count, timing and length statistics of a request stream (read once).

    Keys (times in seconds, lengths in tokens; None where undefined):

    * ``count``; ``time_span_s`` from the first to the last arrival;
    * ``mean_rate_per_s`` = 1 / mean inter-arrival gap = (count - 1) / span, and
      ``interarrival_cv`` = std / mean of the gaps (1 for Poisson arrivals); both
      None when all requests arrive at once (e.g. a lengths-only file);
    * ``prompt_{mean,median,p99,max}`` and ``output_{mean,median,p99,max}``;
    * ``hash_blocks``: prefix-block ids in the trace, and ``ideal_prefix_hit_ratio``:
      the fraction of them already seen in an earlier request, i.e. the block hit
      ratio of an unbounded prefix cache; None when the trace has no hash ids.
    """
    times, prompts, outputs = array("d"), array("q"), array("q")
    seen: set[int] = set()
    blocks = hits = 0
    has_hashes = False
    for r in requests:
        times.append(r.arrival_time)
        prompts.append(r.prompt_tokens)
        outputs.append(r.output_tokens)
        if r.hash_ids is not None:
            has_hashes = True
            blocks += len(r.hash_ids)
            hits += sum(1 for h in r.hash_ids if h in seen)
            seen.update(r.hash_ids)
    stats: dict[str, float | int | None] = {"count": len(times)}
    if not times:
        return stats | dict.fromkeys(_KEYS[1:])
    t = np.frombuffer(times, dtype=np.float64)
    gaps = np.diff(t)
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    stats["time_span_s"] = float(t[-1] - t[0])
    stats["mean_rate_per_s"] = 1.0 / mean_gap if mean_gap > 0 else None
    stats["interarrival_cv"] = float(gaps.std()) / mean_gap if mean_gap > 0 else None
    for name, values in (("prompt", prompts), ("output", outputs)):
        v = np.frombuffer(values, dtype=np.int64)
        stats[f"{name}_mean"] = float(v.mean())
        stats[f"{name}_median"] = float(np.median(v))
        stats[f"{name}_p99"] = float(np.percentile(v, 99))
        stats[f"{name}_max"] = int(v.max())
    stats["hash_blocks"] = blocks if has_hashes else None
    stats["ideal_prefix_hit_ratio"] = hits / blocks if has_hashes and blocks else None
    return stats


_KEYS = (
    "count",
    "time_span_s",
    "mean_rate_per_s",
    "interarrival_cv",
    "prompt_mean",
    "prompt_median",
    "prompt_p99",
    "prompt_max",
    "output_mean",
    "output_median",
    "output_p99",
    "output_max",
    "hash_blocks",
    "ideal_prefix_hit_ratio",
)
