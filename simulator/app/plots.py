"""Plots users look at (matplotlib, Agg backend): memory timelines and breakdowns, batched
requests per system, normalized latency vs request rate with the sustainable rate marked,
block-size sweeps, swap vs recompute.

Every figure is written as PNG (for a glance) and, on request, SVG (for papers and slides):
pass ``formats=("png", "svg")``; the other files sit next to ``path`` with their own suffix.
Axis labels carry units; systems keep one color across the figures of a sweep when the same
ordered list of system names is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kvsim.simulator.engine.memory_classes import CLASSES  # noqa: E402
from kvsim.simulator.outputs import atomic_write  # noqa: E402

CLASS_LABELS = {
    "token_states": "token states",
    "reserved": "reserved",
    "internal_frag": "internal fragmentation",
    "allocator_frag": "allocator rounding (buddy)",
    "external_frag": "external fragmentation",
    "stranded_free": "free, request waiting (& others)",
    "idle_free": "free, nothing waiting",
}
CLASS_COLORS = {
    "token_states": "#2a9d8f",
    "reserved": "#e9c46a",
    "internal_frag": "#e76f51",
    "allocator_frag": "#bc6c25",
    "external_frag": "#9b2226",
    "stranded_free": "#adb5bd",
    "idle_free": "#e9ecef",
}


# One look for every figure: no top/right frame, a light grid, legends without a box.
STYLE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "legend.frameon": False,
    "legend.fontsize": 8,
    "font.size": 9,
    "savefig.facecolor": "white",
    "svg.fonttype": "none",  # SVG text stays text: searchable, editable in a paper's figure
}

# Okabe-Ito: distinguishable with the common kinds of color blindness.
SYSTEM_COLORS = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#000000",
    "#F0E442",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def system_color(i: int) -> str:
    return SYSTEM_COLORS[i % len(SYSTEM_COLORS)]


def _system_line(ax, x, y, i: int, name: str) -> None:
    """One system's line: the i-th colour and marker, so a system looks the same in every figure."""
    ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], ms=4, lw=1.8, color=system_color(i), label=name)


