"""The report of ``kvsim validate``: a Markdown and a JSON file, figures, and a README snippet.

Everything shown comes from a :class:`simulator.app.validate.Validation` (the run folder and the
replays); nothing is computed here but differences and formatting.

Files written into the output folder (atomically, with kvsim's run marker; see
``simulator.app.results``): ``report.md``, ``report.json``, ``readme_snippet.md`` (simulated and measured numbers only: the
same run folder gives byte-identical files), ``run_info.json`` (wall-clock times) and, unless
disabled, ``cdf_latency.png`` (CDFs of TTFT, TPOT, E2E), ``curves.png`` (running, waiting and
KV usage per second) and ``scatter_e2e.png`` (simulated vs measured E2E per request).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kvsim.simulator.app.validate import LATENCIES, PERCENTILES, UNQUEUED_S, Validation, pct_diff

ROWS: tuple[tuple[str, str, str], ...] = tuple(
    (f"{key}_{stat}", f"{label} {stat if stat == 'mean' else stat}", unit)
    for key, label, unit, _ in LATENCIES for stat in ("mean", *(f"p{p}" for p in PERCENTILES))
) + (
    ("makespan_s", "makespan", "s"),
    ("output_throughput", "output throughput", "tok/s"),
    ("request_throughput", "request throughput", "req/s"),
    ("preemptions", "preemptions", ""),
    ("kv_peak_pct", "KV usage peak", "%"),
    ("kv_mean_pct", "KV usage mean", "%"),
)
"""(metric key, label, unit) of each row of the measured-vs-simulated table."""

TARGETS: tuple[tuple[str, float], ...] = (
    ("makespan_s", 3.0), ("ttft_mean", 5.0), ("ttft_p50", 5.0), ("tpot_mean", 5.0), ("e2e_mean", 5.0),
    ("ttft_p99", 10.0), ("tpot_p99", 10.0), ("e2e_p99", 10.0),
)
"""kvsim's accuracy targets for a replay with the profiled cost model: |difference| within this
many %: the run's length tightest, means and medians next, tails (fewer samples) loosest."""
KV_MAE_TARGET_PP = 5.0


def _num(value: float, unit: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if unit == "" and float(value).is_integer():
        return f"{int(value):,}"
    if unit == "ms" or abs(value) < 10:
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def _gpu(v: Validation) -> str:
    """The measured GPU as the run names it, or the catalogue GPU assumed for it."""
    return v.plan.settings.gpu_name or f"{v.plan.gpu} (not recorded in meta.json)"


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:+.1f}%"


def report_dict(v: Validation) -> dict:
    """The report as plain data (``report.json``): measured numbers, each replay's numbers and
    differences, curve errors, settings and notes."""
    def clean(d: dict) -> dict:
        return {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in d.items()}

    s = v.plan.settings
    return {
        "run": v.folder.name,
        "run_folder": str(v.folder.path),
        "workload": str(v.folder.workload),
        "model": s.model,
        "gpu": s.gpu_name,
        "kvsim_gpu": v.plan.gpu,
        "cost_model": v.plan.cost_model,
        "profile": v.plan.profile,
        "recorded_num_gpu_blocks": s.num_gpu_blocks,
        "simulated_num_gpu_blocks": v.replays[0].summary.get("kv_num_gpu_blocks") if v.replays else None,
        "preemptions_recorded": v.preemptions_recorded,
        "assumed": [{"setting": k, "value": val, "source": src} for k, val, src in v.plan.assumed],
        "not_recorded": dict(v.not_recorded),
        "failed_replays": [{"policy": p, "cost_model": k, "error": e} for p, k, e in v.failures],
        "unqueued_requests": int(v.unqueued.sum()),
        "measured_unqueued_ttft_mean_s": float(v.measured_latencies.ttft[v.unqueued].mean())
        if v.unqueued.any() else None,
        "measured": clean(v.measured),
        "replays": [{
            "policy": r.policy, "cost_model": r.cost_model,
            "simulated": clean(r.stats),
            "difference_pct": clean({k: pct_diff(r.stats.get(k, math.nan), v.measured.get(k, math.nan))
                                     for k, _, _ in ROWS}),
            **clean({"kv_usage_mae_pp": r.kv_mae_pp, "running_mae": r.running_mae,
                     "waiting_mae": r.waiting_mae,
                     "unqueued_ttft_mean_s": float(np.nanmean(r.latencies.ttft[v.unqueued]))
                     if v.unqueued.any() else math.nan}),
        } for r in v.replays],
        "targets": targets(v),
        "notes": v.notes,
    }


