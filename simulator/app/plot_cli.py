"""``kvsim plot RESULTS``: draw what a sweep or a run folder holds, into ``RESULTS/plots/``.

A **sweep folder** (``sweep.parquet``, written by ``kvsim sweep``): the figures that apply,
chosen by which parameters vary among the successful runs:

* always: ``memory_breakdown`` (memory classes, stacked bars per system) and
  ``batched_requests`` (mean batched requests per system);
* a rate varies (``workload.arrivals.rate``, ``workload.rate_scale``, or a ``find_rate``
  search): ``latency_vs_rate``, one line per system, its sustainable rate marked (from
  ``rates.parquet`` after a search; otherwise the highest rate up to which every run met
  the search's bound, default 0.1 s/token). The bars above then compare the systems at the
  highest rate all of them ran (or, if there is none, at each one's sustainable rate);
* ``allocator.block_size`` varies: ``block_size`` (latency, throughput, internal
  fragmentation vs block size);
* ``preemption.mode`` varies: ``swap_vs_recompute``;
* a cache tier's size varies (``allocator.tiers.<i>.capacity_gib``): ``cache_tiers`` (hit
  ratio of the GPU cache and of each tier, mean TTFT and throughput against the tier size,
  one line per policy, and the TTFT split into queueing, load wait and prefill).

A **run folder** (``summary.json`` + ``steps.parquet``): ``memory_timeline``.

The figures folder (``RESULTS/plots`` or ``--out``) is a kvsim folder (:mod:`simulator.outputs`):
made with kvsim's marker, or refused if it is a folder of the user's; figures are replaced
whole. Each figure is written as PNG and SVG. A *system* is a run's ``label`` (when the sweep
has one) plus whatever else varies and is not the figure's x-axis.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from kvsim.simulator.app.rate_search import DEFAULT_MAX_NORMALIZED_LATENCY, SustainabilityCriterion
from kvsim.simulator.outputs import claim_folder

if TYPE_CHECKING:  # (imported where a table is read: the CLI's parser is built without pandas)
    import pandas as pd

FORMATS = ("png", "svg")
BLOCK_KEY = "allocator.block_size"
MODE_KEY = "preemption.mode"
RATE_KEYS = ("workload.arrivals.rate", "workload.rate_scale")
MAX_BARS = 40
TIER_SIZE_KEY = re.compile(r"^allocator\.tiers\.(\d+)\.capacity_gib$")


class PlotError(ValueError):
    """The folder holds nothing to plot; one line for the user."""


# --- reading a sweep folder ----------------------------------------------------------------


def load_results(sweep_dir: Path) -> tuple[pd.DataFrame, dict, pd.DataFrame | None]:
    """(sweep table, sweep.json metadata or {}, rates table or None)."""
    import pandas as pd

    sweep_dir = Path(sweep_dir)
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    meta_path = sweep_dir / "sweep.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    rates_path = sweep_dir / "rates.parquet"
    rates = pd.read_parquet(rates_path) if rates_path.is_file() else None
    return table, meta, rates


def _params(table: pd.DataFrame, meta: dict) -> list[str]:
    if meta.get("params") is not None:
        return [p for p in meta["params"] if p in table]
    cols = list(table.columns)  # fall back: the columns between `error` and the first metric
    start = cols.index("error") + 1 if "error" in cols else 0
    end = cols.index("num_requests") if "num_requests" in cols else len(cols)
    return cols[start:end]


def _distinct(series: pd.Series) -> int:
    return series.astype(str).nunique(dropna=False)


def varied(df: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """The keys taking more than one value in ``df``."""
    return [k for k in keys if k in df and _distinct(df[k]) > 1]


def _short(key: str, keys: Sequence[str]) -> str:
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    return f"{v:g}" if isinstance(v, float) else str(v)


def group_labels(
    df: pd.DataFrame, keys: Sequence[str], use_system: bool, fallback: str = "all runs"
) -> pd.Series:
    """A system name per row: its ``system`` label (when the sweep names systems) and the
    values of ``keys``."""
    import pandas as pd

    labels = []
    for _, row in df.iterrows():
        parts = [str(row["system"])] if use_system else []
        parts += [f"{_short(k, keys)}={_fmt(row[k])}" for k in keys]
        labels.append(", ".join(parts) or fallback)
    return pd.Series(labels, index=df.index, dtype=object)


def _group_keys(
    df: pd.DataFrame, params: Sequence[str], exclude: Sequence[str], has_label: bool
) -> list[str]:
    keys = [k for k in varied(df, params) if k not in exclude]
    if has_label:  # keep what varies *within* a label: the label already names the rest
        keys = [k for k in keys if df.groupby("system")[k].agg(_distinct).max() > 1]
    return keys


def _rate_column(params: Sequence[str], vary: Sequence[str], meta: dict) -> str | None:
    search = meta.get("find_rate") or {}
    if search.get("key") in vary:
        return search["key"]
    for k in vary:
        if k in RATE_KEYS or k.endswith(".rate"):
            return k
    return None


def sustainable_from_curve(
    df: pd.DataFrame, rate_col: str, criterion: SustainabilityCriterion
) -> float | None:
    """The highest rate up to which every run (in rate order) meets ``criterion``;
    None if the lowest rate already fails."""
    best = None
    for _, row in df.sort_values(rate_col).iterrows():
        if not criterion.sustainable(row.to_dict()):
            break
        best = float(row[rate_col])
    return best


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


# --- drawing -------------------------------------------------------------------------------


def plot_sweep(sweep_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Draw every figure that applies to a sweep folder; return the files written."""
    import pandas as pd

    from kvsim.simulator.app import plots

    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir else sweep_dir / "plots"
    table, meta, rates = load_results(sweep_dir)
    claim_folder(out_dir)  # kvsim's, or refused (simulator.outputs)
    name = meta.get("name") or sweep_dir.name
    ok = table[table["status"] == "ok"].copy()
    if ok.empty:
        raise PlotError(f"{sweep_dir}: no successful run to plot ({len(table)} runs, none ok)")
    params = _params(table, meta)
    has_label = "label" in (meta.get("grid") or {}) or "label" in (meta.get("zip") or {})
    vary = varied(ok, params)
    rate_col = _rate_column(params, vary, meta)
    search = meta.get("find_rate") or {}
    bound = (
        search.get("max_normalized_latency", DEFAULT_MAX_NORMALIZED_LATENCY)
        if search
        else DEFAULT_MAX_NORMALIZED_LATENCY
    )
    written: list[Path] = []

    # Normalized latency vs rate, with each system's sustainable rate.
    sustainable: dict[str, float | None] = {}
    at_least: list[str] = []
    if rate_col:
        keys = _group_keys(ok, params, [rate_col], has_label)
        ok["_group"] = group_labels(ok, keys, has_label, fallback=name)
        if rates is not None:
            rates = rates.copy()
            rates["_group"] = group_labels(
                rates, [k for k in keys if k in rates], has_label, fallback=name
            )
            sustainable = {
                g: (None if pd.isna(r) else float(r))
                for g, r in zip(rates["_group"], rates["sustainable_rate"])
            }
            at_least = rates.loc[rates["search_status"] == "above_hi", "_group"].tolist()
        else:
            criterion = (
                SustainabilityCriterion(max_normalized_latency=bound)
                if bound
                else SustainabilityCriterion()
            )
            sustainable = {
                g: sustainable_from_curve(df, rate_col, criterion)
                for g, df in ok.groupby("_group", sort=False)
            }
            at_least = [
                g
                for g, df in ok.groupby("_group", sort=False)
                if sustainable[g] is not None and sustainable[g] >= df[rate_col].astype(float).max()
            ]
        curves = {
            g: (df[rate_col].astype(float).tolist(), df["normalized_latency_s_per_token"].tolist())
            for g, df in ok.groupby("_group", sort=False)
        }
        unit = (
            "rate multiplier (x the trace's own rate)"
            if rate_col == "workload.rate_scale"
            else "request rate (req/s)"
        )
        written += plots.plot_latency_vs_rate(
            curves,
            out_dir / "latency_vs_rate.png",
            sustainable,
            bound,
            rate_label=unit,
            title=f"{name}: normalized latency vs rate",
            at_least=at_least,
            formats=FORMATS,
        )

    # Bars: memory classes and batched requests, one per system (at a common rate).
    bars, where = _bar_rows(ok, rate_col, sustainable)
    bar_keys = _group_keys(ok, params, [rate_col] if rate_col else [], has_label)
    labels = _unique(group_labels(bars, bar_keys, has_label, fallback=name).tolist())[:MAX_BARS]
    bars = bars.iloc[:MAX_BARS]
    summaries = {label: row.to_dict() for label, (_, row) in zip(labels, bars.iterrows())}
    written += _both(
        plots.plot_memory_breakdown(
            summaries,
            out_dir / "memory_breakdown.png",
            title=f"{name}: KV cache usage{where}",
            formats=FORMATS,
        )
    )
    written += plots.plot_batched_requests(
        {k: v.get("mean_batched_requests", float("nan")) for k, v in summaries.items()},
        out_dir / "batched_requests.png",
        title=f"{name}: mean batched requests{where}",
        formats=FORMATS,
    )

    if BLOCK_KEY in vary:
        keys = _group_keys(ok, params, [BLOCK_KEY], has_label)
        ok["_group"] = group_labels(ok, keys, has_label, fallback=name)
        curves = {g: df for g, df in ok.groupby("_group", sort=False)}
        written += plots.plot_block_size_sweep(
            curves,
            out_dir / "block_size.png",
            block_col=BLOCK_KEY,
            title=f"{name}: block size",
            formats=FORMATS,
        )

    if MODE_KEY in vary:
        x_col = BLOCK_KEY if BLOCK_KEY in vary else (rate_col or None)
        keys = _group_keys(ok, params, [x_col] if x_col else [], has_label)
        if MODE_KEY not in keys and not has_label:
            keys = [MODE_KEY, *keys]
        ok["_group"] = group_labels(ok, keys, has_label, fallback=name)
        curves = {g: df for g, df in ok.groupby("_group", sort=False)}
        x_label = (
            "block size (tokens)"
            if x_col == BLOCK_KEY
            else ("request rate (req/s)" if x_col else "")
        )
        written += plots.plot_swap_vs_recompute(
            curves,
            out_dir / "swap_vs_recompute.png",
            x_col=x_col,
            x_label=x_label,
            title=f"{name}: swap vs recompute",
            formats=FORMATS,
        )
    sizes = [k for k in vary if TIER_SIZE_KEY.match(k)]
    if sizes:
        written += _tier_sweep(ok, params, has_label, name, sizes[0], out_dir)
    return written


