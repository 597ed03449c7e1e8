"""``kvsim reproduce vllm-paper``: the PagedAttention paper's evaluation, regenerated.

Every experiment is a sweep file in ``configs/vllm_paper/`` built only from the paper's
setup (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023: Table 1, section 6) and the hardware catalogue. The sweeps
run through the sweep executor (resumable: a second invocation reuses finished runs);
then each figure is drawn and ``report.md`` puts the simulated numbers beside the
paper's headline claim, saying where they agree and by how much they do not.

``--quick`` shrinks the workloads (fewer requests, coarser rate searches, OPT-13B only)
to finish in a few minutes on two cores; the full run uses the configs as written.
Nothing is tuned to match the paper: a disagreement is reported, not fitted away.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simulator.config import load_config
from simulator.cost_model.base import BatchShape, causal_attention_pairs
from simulator.cost_model.roofline import RooflineCostModel, RooflineParams
from simulator.plots import (
    plot_batched_requests,
    plot_block_size_sweep,
    plot_latency_vs_rate,
    plot_memory_breakdown,
    plot_swap_vs_recompute,
)
from simulator.sweep import SweepResult, load_sweep, run_sweep

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "vllm_paper"
PAPER = "Kwon et al., SOSP 2023"


@dataclass(frozen=True)
class Experiment:
    """One figure: its sweep file, how ``--quick`` shrinks it, and how it is reported."""

    key: str
    title: str
    sweep: str  # file in configs/vllm_paper
    quick_set: tuple[str, ...] = ()  # overrides for --quick
    quick_rate: dict | None = None  # find_rate overrides for --quick
    in_quick: bool = True


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("fig2", "Fig. 2: memory breakdown", "fig2_memory_breakdown.yaml",
               ("workload.num_requests=400",)),
    Experiment("fig12-sharegpt", "Fig. 12: sustainable rate, OPT-13B, ShareGPT", "fig12_opt13b_sharegpt.yaml",
               ("workload.num_requests=300",), {"tolerance": 0.3}),
    Experiment("fig12-alpaca", "Fig. 12: sustainable rate, OPT-13B, Alpaca", "fig12_opt13b_alpaca.yaml",
               ("workload.num_requests=1200",), {"tolerance": 6.0}),
    Experiment("fig12-66b", "Fig. 12: sustainable rate, OPT-66B, ShareGPT", "fig12_opt66b_sharegpt.yaml", in_quick=False),
    Experiment("fig12-175b", "Fig. 12: sustainable rate, OPT-175B, ShareGPT", "fig12_opt175b_sharegpt.yaml",
               in_quick=False),
    Experiment("fig13", "Fig. 13: batched requests", "fig13_batched_requests.yaml"),
    Experiment("fig14", "Fig. 14: parallel sampling", "fig14_parallel_sampling.yaml", ("workload.num_requests=600",)),
    Experiment("fig15", "Fig. 15: beam search", "fig15_beam_search.yaml", ("workload.num_requests=600",)),
    Experiment("fig16", "Fig. 16: shared prefix", "fig16_shared_prefix.yaml", ("workload.num_requests=800",),
               {"tolerance": 10.0}),
    Experiment("fig18", "Fig. 18b: block size", "fig18_block_size.yaml"),
    Experiment("fig19", "Fig. 19: swap vs recompute", "fig19_swap_recompute.yaml", ("workload.num_requests=500",)),
    Experiment("mooncake", "Prefix caching on the Mooncake trace", "mooncake_prefix_caching.yaml",
               ("workload.window.num_requests=800",)),
)


# --- running ---------------------------------------------------------------------------------

def run_experiments(out_dir: Path, quick: bool, executor: str = "local", workers: int | None = None,
                    address: str | None = None, only: tuple[str, ...] = (), progress: bool = True,
                    log: Callable[[str], None] = print) -> dict[str, SweepResult]:
    """Run the chosen experiments' sweeps (reusing finished runs); return their results."""
    chosen = [e for e in EXPERIMENTS if (not only or e.key in only) and (e.in_quick or not quick)]
    if only:
        unknown = set(only) - {e.key for e in EXPERIMENTS}
        if unknown:
            raise ValueError(f"unknown experiment(s) {', '.join(sorted(unknown))}; choose from "
                             f"{', '.join(e.key for e in EXPERIMENTS)}")
    results: dict[str, SweepResult] = {}
    for exp in chosen:
        t0 = time.perf_counter()
        spec = load_sweep(CONFIG_DIR / exp.sweep, set_=exp.quick_set if quick else (),
                          output_dir=str(out_dir / ("quick" if quick else "full")),
                          find_rate=exp.quick_rate if quick else None)
        results[exp.key] = run_sweep(spec, executor, workers=workers, address=address, progress=progress)
        r = results[exp.key]
        log(f"{exp.key}: {len(r.table)} runs ({r.executed} simulated, {r.reused} reused, {r.failed} failed) "
            f"in {time.perf_counter() - t0:.1f} s")
    return results