def targets(v: Validation) -> list[dict]:
    """Each target, for each replay with the chosen cost model: the difference and whether it holds."""
    out = []
    for r in v.main_replays():
        for key, limit in TARGETS:
            d = pct_diff(r.stats[key], v.measured[key])
            out.append({"policy": r.policy, "metric": key, "limit_pct": limit,
                        "difference_pct": d if math.isfinite(d) else None,
                        "holds": bool(math.isfinite(d) and abs(d) <= limit)})
        out.append({"policy": r.policy, "metric": "kv_usage_mae_pp", "limit_pp": KV_MAE_TARGET_PP,
                    "value": r.kv_mae_pp if math.isfinite(r.kv_mae_pp) else None,
                    "holds": bool(r.kv_mae_pp <= KV_MAE_TARGET_PP)})
    for t in out:  # a metric the run did not record is neither met nor missed
        if t["metric"] in v.not_recorded:
            t["holds"] = None
            t["not_recorded"] = v.not_recorded[t["metric"]]
    return out


def _target_line(t: dict) -> str:
    """One target of the report's list: met, missed or not recorded."""
    verdict = "not recorded" if t["holds"] is None else ("holds" if t["holds"] else "missed")
    if t["metric"] == "kv_usage_mae_pp":
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        return f"- {t['policy']}: KV usage MAE {value} points (target <= {t['limit_pp']:g}): {verdict}"
    d = t["difference_pct"]
    return (f"- {t['policy']}: {t['metric']} {_pct(d if d is not None else math.nan)} "
            f"(target within {t['limit_pct']:g}%): {verdict}")