def _tier_sweep(
    ok: pd.DataFrame, params: Sequence[str], has_label: bool, name: str, size_col: str,
    out_dir: Path,
) -> list[Path]:
    """``cache_tiers``: the tier sweep against the size of the tier in ``size_col``. A policy
    is what else varies: the tier's eviction policy first (it picks the colour), then the
    sweep's label or other keys (they pick the dash)."""
    from kvsim.simulator.app import plots

    index = TIER_SIZE_KEY.match(size_col).group(1)
    eviction = f"allocator.tiers.{index}.eviction_policy"
    keys = _group_keys(ok, params, [size_col], has_label)
    keys = ([eviction] if eviction in keys else []) + [k for k in keys if k != eviction]
    rest = [k for k in keys if k != eviction]

    def policy(row: pd.Series) -> tuple[str, ...]:
        parts = [str(row[eviction])] if eviction in keys else []
        parts += [str(row["system"])] if has_label else []
        parts += [f"{_short(k, rest)}={_fmt(row[k])}" for k in rest]
        return tuple(parts) or (name,)

    members: dict[tuple[str, ...], list] = {}
    for i, row in ok.iterrows():
        members.setdefault(policy(row), []).append(i)
    curves = {key: ok.loc[rows] for key, rows in members.items()}
    tiers = sorted(
        (c.removeprefix("tier_").removesuffix("_hit_ratio") for c in ok.columns
         if c.startswith("tier_") and c.endswith("_hit_ratio")),
        key=lambda t: list(ok.columns).index(f"tier_{t}_hit_ratio"),
    )
    return plots.plot_tier_sweep(
        curves,
        out_dir / "cache_tiers.png",
        size_col=size_col,
        tiers=tiers,
        size_label=f"{tiers[int(index)] if int(index) < len(tiers) else 'tier ' + index} tier "
        "size (GiB)",
        title=f"{name}: cache tiers",
        formats=FORMATS,
    )