def _save(fig, path: Path, formats: Sequence[str] | None = None) -> Path:
    """Write ``path``, or with ``formats`` one file per format next to it (the suffix
    replaced); return ``path``'s own file (the first one written if its suffix is not in
    ``formats``). Each file is drawn under a temporary name and renamed into place: a figure
    is whole or the old one; the caller has claimed the folder (:mod:`simulator.outputs`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    targets = _paths(path, formats) if formats else [path]
    for target in targets:
        with atomic_write(target) as tmp:
            fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path if path in targets else targets[0]


def _finish_axes(ax, x_label: str, y_label: str, title: str) -> None:
    """The last touches of a one-panel plot of quantities that start at zero (savings, times):
    axis labels, the y axis from 0 (so that ratios between curves read true), the title and
    the legend where it hides the least."""
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="best")


def _paths(path: Path, formats: Sequence[str]) -> list[Path]:
    return [Path(path).with_suffix(f".{f}") for f in formats]


def plot_memory_timeline(
    steps: pd.DataFrame,
    capacity_slots: int,
    path: Path,
    title: str = "",
    replica: int = 0,
    max_points: int = 4000,
    formats: Sequence[str] | None = None,
) -> Path:
    """Stacked share of KV capacity per memory class over simulated time (one replica)."""
    df = steps[steps["replica"] == replica] if "replica" in steps else steps
    if len(df) > max_points:  # keep the figure light: sample steps evenly
        df = df.iloc[np.linspace(0, len(df) - 1, max_points).astype(int)]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.grid(False)
        t = df["start_s"].to_numpy()
        ys = [df[c].to_numpy() / capacity_slots * 100 for c in CLASSES]
        ax.stackplot(
            t,
            ys,
            labels=[CLASS_LABELS[c] for c in CLASSES],
            colors=[CLASS_COLORS[c] for c in CLASSES],
            step="post",
        )
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("share of KV cache (%)")
        ax.set_ylim(0, 100)
        if len(t):
            ax.set_xlim(t[0], t[-1])
        ax.set_title(title or "KV cache memory over time")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
        return _save(fig, path, formats)


def plot_memory_breakdown(
    rows: dict[str, dict],
    path: Path,
    title: str = "KV cache usage by system",
    formats: Sequence[str] | None = None,
) -> Path:
    """Stacked horizontal bars of time-weighted memory classes, one bar per system.

    ``rows`` maps a system label to a summary dict (``mem_<class>_perc`` keys).
    """
    labels = list(rows)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.8))
        ax.grid(axis="y", visible=False)
        left = np.zeros(len(labels))
        for c in CLASSES:
            vals = np.array([rows[k].get(f"mem_{c}_perc", 0.0) for k in labels], dtype=float)
            vals = np.nan_to_num(vals)
            ax.barh(
                labels,
                vals,
                left=left,
                color=CLASS_COLORS[c],
                label=CLASS_LABELS[c],
                edgecolor="white",
            )
            for i, v in enumerate(vals):
                if v >= 6:
                    dark = c in ("token_states", "external_frag")
                    ax.text(
                        left[i] + v / 2,
                        i,
                        f"{v:.0f}%",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if dark else "black",
                    )
            left += vals
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of KV cache, time-weighted (%)")
        ax.invert_yaxis()
        ax.set_title(title)
        ax.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(labels) + 3)),
            ncol=3,
            fontsize=8,
            frameon=False,
        )
        return _save(fig, path, formats)


def plot_batched_requests(
    values: Mapping[str, float],
    path: Path,
    title: str = "Mean batched requests by system",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """One horizontal bar per system: requests in a batch, time-weighted over busy time.

    More requests per batch is the throughput lever of better KV memory management
    (the vLLM paper's Fig. 13).
    """
    labels = list(values)
    vals = np.nan_to_num(np.array([values[k] for k in labels], dtype=float))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(labels) + 1.4))
        ax.grid(axis="y", visible=False)
        bars = ax.barh(labels, vals, color=[system_color(i) for i in range(len(labels))])
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in vals], padding=3, fontsize=8)
        ax.set_xlabel("mean batched requests (requests per iteration, time-weighted)")
        ax.set_xlim(0, max(vals.max(initial=0) * 1.15, 1))
        ax.invert_yaxis()
        ax.set_title(title)
        _save(fig, path, formats)
    return _paths(path, formats)


def _rate_top(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
              threshold: float | None) -> float:
    """The y-axis top of a latency-vs-rate plot: past the knee latency explodes, so the axis
    stops at a few times the threshold and lines leave the top, as in the paper."""
    ymax = 0.0
    for _, lat in curves.values():
        y = np.asarray(lat, float)
        ymax = max(ymax, y[np.isfinite(y)].max(initial=0.0))
    top = ymax * 1.08 if ymax > 0 else 1.0
    if threshold is not None:
        top = min(top, 4 * threshold) if ymax > 4 * threshold else max(top, 1.25 * threshold)
    return top


def _draw_rate_axes(ax, curves, colors: Mapping[str, int], sustainable, threshold, at_least,
                    unit: str, top: float, x_max: float | None, paper_x_max: float | None,
                    paper_label: str) -> None:
    """One latency-vs-rate panel: a line per system (its colour from ``colors``), the bound,
    each sustainable rate as a dotted line with its value, the x axis to ``x_max`` and the
    end of the paper's own axis (``paper_x_max``) as a grey dash-dot line."""
    for name, (rates, lat) in curves.items():
        order = np.argsort(np.asarray(rates, float))
        _system_line(ax, np.asarray(rates, float)[order], np.asarray(lat, float)[order],
                     colors[name], name)
    if threshold is not None:
        ax.axhline(threshold, ls="--", lw=1, color="0.4", label=f"bound ({threshold:g} s/token)")
    ax.set_ylim(0, top)
    ax.set_xlim(left=0)
    if x_max is not None:
        ax.set_xlim(0, x_max)
    if paper_x_max is not None:
        ax.axvline(paper_x_max, ls="-.", lw=1, color="0.55", label=paper_label)
    x_right = ax.get_xlim()[1]
    for k, name in enumerate(curves):
        rate = sustainable.get(name)
        if rate is None or not math.isfinite(rate):
            continue
        i = colors[name]
        ax.axvline(rate, ls=":", lw=1.6, color=system_color(i))
        right = rate > 0.7 * x_right  # keep the label inside the axes
        ax.annotate(
            f"{'≥ ' if name in at_least else ''}{rate:.3g}{unit}",
            xy=(min(rate, x_right), top),
            xytext=(-3 if right else 3, -4 - 12 * (k % 5)),
            textcoords="offset points",
            ha="right" if right else "left",
            va="top",
            fontsize=8,
            color=system_color(i),
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
        )


def plot_latency_vs_rate(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    sustainable: Mapping[str, float | None] | None = None,
    threshold: float | None = None,
    rate_label: str = "request rate (req/s)",
    title: str = "Normalized latency vs request rate",
    at_least: Sequence[str] = (),
    formats: Sequence[str] = ("png", "svg"),
    x_max: float | None = None,
    paper_x_max: float | None = None,
    paper_label: str = "end of the paper's axis",
) -> list[Path]:
    """Normalized latency (s/token) against the rate, one line per system (the vLLM paper's
    Fig. 12), each system's sustainable rate marked by a dotted vertical line and labelled.

    ``curves`` maps a system to (rates, normalized latencies); ``threshold`` (s/token) is
    drawn as a dashed line; systems in ``at_least`` met the bound at the highest rate tried,
    so their mark reads ">= rate". Past the knee latency explodes, so the y-axis stops at a
    few times the threshold and lines leave the top, as in the paper. ``x_max`` ends the x
    axis (default: the highest rate drawn; rates past it are clipped); ``paper_x_max`` marks
    where the paper's own axis ends.
    """
    sustainable = sustainable or {}
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        _draw_rate_axes(ax, curves, {name: i for i, name in enumerate(curves)}, sustainable,
                        threshold, at_least, " req/s" if "req/s" in rate_label else "",
                        _rate_top(curves, threshold), x_max, paper_x_max, paper_label)
        ax.set_xlabel(rate_label)
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(title)
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            title="system\n(dotted: sustainable rate)",
            title_fontsize=8,
            alignment="left",
        )
        _save(fig, path, formats)
    return _paths(path, formats)


