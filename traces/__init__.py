"""Request records, trace loaders and workload generators.

This package imports nothing from the rest of kvsim: a trace is a stream of
:class:`~traces.request.Request` records sorted by arrival time, numbered
0, 1, 2, ..., with times in seconds from the first request.

* read a file: :func:`load_trace` (format ``auto``, ``azure``, ``mooncake``,
  ``vidur``, ``token-ids``: prompts with their token ids), :func:`read_generic` (your column names and time unit),
  :func:`load_length_pool` (lengths only);
* generate one: :func:`generate_requests` with an arrival process
  (:mod:`traces.arrivals`) and a length sampler (:mod:`traces.lengths`,
  :func:`preset_lengths` for the vLLM paper's ShareGPT and Alpaca workloads);
* reshape it: :mod:`traces.transforms`, :func:`sharegpt_filter`;
* describe it: :func:`trace_stats`, :func:`traces.plots.plot_trace`.
"""

if __name__ != "kvsim.traces":  # one module object per file: never both traces.x and kvsim.traces.x
    raise ImportError(f"import kvsim.traces, not {__name__}: the repository's folders install as the kvsim package")

from kvsim.traces.arrivals import ConstantArrivals, GammaArrivals, PoissonArrivals, make_arrivals
from kvsim.traces.data_files import DATA_DIR, data_path, shipped_files
from kvsim.traces.errors import TraceError, TraceWarning
from kvsim.traces.formats import (
    AZURE,
    LENGTHS,
    MOONCAKE,
    TOKEN_IDS,
    VIDUR,
    TraceFormat,
    detect_format,
)
from kvsim.traces.generate import generate_requests
from kvsim.traces.lengths import (
    DiscreteLengths,
    FilteredLengths,
    FixedLengths,
    LognormalLengths,
    PoolLengths,
    UniformLengths,
)
from kvsim.traces.loaders import (
    load_length_pool,
    load_trace,
    read_azure,
    read_generic,
    read_lengths,
    read_mooncake,
    read_token_ids,
    read_vidur,
)
from kvsim.traces.presets import PRESET_NAMES, preset_lengths
from kvsim.traces.request import Request
from kvsim.traces.sharegpt_filter import sharegpt_filter, sharegpt_keep
from kvsim.traces.stats import trace_stats
from kvsim.traces.transforms import (
    apply_sharing,
    clip_to_max_len,
    renumber,
    scale_rate,
    window_by_count,
    window_by_time,
)

__all__ = [
    "AZURE",
    "DATA_DIR",
    "LENGTHS",
    "MOONCAKE",
    "PRESET_NAMES",
    "TOKEN_IDS",
    "VIDUR",
    "ConstantArrivals",
    "DiscreteLengths",
    "FilteredLengths",
    "FixedLengths",
    "GammaArrivals",
    "LognormalLengths",
    "PoissonArrivals",
    "PoolLengths",
    "Request",
    "TraceError",
    "TraceFormat",
    "TraceWarning",
    "UniformLengths",
    "apply_sharing",
    "clip_to_max_len",
    "data_path",
    "detect_format",
    "generate_requests",
    "load_length_pool",
    "load_trace",
    "make_arrivals",
    "preset_lengths",
    "read_azure",
    "read_generic",
    "read_lengths",
    "read_mooncake",
    "read_token_ids",
    "read_vidur",
    "renumber",
    "scale_rate",
    "sharegpt_filter",
    "sharegpt_keep",
    "shipped_files",
    "trace_stats",
    "window_by_count",
    "window_by_time",
]
