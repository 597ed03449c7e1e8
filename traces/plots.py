"""Pictures of a trace: arrivals over time and the length histograms."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from kvsim.traces.request import Request


def plot_trace(requests: Iterable[Request], out_path: str | Path, *, title: str = "") -> Path:
    """Write :func:`trace_figure` to ``out_path`` (PNG) and return the path."""
    out_path = Path(out_path)
    trace_figure(requests, title=title).savefig(out_path, dpi=100)
    return out_path


def trace_figure(requests: Iterable[Request], *, title: str = ""):
    """A matplotlib Figure with three panels: arrivals per time bin (requests/s against
    seconds since the first request), and histograms of prompt and output lengths
    (tokens, log-scaled count axis). A trace whose requests all arrive at t = 0
    (a lengths-only file) gets a note instead of the arrivals panel."""
    # A bare Figure renders with the Agg canvas and leaves pyplot's global state
    # (e.g. a notebook's backend) alone.
    from matplotlib.figure import Figure

    columns = (array("d"), array("q"), array("q"))  # 24 bytes a request
    for r in requests:
        columns[0].append(r.arrival_time)
        columns[1].append(r.prompt_tokens)
        columns[2].append(r.output_tokens)
    if not columns[0]:
        raise ValueError("cannot plot an empty trace")
    times, prompts, outputs = (np.asarray(column) for column in columns)
    fig = Figure(figsize=(15, 4), layout="constrained")
    ax_t, ax_p, ax_o = fig.subplots(1, 3)
    span = float(times.max() - times.min())
    if span > 0:
        bins = int(min(max(span, 1.0), 200))  # about 200 bins, never shorter than 1 s
        counts, edges = np.histogram(times, bins=bins)
        ax_t.stairs(counts / np.diff(edges), edges, fill=True)
        ax_t.set_xlabel("time since first request (s)")
        ax_t.set_ylabel(f"arrival rate (requests/s, {span / bins:.3g} s bins)")
        ax_t.set_title(f"{len(times)} arrivals, mean {(len(times) - 1) / span:.3g} req/s")
    else:
        ax_t.text(0.5, 0.5, "no arrival times\n(all requests at t = 0)", ha="center")
        ax_t.set_axis_off()
    for ax, values, label in ((ax_p, prompts, "prompt"), (ax_o, outputs, "output")):
        ax.hist(values, bins=60)
        ax.set_yscale("log")
        ax.set_xlabel(f"{label} length (tokens)")
        ax.set_ylabel("requests")
        ax.set_title(f"{label}: mean {values.mean():.1f}, median {np.median(values):.0f} tokens")
    if title:
        fig.suptitle(title)
    return fig