def plot_latency_vs_rate_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    sustainable: Mapping[str, Mapping[str, float | None]] | None = None,
    threshold: float | None = None,
    rate_label: str = "request rate (req/s)",
    title: str = "Normalized latency vs request rate",
    at_least: Mapping[str, Sequence[str]] | None = None,
    x_max: Mapping[str, float | None] | None = None,
    paper_x_max: Mapping[str, float | None] | None = None,
    paper_label: str = "end of the paper's axis",
    formats: Sequence[str] = ("png", "svg"),
    order: Sequence[str] = (),
) -> list[Path]:
    """Small multiples of :func:`plot_latency_vs_rate`: one panel per key of ``panels`` (a
    grid value: samples, beam width, prefix), each with its own rate axis, one y axis, one
    colour per system across panels and one legend outside (the vLLM paper's Fig. 14, 16).
    The other arguments are as for :func:`plot_latency_vs_rate`, keyed by panel; ``order``
    lists systems first, so that a system's colour is its place in it (as in a figure of all
    of them)."""
    sustainable, at_least = sustainable or {}, at_least or {}
    x_max, paper_x_max = x_max or {}, paper_x_max or {}
    systems = list(dict.fromkeys([*order, *(n for curves in panels.values() for n in curves)]))
    colors = {name: i for i, name in enumerate(systems)}
    top = max((_rate_top(c, threshold) for c in panels.values()), default=1.0)
    n = len(panels)
    cols = n if n <= 3 else 2 if n == 4 else 3
    rows = -(-n // cols)
    unit = " req/s" if "req/s" in rate_label else ""
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 1.8, 3.0 * rows + 0.6),
                                 sharey=True, squeeze=False)
        for ax, (panel, curves) in zip(axes.flat, panels.items()):
            _draw_rate_axes(ax, curves, colors, sustainable.get(panel, {}), threshold,
                            at_least.get(panel, ()), unit, top, x_max.get(panel),
                            paper_x_max.get(panel), paper_label)
            ax.set_title(panel, fontsize=10)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel(rate_label)
        for ax in axes[:, 0]:
            ax.set_ylabel("normalized latency (s/token)")
        handles: dict = {}
        for ax in axes.flat[:n]:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        labels = list(handles)
        fig.legend([handles[k] for k in labels], labels, loc="upper left",
                   bbox_to_anchor=(1.0, 0.93), title="system\n(dotted: sustainable rate)",
                   title_fontsize=8, alignment="left")
        fig.suptitle(title, fontweight="bold", fontsize=11)
        fig.tight_layout()
        _save(fig, path, formats)
    return _paths(path, formats)