# --- helpers for the report -----------------------------------------------------------------------

def _ok(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["status"] == "ok"]


def _md_table(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, float) and not math.isnan(v) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a and b else float("nan")


def _workload_name(table: pd.DataFrame) -> pd.Series:
    """'ShareGPT' or 'Alpaca' from a swept ``workload`` mapping (stored as JSON)."""
    def name(cell: str) -> str:
        preset = json.loads(cell).get("lengths", {}).get("name", "")
        return {"sharegpt-paper": "ShareGPT", "alpaca-paper": "Alpaca"}.get(preset, preset)
    return table["workload"].map(name)


def _threshold(rates: pd.DataFrame) -> float | None:
    """The normalized-latency bound of a rate search, from its criterion text."""
    if not len(rates) or "criterion" not in rates:
        return None
    m = re.search(r"normalized latency <= ([0-9.]+)", str(rates["criterion"].iloc[0]))
    return float(m.group(1)) if m else None


def _verdict(ok: bool) -> str:
    return "**agrees**" if ok else "**differs**"


# --- one section per figure -----------------------------------------------------------------------

def section_fig2(r: SweepResult, figs: Path) -> str:
    t = _ok(r.table).set_index("system")
    rows = {s: t.loc[s].to_dict() for s in t.index}
    plot_memory_breakdown(rows, figs / "fig2_memory_breakdown.png", title="KV cache usage (OPT-13B, ShareGPT, 3 req/s)")
    paper = {"Orca-Max": 20.4, "Orca-Pow2": 26.8, "Orca-Oracle": 38.2, "vLLM": 96.3}
    cols = ["mem_token_states_perc", "mem_reserved_perc", "mem_internal_frag_perc", "mem_external_frag_perc",
            "mem_stranded_free_perc", "mem_idle_free_perc"]
    df = t[cols].rename(columns=lambda c: c.removeprefix("mem_").removesuffix("_perc") + " %").reset_index()
    df.insert(2, "paper token states %", [paper.get(s, float("nan")) for s in df["system"]])
    shares = [t.loc[s, "mem_token_states_perc"] for s in paper if s in t.index]
    ordered = len(shares) == 4 and all(a < b for a, b in zip(shares, shares[1:]))
    return (
        "The paper reports that only 20.4% - 38.2% of the KV cache holds token states in the Orca "
        "variants, and 96.3% in vLLM (Fig. 2).\n\n" + _md_table(df) + "\n\n"
        f"Ordering token-state share Orca-Max < Orca-Pow2 < Orca-Oracle < vLLM: {_verdict(ordered)}.\n\n"
        + "\n".join(f"- {s}: simulated {t.loc[s, 'mem_token_states_perc']:.1f}% vs paper {p}% "
                     f"({t.loc[s, 'mem_token_states_perc'] - p:+.1f} points)" for s, p in paper.items() if s in t.index)
        + "\n\nWhere they differ: Orca-Pow2's waste splits between internal and external fragmentation "
        "according to how the buddy allocator places power-of-two regions, which depends on the exact arrival "
        "sequence and the paper's (unpublished) implementation; in quick mode fewer requests mean a shorter "
        "saturated window and noisier shares.\n\n"
        "![memory breakdown](figures/fig2_memory_breakdown.png)\n"
    )


