"""Generate a synthetic trace: an arrival process plus a length sampler.

Randomness comes in chunks (4096 draws by default) but requests are yielded one
at a time, so a million-request workload streams in bounded memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from kvsim.traces.arrivals import ArrivalProcess
from kvsim.traces.lengths import LengthSampler
from kvsim.traces.request import Request


def generate_requests(
    arrivals: ArrivalProcess,
    lengths: LengthSampler,
    *,
    seed: int | np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
    chunk_size: int = 4096,
) -> Iterator[Request]:
    """Requests 0, 1, 2, ... with the first arriving at t = 0 s.

    Stops after ``num_requests`` requests or at the first arrival at or after
    ``duration_s`` seconds, whichever comes first (at least one must be given).
    Arrivals and lengths draw from two independent child streams of ``seed``, so
    changing the length distribution leaves the arrival times unchanged and vice
    versa (common random numbers across experiments).
    """
    if num_requests is None and duration_s is None:
        raise ValueError("give num_requests and/or duration_s, or the trace never ends")
    if num_requests is not None and (
        isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1
    ):
        raise ValueError(f"num_requests must be an integer >= 1; got {num_requests!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0; got {duration_s!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    if isinstance(seed, np.random.Generator):
        arrival_rng, length_rng = seed.spawn(2)
    else:
        arrival_rng, length_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
        )
    limit = math.inf if num_requests is None else num_requests
    end = math.inf if duration_s is None else duration_s
    return _stream(arrivals, lengths, arrival_rng, length_rng, limit, end, chunk_size)


def _stream(arrivals, lengths, arrival_rng, length_rng, limit, end, chunk_size):
    request_id, clock = 0, 0.0  # clock: arrival time of the next request (s)
    while request_id < limit:
        size = int(min(chunk_size, limit - request_id))
        gaps = arrivals.gaps(arrival_rng, size)
        after = clock + np.cumsum(gaps)  # arrival time of the request after each one
        times = np.concatenate(([clock], after[:-1]))
        clock = float(after[-1])
        prompts, outputs = lengths.sample(length_rng, size)
        for time, prompt, output in zip(times.tolist(), prompts.tolist(), outputs.tolist()):
            if time >= end:
                return
            yield Request(request_id, time, prompt, output)
            request_id += 1