def _mae(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "not recorded"


def comparison_table(v: Validation) -> str:
    """The Markdown table: a row per metric; measured, then each replay and its difference."""
    main, ref = v.main_replays(), v.reference_replays()
    head = ["metric", "measured"]
    for r in main:
        head += [f"{r.policy} ({r.cost_model})", "diff"]
    head += [f"{r.policy} {r.cost_model} diff" for r in ref]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for key, label, unit in ROWS:
        name = f"{label} ({unit})" if unit else label
        m = v.measured[key]
        cells = [name, "not recorded" if key in v.not_recorded else _num(m, unit)]
        for r in main:
            cells += [_num(r.stats[key], unit), _pct(pct_diff(r.stats[key], m))]
        cells += [_pct(pct_diff(r.stats[key], m)) for r in ref]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["KV usage MAE per second (points)", ""]
    for r in main:
        cells += [_mae(r.kv_mae_pp), ""]
    cells += [_mae(r.kv_mae_pp) for r in ref]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_table(v: Validation) -> str:
    """Mean absolute error of each replay's per-second curves against the measured ones."""
    lines = ["| replay | running (requests) | waiting (requests) | KV usage (points) |", "|---|---:|---:|---:|"]
    for r in v.replays:
        lines.append(f"| {r.label} | {_mae(r.running_mae)} | {_mae(r.waiting_mae)} | {_mae(r.kv_mae_pp)} |")
    return "\n".join(lines)


def assumed_table(v: Validation) -> str:
    """Each engine setting the run folder does not record: the value the replay used and
    where it came from (a flag, the operator profile, the model, vLLM's default)."""
    lines = ["| setting | value | from |", "|---|---|---|"]
    lines += [f"| {k} | {val} | {src} |" for k, val, src in v.plan.assumed]
    return "\n".join(lines)


def unqueued_table(v: Validation) -> str:
    """TTFT of the requests the engine scheduled on arrival (no queueing): prefill under the
    running batch, where v1's chunked, mixed steps and v0's prefill-only steps differ. Empty
    when the run records no scheduled_ts or no request went straight in."""
    mask = v.unqueued
    if not mask.any():
        return ""
    lines = ["| TTFT of the requests scheduled on arrival | requests | mean (s) | p50 (s) | max (s) |",
             "|---|---:|---:|---:|---:|"]
    rows = [("measured", v.measured_latencies)] + [(r.label, r.latencies) for r in v.main_replays()]
    for name, lat in rows:
        x = lat.ttft[mask]
        x = x[np.isfinite(x)]
        lines.append(f"| {name} | {len(x)} | {x.mean():.3f} | {np.median(x):.3f} | {x.max():.3f} |")
    measured = v.measured_latencies.ttft[mask].mean()
    gaps = ", ".join(f"{r.policy} {1000 * (np.nanmean(r.latencies.ttft[mask]) - measured):+.0f} ms"
                     for r in v.main_replays())
    tpot = ", ".join(f"{r.policy} {pct_diff(r.stats['tpot_mean'], v.measured['tpot_mean']):+.1f}%"
                     for r in v.main_replays())
    lines += ["", f"Simulated minus measured mean TTFT on these requests: {gaps}; mean TPOT: {tpot}. A gap "
              "here that TPOT does not share is per request, not per step: the engine's path to a "
              "first token outside the model steps (request intake, async scheduling's output one step "
              "later, the first request's warm-up) is not simulated."]
    return "\n".join(lines)


def markdown(v: Validation, figures: bool = True) -> str:
    """``report.md``."""
    s = v.plan.settings
    main = v.main_replays()
    blocks = main[0].summary.get("kv_num_gpu_blocks") if main else None
    lines = [
        f"# kvsim validate: {v.folder.name}",
        "",
        f"Measured: {s.model} on {_gpu(v)}, TP {s.tensor_parallel}"
        + (f" x DP {s.data_parallel}" if s.data_parallel > 1 else "") + f", {s.dtype}, {len(v.folder.requests)} "
        f"requests ({v.folder.files['requests']}). Simulated: kvsim on `{v.plan.gpu}` with the "
        f"`{v.plan.cost_model}` cost model" + (f" (profile `{v.plan.profile}`)" if v.plan.profile else "")
        + f", {blocks:,} KV blocks of {s.block_size} tokens, max_num_seqs {s.max_num_seqs}, prefix caching "
        f"{'on' if s.prefix_caching else 'off'}. Nothing is fitted to the measured latencies.",
        "",
        "Latencies from when the engine queued each request (simulated: its arrival); the simulated "
        "clock starts at the first arrival. Differences are (simulated - measured) / measured.",
        "",
        comparison_table(v),
        "",
        "## Targets (" + v.plan.cost_model + " cost model)",
        "",
    ]
    lines += [_target_line(t) for t in targets(v)]
    lines += [f"- {p}: replay failed ({k}): {e}" for p, k, e in v.failures if k == v.plan.cost_model]
    lines += ["", "## Per-second curves (mean absolute error against the measurement)", "", curve_table(v)]
    if v.unqueued.any():
        lines += ["", f"## Requests that did not queue (measured scheduled_ts - queued_ts < "
                  f"{UNQUEUED_S * 1000:g} ms)", "", unqueued_table(v)]
    if v.plan.assumed:
        lines += ["", "## Settings the run folder does not record", "", assumed_table(v)]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in v.notes]
    if figures:
        lines += ["", "## Figures", "", "![CDFs](cdf_latency.png)", "", "![curves](curves.png)", "",
                  "![E2E per request](scatter_e2e.png)"]
    return "\n".join(lines) + "\n"


def readme_snippet(v: Validation) -> str:
    """The README's "How close to a real engine" section (regenerate with
    ``kvsim validate RUN --readme-snippet``)."""
    s = v.plan.settings
    main = v.main_replays()
    blocks = main[0].summary.get("kv_num_gpu_blocks") if main else None
    held = [t for t in targets(v) if t["holds"]]
    missed = [t for t in targets(v) if t["holds"] is False]
    lines = [
        "## How close to a real engine",
        "",
        f"`kvsim validate` replays a measured run with the settings it records and compares. On the shipped "
        f"run ({s.model}, {_gpu(v)}, {len(v.folder.requests)} ShareGPT requests with their token ids, "
        f"{blocks:,} usable KV blocks, prefix caching and chunked prefill on), with the "
        f"`{v.plan.cost_model}` cost model" + (f" (`{v.plan.profile}`)" if v.plan.profile else "")
        + ", nothing fitted to the measured latencies:",
        "",
        "```bash",
        f"kvsim validate {v.folder.path}",
        "```",
        "",
        comparison_table(v),
        "",
        f"Accuracy targets (makespan within 3%; mean and p50 TTFT, mean TPOT and mean E2E within 5%; "
        f"p99s within 10%; per-second KV-usage error <= {KV_MAE_TARGET_PP:g} points) met: {len(held)} of "
        f"{len(held) + len(missed)}" + ("" if not missed else " (missed: " + ", ".join(
            f"{t['policy']} {t['metric']}" for t in missed) + ")") + ". "
        "The aggregates depend mostly on step times; the per-second running, waiting and KV-usage "
        "curves show where the schedulers' rules differ (mean absolute error against the measurement):",
        "",
        curve_table(v),
        "",
    ] + ([f"The {int(v.unqueued.sum())} requests the engine scheduled on arrival (no queueing) show prefill "
          "under a running batch:", "", unqueued_table(v), ""] if v.unqueued.any() else []) + (
        ["Settings the run folder does not record:", "", assumed_table(v), ""] if v.plan.assumed else []) + [
        f"- {n}" for n in v.notes] + [
        "",
        "The report (`results/validate/<run>/report.md`, `.json`) adds CDF overlays of TTFT, TPOT and E2E, "
        "the per-second curves and a per-request E2E scatter. This section is the command's "
        "`--readme-snippet` output.",
    ]
    return "\n".join(lines) + "\n"


