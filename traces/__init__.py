"""Request records, trace loaders and workload generators.

This package imports nothing from the rest of kvsim: a trace is a stream of
:class:`~traces.request.Request` records sorted by arrival time.
"""

from traces.errors import TraceError
from traces.request import Request

__all__ = ["Request", "TraceError"]
