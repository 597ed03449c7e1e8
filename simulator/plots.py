"""Plots users look at: memory timelines and breakdowns (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from simulator.memory_classes import CLASSES  # noqa: E402

CLASS_LABELS = {
    "token_states": "token states",
    "reserved": "reserved",
    "internal_frag": "internal fragmentation",
    "external_frag": "external fragmentation",
    "stranded_free": "free, request waiting (& others)",
    "idle_free": "free, nothing waiting",
}
CLASS_COLORS = {
    "token_states": "#2a9d8f",
    "reserved": "#e9c46a",
    "internal_frag": "#e76f51",
    "external_frag": "#9b2226",
    "stranded_free": "#adb5bd",
    "idle_free": "#e9ecef",
}


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_memory_timeline(steps: pd.DataFrame, capacity_slots: int, path: Path, title: str = "",
                         replica: int = 0, max_points: int = 4000) -> Path:
    """Stacked share of KV capacity per memory class over simulated time (one replica)."""
    df = steps[steps["replica"] == replica] if "replica" in steps else steps
    if len(df) > max_points:  # keep the figure light: sample steps evenly
        df = df.iloc[np.linspace(0, len(df) - 1, max_points).astype(int)]
    fig, ax = plt.subplots(figsize=(9, 4))
    t = df["start_s"].to_numpy()
    ys = [df[c].to_numpy() / capacity_slots * 100 for c in CLASSES]
    ax.stackplot(t, ys, labels=[CLASS_LABELS[c] for c in CLASSES], colors=[CLASS_COLORS[c] for c in CLASSES],
                 step="post")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("share of KV cache (%)")
    ax.set_ylim(0, 100)
    if len(t):
        ax.set_xlim(t[0], t[-1])
    ax.set_title(title or "KV cache memory over time")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return _save(fig, path)


def plot_memory_breakdown(rows: dict[str, dict], path: Path, title: str = "KV cache usage by system") -> Path:
    """Stacked horizontal bars of time-weighted memory classes, one bar per system.

    ``rows`` maps a system label to a summary dict (``mem_<class>_perc`` keys).
    """
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(labels) + 1.5))
    left = np.zeros(len(labels))
    for c in CLASSES:
        vals = np.array([rows[k].get(f"mem_{c}_perc", 0.0) for k in labels])
        ax.barh(labels, vals, left=left, color=CLASS_COLORS[c], label=CLASS_LABELS[c], edgecolor="white")
        for i, v in enumerate(vals):
            if v >= 6:
                ax.text(left[i] + v / 2, i, f"{v:.0f}%", ha="center", va="center", fontsize=8)
        left += vals
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of KV cache, time-weighted (%)")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=8, frameon=False)
    return _save(fig, path)