def _both(path: Path) -> list[Path]:
    return [Path(path).with_suffix(f".{f}") for f in FORMATS]


def _bar_rows(
    ok: pd.DataFrame, rate_col: str | None, sustainable: dict
) -> tuple[pd.DataFrame, str]:
    """The runs to compare in bar charts, and the words saying at which rate."""
    import pandas as pd

    if not rate_col:
        return ok, ""
    groups = list(ok.groupby("_group", sort=False))
    common = set.intersection(*(set(df[rate_col].astype(float)) for _, df in groups))
    if common:
        rate = max(common)
        rows = ok[ok[rate_col].astype(float) == rate].drop_duplicates("_group")
        return (
            rows,
            f" at {rate:g} req/s"
            if rate_col != "workload.rate_scale"
            else f" at {rate:g}x the trace rate",
        )
    picked = []
    for g, df in groups:
        target = sustainable.get(g)
        r = df[df[rate_col].astype(float) == target] if target is not None else df.iloc[0:0]
        picked.append(r.iloc[:1] if len(r) else df.sort_values(rate_col).iloc[:1])
    return pd.concat(picked), " at each system's sustainable rate"


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """The memory timeline of one run folder."""
    import pandas as pd

    from kvsim.simulator.app import plots

    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / "plots"
    steps_path = run_dir / "steps.parquet"
    if not steps_path.is_file():
        raise PlotError(
            f"{run_dir}: no steps.parquet (the run had metrics.step_table: false); "
            "nothing to draw a timeline from"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    claim_folder(out_dir)  # kvsim's, or refused (simulator.outputs)
    cfg_path = run_dir / "config.yaml"
    name = (
        (yaml.safe_load(cfg_path.read_text()) or {}).get("name", "") if cfg_path.is_file() else ""
    )
    title = f"{name} ({run_dir.name}): KV cache memory over time" if name else ""
    plots.plot_memory_timeline(
        pd.read_parquet(steps_path),
        summary["kv_capacity_slots"],
        out_dir / "memory_timeline.png",
        title=title,
        formats=FORMATS,
    )
    return _both(out_dir / "memory_timeline.png")


def plot_results(results: Path, out_dir: Path | None = None) -> list[Path]:
    """A sweep folder or a run folder -> the figures written."""
    results = Path(results)
    if (results / "sweep.parquet").is_file():
        return plot_sweep(results, out_dir)
    if (results / "summary.json").is_file():
        return plot_run(results, out_dir)
    if not results.is_dir():
        raise PlotError(f"{results}: no such folder")
    raise PlotError(
        f"{results}: neither a sweep folder (sweep.parquet) nor a run folder (summary.json)"
    )


# --- command line --------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace) -> int:
    for p in plot_results(Path(args.results), Path(args.out) if args.out else None):
        print(p)
    return 0


def add_plot_command(subparsers) -> None:
    """Register ``kvsim plot`` on the CLI's argparse subparsers."""
    p = subparsers.add_parser(
        "plot",
        help="draw a sweep's or a run's figures (PNG and SVG)",
        description="Draw the figures that apply to a sweep folder (memory breakdown, "
        "batched requests, "
        "latency vs rate, block size, swap vs recompute, cache tiers) or a run folder (memory timeline) into "
        "RESULTS/plots/, and print their paths.",
    )
    p.add_argument(
        "results", help="a sweep folder (results/NAME) or a run folder (results/NAME/runs/ID)"
    )
    p.add_argument("--out", help="folder for the figures (default: RESULTS/plots)")
    p.set_defaults(func=cmd_plot)


__all__ = [
    "PlotError",
    "add_plot_command",
    "group_labels",
    "plot_results",
    "plot_run",
    "plot_sweep",
    "sustainable_from_curve",
    "varied",
]