def _rate_section(r: SweepResult, figs: Path, name: str, title: str, claim: str) -> tuple[str, dict]:
    table = _ok(r.table)
    rate_col = "workload.arrivals.rate"
    curves = {s: (g[rate_col].tolist(), g["normalized_latency_s_per_token"].tolist())
              for s, g in table.sort_values(rate_col).groupby("system", sort=False)}
    rates = r.rates if r.rates is not None else pd.DataFrame()
    sustainable = {row["system"]: (row["sustainable_rate"] if row["search_status"] == "ok" else None)
                   for _, row in rates.iterrows()}
    at_least = [row["system"] for _, row in rates.iterrows() if row["search_status"] == "above_hi"]
    plot_latency_vs_rate(curves, figs / f"{name}.png", sustainable=sustainable, threshold=_threshold(rates),
                         at_least=at_least, title=title)
    show = rates[["system", "sustainable_rate", "search_status"]] if len(rates) else rates
    text = claim + "\n\n" + (_md_table(show) if len(show) else "(no rate search results)") + "\n\n"
    return text + f"![{title}](figures/{name}.png)\n", sustainable


SHAREGPT_CLAIM = ("The paper reports that on ShareGPT vLLM sustains 1.7x-2.7x the request rate of Orca-Oracle "
                  "and 2.7x-8x that of Orca-Max at similar latency, and up to 22x that of FasterTransformer "
                  "(section 6.2, Fig. 12).")
ALPACA_CLAIM = ("The paper reports that on Alpaca, whose short sequences waste less memory, vLLM's advantage "
                "over Orca-Oracle and Orca-Pow2 is less pronounced than on ShareGPT (section 6.2, Fig. 12).")


def section_fig12(r: SweepResult, figs: Path, key: str, title: str) -> str:
    alpaca = "alpaca" in key
    text, rates = _rate_section(r, figs, key.replace("-", "_"), title, ALPACA_CLAIM if alpaca else SHAREGPT_CLAIM)
    vllm = rates.get("vLLM")
    lines = []
    for other, lo, hi in (("Orca-Oracle", 1.7, 2.7), ("Orca-Max", 2.7, 8.0), ("FasterTransformer", None, 22.0)):
        ratio = _ratio(vllm, rates.get(other))
        if math.isnan(ratio):
            lines.append(f"- vLLM / {other}: not available (its search did not bracket a rate: see the table)")
            continue
        if alpaca:
            lines.append(f"- vLLM / {other}: {ratio:.2f}x")
        elif lo is None:
            lines.append(f"- vLLM / {other}: {ratio:.2f}x (paper: up to {hi}x): {_verdict(ratio <= hi)}"
                         + ("" if ratio <= hi else "; the simulated FasterTransformer holds each batch until its "
                            "longest request ends, and nothing in the paper's setup bounds that tail"))
        else:
            within = lo <= ratio <= hi
            off = 0.0 if within else (ratio / hi - 1 if ratio > hi else ratio / lo - 1)
            lines.append(f"- vLLM / {other}: {ratio:.2f}x (paper: {lo}x-{hi}x on ShareGPT): "
                         f"{_verdict(within)}{'' if within else f' by {off:+.0%} from the nearest bound'}")
    return text + "\n" + "\n".join(lines) + "\n"