# --- figures --------------------------------------------------------------------------------------

_STYLE = {"measured": ("black", "-"), "vllm-v1": ("tab:blue", "-"), "vllm-v0": ("tab:orange", "--")}


def plot_cdfs(v: Validation, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, label, unit, factor) in zip(axes, LATENCIES):
        series = [("measured", getattr(v.measured_latencies, key))] + [
            (r.policy, getattr(r.latencies, key)) for r in v.main_replays()]
        for name, values in series:
            x = np.sort(values[np.isfinite(values)] * factor)
            color, style = _STYLE.get(name, ("gray", ":"))
            ax.plot(x, np.arange(1, len(x) + 1) / max(len(x), 1), color=color, linestyle=style, label=name)
        ax.set_xlabel(f"{label} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{v.folder.name}: measured vs simulated ({v.plan.cost_model})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(v: Validation, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    labels = {"running": "running requests", "waiting": "waiting requests", "kv_pct": "KV usage (%)"}
    series = [("measured", v.measured_curves)] + [(r.policy, r.curves) for r in v.main_replays()]
    for ax, column in zip(axes, ("running", "waiting", "kv_pct")):
        for name, curve in series:
            color, style = _STYLE.get(name, ("gray", ":"))
            ax.plot(curve["t"], curve[column], color=color, linestyle=style, label=name, linewidth=1.2)
        ax.set_ylabel(labels[column])
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[-1].set_xlabel("seconds from the first request")
    fig.suptitle(f"{v.folder.name}: per-second state, measured vs simulated ({v.plan.cost_model})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scatter(v: Validation, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    measured = v.measured_latencies.e2e
    top = float(np.nanmax(measured))
    for r in v.main_replays():
        color, _ = _STYLE.get(r.policy, ("gray", ":"))
        ax.scatter(measured, r.latencies.e2e, s=8, alpha=0.6, color=color, label=r.policy)
        top = max(top, float(np.nanmax(r.latencies.e2e)))
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, label="equal")
    ax.set_xlabel("measured E2E (s)")
    ax.set_ylabel("simulated E2E (s)")
    ax.set_title(f"{v.folder.name}: E2E per request")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_validation(v: Validation, out_dir: Path, plot: bool = True) -> Path:
    """Write the report into ``out_dir`` atomically (a folder kvsim marked; anything else there
    is an OutputError, never removed); return it."""
    from kvsim.simulator.app.results import atomic_dir

    with atomic_dir(Path(out_dir)) as tmp:
        (tmp / "report.md").write_text(markdown(v, figures=plot))
        (tmp / "report.json").write_text(json.dumps(report_dict(v), indent=2, allow_nan=False) + "\n")
        (tmp / "readme_snippet.md").write_text(readme_snippet(v))
        (tmp / "run_info.json").write_text(json.dumps(  # wall-clock times: the one file that differs
            {"wall_s": v.wall_s, "replay_wall_s": {r.label: r.wall_s for r in v.replays}}, indent=2) + "\n")
        if plot:
            plot_cdfs(v, tmp / "cdf_latency.png")
            plot_curves(v, tmp / "curves.png")
            plot_scatter(v, tmp / "scatter_e2e.png")
    return Path(out_dir)