def plot_block_size_sweep(
    curves: Mapping[str, pd.DataFrame],
    path: Path,
    block_col: str = "allocator.block_size",
    title: str = "Block size",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Three panels against the block size (tokens, log2 axis), one line per system:
    normalized latency (s/token), output throughput (tokens/s) and internal fragmentation
    (% of KV cache). Small blocks cost kernel efficiency, large ones waste memory in the
    last block of each sequence (the vLLM paper's Fig. 18).

    ``curves`` maps a system to a summary table with a ``block_col`` column.
    """
    panels = (
        ("normalized_latency_s_per_token", "normalized latency (s/token)"),
        ("output_throughput", "output throughput (tokens/s)"),
        ("mem_internal_frag_perc", "internal fragmentation (% of KV cache)"),
    )
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.9))
        ticks: set[int] = set()
        for i, (name, df) in enumerate(curves.items()):
            df = df.sort_values(block_col)
            x = df[block_col].to_numpy(float)
            ticks.update(int(v) for v in x)
            for ax, (col, _) in zip(axes, panels):
                y = df[col].to_numpy(float) if col in df else np.full(len(x), np.nan)
                _system_line(ax, x, y, i, name)
        for ax, (_, label) in zip(axes, panels):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks))
            ax.set_xticklabels([str(t) for t in sorted(ticks)])
            ax.minorticks_off()
            ax.set_xlabel("block size (tokens)")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
        if len(curves) > 1:
            axes[0].legend(loc="best")
        fig.suptitle(title, fontweight="bold")
        fig.tight_layout()
        _save(fig, path, formats)
    return _paths(path, formats)


PREEMPTION_TIME_COLUMNS = ("swap_time_s", "recompute_time_s")


def preemption_time_s(df: pd.DataFrame, name: str = "") -> np.ndarray:
    """Seconds spent on preemption per row: ``swap_time_s + recompute_time_s`` (a missing one
    of the two counts 0). A table with neither column is an error, not a line of zeros: a
    flat line at 0 would read as "preemption cost nothing"."""
    present = [c for c in PREEMPTION_TIME_COLUMNS if c in df]
    if not present:
        raise ValueError(
            f"{name or 'table'}: no {' or '.join(PREEMPTION_TIME_COLUMNS)} column to plot "
            f"(columns: {', '.join(map(str, df.columns))})"
        )
    return sum(np.nan_to_num(df[c].to_numpy(float)) for c in present)


def plot_swap_vs_recompute(
    curves: Mapping[str, pd.DataFrame],
    path: Path,
    x_col: str | None = None,
    x_label: str = "",
    title: str = "Swap vs recompute",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Preemption by swapping vs by recomputation (the vLLM paper's Fig. 19).

    Left: normalized latency (s/token); right: time the engine spent on preemption
    (s: PCIe transfers for swap, prefill redone for recompute). ``curves`` maps a mode
    (or a system) to a summary table; with ``x_col`` (e.g. the block size) each is a line
    against it, else each is a bar.
    """
    names = list(curves)
    for n in names:  # each table must say what preemption cost (no silent zeros)
        preemption_time_s(curves[n], n)
    with plt.rc_context(STYLE):
        fig, (ax_l, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
        if x_col is None:
            lat = [float(curves[n]["normalized_latency_s_per_token"].mean()) for n in names]
            swap = [float(curves[n].get("swap_time_s", pd.Series([0.0])).mean()) for n in names]
            rec = [float(curves[n].get("recompute_time_s", pd.Series([0.0])).mean()) for n in names]
            colors = [system_color(i) for i in range(len(names))]
            bars = ax_l.bar(names, np.nan_to_num(lat), color=colors)
            ax_l.bar_label(bars, labels=[f"{v:.3g}" for v in lat], fontsize=8, padding=2)
            ax_r.bar(names, np.nan_to_num(swap), color="#56B4E9", label="swap transfers")
            ax_r.bar(
                names,
                np.nan_to_num(rec),
                bottom=np.nan_to_num(swap),
                color="#E69F00",
                label="recomputation",
            )
            ax_r.legend(loc="upper right")
            for ax in (ax_l, ax_r):
                ax.grid(axis="x", visible=False)
        else:
            ticks: set = set()
            for i, n in enumerate(names):
                df = curves[n].sort_values(x_col)
                x = df[x_col].to_numpy(float)
                ticks.update(x.tolist())
                c, m = system_color(i), MARKERS[i % len(MARKERS)]
                ax_l.plot(
                    x,
                    df["normalized_latency_s_per_token"],
                    marker=m,
                    ms=4,
                    lw=1.8,
                    color=c,
                    label=n,
                )
                ax_r.plot(x, preemption_time_s(df, n), marker=m, ms=4, lw=1.8, color=c, label=n)
            for ax in (ax_l, ax_r):
                if x_col.endswith("block_size"):
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(sorted(ticks))
                    ax.set_xticklabels([f"{t:g}" for t in sorted(ticks)])
                    ax.minorticks_off()
                ax.set_xlabel(x_label or x_col)
            ax_l.legend(loc="best")
        ax_l.set_ylabel("normalized latency (s/token)")
        ax_r.set_ylabel("time spent on preemption (s)")
        ax_l.set_ylim(bottom=0)
        ax_r.set_ylim(bottom=0)
        fig.suptitle(title, fontweight="bold")
        fig.tight_layout()
        _save(fig, path, formats)
    return _paths(path, formats)


def plot_memory_saving(
    curves: Mapping[str, pd.DataFrame],
    path: Path,
    x_col: str,
    x_label: str,
    paper_range: tuple[float, float] | None = None,
    title: str = "Memory saving from sharing",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """``memory_saving_perc`` (% of the blocks a run would hold without sharing) against the
    number of samples or beams, one line per system, with the paper's range shaded (the
    vLLM paper's Fig. 15)."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ticks: set[float] = set()
        for i, (name, df) in enumerate(curves.items()):
            df = df.sort_values(x_col)
            x = df[x_col].to_numpy(float)
            ticks.update(x.tolist())
            _system_line(ax, x, df["memory_saving_perc"].to_numpy(float), i, name)
        if paper_range is not None:
            ax.axhspan(*paper_range, color="0.85", zorder=0, label="paper's range")
        ax.set_xticks(sorted(ticks))
        _finish_axes(ax, x_label, "memory saving (% of blocks without sharing)", title)
        _save(fig, path, formats)
    return _paths(path, formats)


def plot_swap_microbenchmark(
    micro: pd.DataFrame,
    path: Path,
    title: str = "Moving a sequence's KV: swap vs recompute",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Milliseconds to swap a sequence's KV out and back in, and to recompute it, against the
    block size (log2 axis): the vLLM paper's Fig. 19a. ``micro`` has ``block_size``,
    ``swap_out_and_in_ms`` and ``recompute_ms`` columns."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        x = micro["block_size"].to_numpy(float)
        for i, (col, name) in enumerate(
            (("swap_out_and_in_ms", "swap out + in"), ("recompute_ms", "recompute"))
        ):
            _system_line(ax, x, micro[col].to_numpy(float), i, name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:g}" for v in x])
        ax.minorticks_off()
        _finish_axes(ax, "block size (tokens)", "time (ms)", title)
        _save(fig, path, formats)
    return _paths(path, formats)



TTFT_PARTS = (
    ("mean_ttft_queue_ms", "queueing", "#adb5bd"),
    ("mean_ttft_load_ms", "load wait", "#56B4E9"),
    ("mean_ttft_prefill_ms", "prefill", "#E69F00"),
)
"""The TTFT split of a run with cache tiers (summary columns, ms), bottom to top."""

DASHES = ("-", "--", ":", "-.")


def _policy_styles(keys: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[int, str]]:
    """A policy key ``(first, *rest)`` -> (colour index, line style): one colour per distinct
    first part (the eviction policy), one dash per distinct rest (the write policy), so a
    12-line figure stays readable with 4 colours x 3 dashes."""
    firsts = list(dict.fromkeys(k[0] for k in keys))
    rests = list(dict.fromkeys(k[1:] for k in keys))
    return {k: (firsts.index(k[0]), DASHES[rests.index(k[1:]) % len(DASHES)]) for k in keys}


def _size_axis(ax, sizes: Sequence[float], label: str) -> None:
    """Tier sizes from 0 to far beyond the working set: linear near 0, logarithmic above the
    smallest non-zero size, a tick at every size swept."""
    positive = [s for s in sizes if s > 0]
    if positive:
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.6)
    labels = [f"{s:g}" for s in sorted(sizes)]
    crowded = len(labels) > 5 and max(map(len, labels)) > 3  # 1024, 2048, ... would touch
    ax.set_xticks(sorted(sizes))
    ax.set_xticklabels(labels, rotation=45 if crowded else 0, ha="right" if crowded else "center")
    ax.minorticks_off()
    ax.set_xlabel(label)


def tier_sweep_figure(
    curves: Mapping[tuple[str, ...], pd.DataFrame],
    size_col: str,
    tiers: Sequence[str],
    size_label: str = "CPU tier size (GiB)",
    title: str = "Cache tiers",
):
    """The cache-tier sweep as a matplotlib figure (``plot_tier_sweep`` writes it).

    ``curves`` maps a policy, a tuple such as ``("lru", "write-back")``, to its sweep rows
    (summary columns and ``size_col``). Top row, against the tier size, one line per policy:
    the GPU prefix cache's hit ratio (``prefix_cache_hit_ratio``), each tier's
    (``tier_<name>_hit_ratio``: blocks it served over the GPU's lookups, so the panels add up
    to the share of prefix blocks not recomputed), mean TTFT (ms) and output throughput
    (tokens/s): where the lines go flat, more tier stops paying. Bottom: mean TTFT split
    into queueing, load wait and prefill (ms), stacked, one bar per policy at each size, in
    legend order: whether a bigger tier saves prefill time, or only moves it into load waits.
    """
    styles = _policy_styles(list(curves))
    sizes = sorted({float(s) for df in curves.values() for s in df[size_col]})
    panels = [("prefix_cache_hit_ratio", "GPU prefix-cache hit ratio")]
    panels += [(f"tier_{t}_hit_ratio", f"{t} tier hit ratio") for t in tiers]
    panels += [("mean_ttft_ms", "mean TTFT (ms)"), ("output_throughput", "output throughput (tokens/s)")]
    with plt.rc_context(STYLE):
        fig = plt.figure(figsize=(3.4 * len(panels) + 2.2, 7.6))
        grid = fig.add_gridspec(2, len(panels), height_ratios=(1, 1.05), hspace=0.42, wspace=0.32)
        top = [fig.add_subplot(grid[0, i]) for i in range(len(panels))]
        for key, df in curves.items():
            df = df.sort_values(size_col)
            x = df[size_col].to_numpy(float)
            color, dash = styles[key]
            for ax, (col, _) in zip(top, panels):
                y = df[col].to_numpy(float) if col in df else np.full(len(x), np.nan)
                ax.plot(x, y, ls=dash, marker=MARKERS[color % len(MARKERS)], ms=3.5, lw=1.5,
                        color=system_color(color), label=", ".join(key))
        for ax, (col, label) in zip(top, panels):
            _size_axis(ax, sizes, size_label)
            ax.set_ylabel(label)
            if col.endswith("hit_ratio"):
                ax.set_ylim(0, 1)
            else:
                ax.set_ylim(bottom=0)
        top[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.02), title="policy")
        split = fig.add_subplot(grid[1, :])
        split.grid(axis="x", visible=False)
        n = len(curves)
        width = 0.8 / max(n, 1)
        for j, (key, df) in enumerate(curves.items()):
            rows = df.set_index(df[size_col].astype(float))
            x = np.array([sizes.index(s) for s in rows.index], float) - 0.4 + width * (j + 0.5)
            bottom = np.zeros(len(x))
            for col, label, fill in TTFT_PARTS:
                h = np.nan_to_num(rows[col].to_numpy(float)) if col in rows else np.zeros(len(x))
                split.bar(x, h, width * 0.92, bottom=bottom, color=fill,
                          edgecolor=system_color(styles[key][0]), linewidth=0.8,
                          label=label if j == 0 else None)
                bottom += h
        split.set_xticks(range(len(sizes)))
        split.set_xticklabels([f"{s:g}" for s in sizes])
        split.set_xlabel(f"{size_label}; one bar per policy, in legend order (edge: its colour)")
        split.set_ylabel("mean TTFT split (ms)")
        split.legend(loc="upper left", bbox_to_anchor=(1.005, 1), title="TTFT part")
        fig.suptitle(title, fontweight="bold")
    return fig


def plot_tier_sweep(
    curves: Mapping[tuple[str, ...], pd.DataFrame],
    path: Path,
    size_col: str,
    tiers: Sequence[str],
    size_label: str = "CPU tier size (GiB)",
    title: str = "Cache tiers",
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Write :func:`tier_sweep_figure` (hit ratios, TTFT and throughput against the tier size,
    one line per policy; the TTFT split) to ``path`` in each of ``formats``."""
    with plt.rc_context(STYLE):
        _save(tier_sweep_figure(curves, size_col, tiers, size_label, title), path, formats)
    return _paths(path, formats)