def section_fig13(r: SweepResult, figs: Path) -> str:
    t = _ok(r.table)
    t = t.assign(workload=_workload_name(t))
    parts = []
    for wl, g in t.groupby("workload", sort=False):
        values = dict(zip(g["system"], g["mean_batched_requests"]))
        plot_batched_requests(values, figs / f"fig13_batched_{wl.lower()}.png",
                              title=f"Mean batched requests, {wl}")
        ok = values.get("vLLM", 0) > max(values.get(s, 0) for s in ("Orca-Max", "Orca-Pow2", "Orca-Oracle"))
        ratio_oracle = _ratio(values.get("vLLM"), values.get("Orca-Oracle"))
        ratio_max = _ratio(values.get("vLLM"), values.get("Orca-Max"))
        parts.append(f"**{wl}**: vLLM batches {ratio_oracle:.2f}x the requests of Orca-Oracle and "
                     f"{ratio_max:.2f}x those of Orca-Max; vLLM batches the most: {_verdict(ok)}.\n\n"
                     + _md_table(g[["system", "mean_batched_requests", "normalized_latency_s_per_token"]])
                     + f"\n\n![batched requests {wl}](figures/fig13_batched_{wl.lower()}.png)\n")
    return ("The paper reports that on ShareGPT at 2 req/s vLLM batches 2.2x more requests than "
            "Orca-Oracle and 4.3x more than Orca-Max (Fig. 13).\n\n" + "\n".join(parts))


def _sharing_section(r: SweepResult, figs: Path, col: str, name: str, what: str, paper_range: tuple[float, float]) -> str:
    t = _ok(r.table)
    vllm = t[t["system"] == "vLLM"].sort_values(col)
    shown = t[["system", col, "memory_saving_perc", "normalized_latency_s_per_token", "mean_batched_requests"]]
    shared = vllm[vllm[col] > 1]["memory_saving_perc"]
    lo, hi = paper_range
    ok = len(shared) > 0 and shared.min() >= lo * 0.5 and shared.max() <= hi * 1.5
    curves = {s: g.sort_values(col) for s, g in t.groupby("system", sort=False)}
    plot_swap_vs_recompute(curves, figs / f"{name}.png", x_col=col, x_label=what, title=f"{what}: latency")
    return (f"The paper reports {lo}% - {hi}% memory saving from sharing for {what.lower()} on Alpaca "
            f"(section 6.3).\n\n" + _md_table(shown) + "\n\n"
            f"Simulated saving for {what.lower()} > 1: {shared.min():.1f}% - {shared.max():.1f}%: "
            f"{_verdict(ok)} (within a factor of 1.5 of the paper's range).\n\n"
            f"![{what}](figures/{name}.png)\n")


def section_fig16(r: SweepResult, figs: Path) -> str:
    rates = r.rates if r.rates is not None else pd.DataFrame()
    lines, ratios = [], []
    for tokens, g in rates.groupby("workload.shared_prefix.tokens") if len(rates) else []:
        by = dict(zip(g["system"], g["sustainable_rate"]))
        ratio = _ratio(by.get("vLLM"), by.get("Orca-Oracle"))
        ratios.append(ratio)
        lines.append(f"- prefix of {tokens} tokens: vLLM sustains {ratio:.2f}x the rate of Orca-Oracle")
    table = _md_table(rates[["system", "workload.shared_prefix.tokens", "sustainable_rate", "search_status"]]) \
        if len(rates) else "(no rate search results)"
    return ("The paper reports 1.67x higher throughput than Orca-Oracle with a one-shot (80-token) shared "
            "prefix and 3.58x with five-shot (341 tokens) (Fig. 16).\n\n" + table + "\n\n" + "\n".join(lines) +
            "\n\nThe advantage grows with the prefix length, as in the paper: " +
            _verdict(len(ratios) == 2 and ratios[0] < ratios[1]) + ".\n")


def section_fig18(r: SweepResult, figs: Path) -> str:
    t = _ok(r.table)
    t = t.assign(workload=_workload_name(t))
    curves = {wl: g for wl, g in t.groupby("workload", sort=False)}
    plot_block_size_sweep(curves, figs / "fig18_block_size.png", title="Block size (OPT-13B)")
    lines = []
    paper_best = {"ShareGPT": (16, 128), "Alpaca": (16, 32)}
    for wl, g in curves.items():
        best = int(g.loc[g["normalized_latency_s_per_token"].idxmin(), "allocator.block_size"])
        lo, hi = paper_best.get(wl, (16, 128))
        within = lo <= best <= hi
        lines.append(f"- {wl}: lowest normalized latency at block size {best} (paper: {lo}-{hi}): {_verdict(within)}"
                     + ("" if within else "; at this load the simulated system is not yet memory-bound at that block "
                        "size, so the kernel's smaller per-block overhead wins over the extra internal fragmentation"))
    show = t[["workload", "allocator.block_size", "normalized_latency_s_per_token", "mem_internal_frag_perc"]]
    return ("The paper finds block sizes 16-128 best on ShareGPT and 16-32 on Alpaca; small blocks under-use "
            "the GPU, large blocks waste memory (Fig. 18b, section 7.2).\n\n" + "\n".join(lines) + "\n\n" +
            _md_table(show) + "\n\n![block size](figures/fig18_block_size.png)\n")


def swap_microbenchmark(tokens: int = 2048) -> pd.DataFrame:
    """Fig. 19a: seconds to swap ``tokens`` of KV out and back in vs to recompute them,
    per block size (OPT-13B on an A100-40GB, roofline cost model)."""
    cfg, _ = load_config(CONFIG_DIR / "opt13b_sharegpt.yaml")
    rows = []
    for block in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        cost = RooflineCostModel(cfg.model.spec, cfg.hardware.spec, block_size=block, params=RooflineParams())
        blocks = -(-tokens // block)
        swap = 2 * cost.swap_time(blocks)
        recompute = cost.step_time(BatchShape(prefill_seqs=1, prefill_tokens=tokens,
                                              prefill_attn_pairs=causal_attention_pairs(tokens)))
        rows.append({"block_size": block, "swap_out_and_in_ms": swap * 1e3, "recompute_ms": recompute * 1e3})
    return pd.DataFrame(rows)


def section_fig19(r: SweepResult, figs: Path) -> str:
    micro = swap_microbenchmark()
    plot_swap_vs_recompute({"swap out + in": micro.assign(normalized_latency_s_per_token=micro["swap_out_and_in_ms"] / 1e3,
                                                          preemption_time_s=micro["swap_out_and_in_ms"] / 1e3),
                            "recompute": micro.assign(normalized_latency_s_per_token=micro["recompute_ms"] / 1e3,
                                                      preemption_time_s=micro["recompute_ms"] / 1e3)},
                           figs / "fig19a_microbenchmark.png", x_col="block_size", x_label="block size (tokens)",
                           title="Fig. 19a: moving 2048 tokens of KV (s)")
    t = _ok(r.table)
    curves = {mode: g.sort_values("allocator.block_size") for mode, g in t.groupby("preemption.mode", sort=False)}
    plot_swap_vs_recompute(curves, figs / "fig19b_end_to_end.png", x_col="allocator.block_size",
                           x_label="block size (tokens)", title="Fig. 19b: swap vs recompute")
    crossover = micro[micro["swap_out_and_in_ms"] <= micro["recompute_ms"]]["block_size"]
    first = int(crossover.iloc[0]) if len(crossover) else None
    small_swap_worse = micro.iloc[0]["swap_out_and_in_ms"] > micro.iloc[0]["recompute_ms"]
    return ("The paper finds swapping excessively slow at small block sizes (many small PCIe transfers) "
            "while recomputation costs the same at every block size; the two are comparable from 16 to 64 "
            "(Fig. 19, section 7.3).\n\n" + _md_table(micro) + "\n\n"
            f"Swap slower than recompute at block size 1: {_verdict(bool(small_swap_worse))}; swap becomes "
            f"cheaper from block size {first} on.\n\n"
            + _md_table(t[["preemption.mode", "allocator.block_size", "normalized_latency_s_per_token",
                           "num_preemptions", "swap_time_s", "recompute_time_s"]]) +
            "\n\n![microbenchmark](figures/fig19a_microbenchmark.png)\n![end to end](figures/fig19b_end_to_end.png)\n")


def section_mooncake(r: SweepResult, figs: Path) -> str:
    t = _ok(r.table)
    show = t[["system", "completed", "rejected", "prefix_cache_hit_ratio", "cached_prompt_tokens",
              "prefix_cache_evictions", "mean_ttft_ms", "normalized_latency_s_per_token"]]
    return ("The Mooncake trace's ideal prefix-block hit ratio, with an unbounded cache, is 64% (Qin et al., "
            "FAST 2025). One GPU's KV cache holds a small fraction of the trace's distinct prefix blocks, so "
            "LRU eviction keeps the achieved ratio well below the ideal; rerun with a larger "
            "`hardware.kv_cache_gb` to see it approach 64%.\n\n" + _md_table(show) + "\n")


SECTIONS: dict[str, Callable[[SweepResult, Path], str]] = {
    "fig2": section_fig2,
    "fig12-sharegpt": lambda r, f: section_fig12(r, f, "fig12-sharegpt", "OPT-13B, ShareGPT"),
    "fig12-alpaca": lambda r, f: section_fig12(r, f, "fig12-alpaca", "OPT-13B, Alpaca"),
    "fig12-66b": lambda r, f: section_fig12(r, f, "fig12-66b", "OPT-66B, ShareGPT"),
    "fig12-175b": lambda r, f: section_fig12(r, f, "fig12-175b", "OPT-175B, ShareGPT"),
    "fig13": section_fig13,
    "fig14": lambda r, f: _sharing_section(r, f, "workload.n", "fig14_parallel_sampling", "Parallel sampling",
                                           (6.1, 9.8)),
    "fig15": lambda r, f: _sharing_section(r, f, "workload.beam_width", "fig15_beam_search", "Beam search",
                                           (37.6, 55.2)),
    "fig16": section_fig16,
    "fig18": section_fig18,
    "fig19": section_fig19,
    "mooncake": section_mooncake,
}


def write_report(results: dict[str, SweepResult], out_dir: Path, quick: bool) -> Path:
    """Draw every figure and write ``report.md``; return its path."""
    figs = out_dir / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    titles = {e.key: e.title for e in EXPERIMENTS}
    parts = [
        "# The PagedAttention paper, regenerated by kvsim\n",
        f"Reference: {PAPER}. Mode: {'quick (reduced workloads)' if quick else 'full'}. Every parameter "
        "comes from the paper's setup (configs/vllm_paper/) or the hardware catalogue; the cost model is "
        "the roofline model with its documented defaults, not fitted to the paper. Where a number differs, "
        "the section says by how much.\n",
    ]
    for key, result in results.items():
        parts.append(f"## {titles[key]}\n")
        try:
            parts.append(SECTIONS[key](result, figs))
        except Exception as e:  # a figure that cannot be drawn must not hide the others
            parts.append(f"(could not build this section: {type(e).__name__}: {e})\n")
        parts.append(f"Raw table: `{result.dir / 'sweep.csv'}`\n")
    report = out_dir / "report.md"
    report.write_text("\n".join(parts))
    return report


def reproduce(out_dir: Path = Path("results/vllm-paper"), quick: bool = False, **run_args) -> Path:
    results = run_experiments(out_dir, quick, **run_args)
    return write_report(results, out_dir, quick)
