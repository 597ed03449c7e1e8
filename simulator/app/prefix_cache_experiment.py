"""vLLM's block cache vs SGLang's radix cache on three workloads: the table and the plot.

The experiment of ``configs/sglang_vs_vllm/``: each workload config
(``mooncake.yaml``, ``multi_turn.yaml`` with and without a small KV cache, ``fewshot.yaml``) runs under each system of
:data:`SYSTEMS` (config overrides, so the table comes from the shipped configs and nothing
else), and one row per (workload, system) records:

* ``hit_ratio_perc``: prompt tokens served from the prefix cache over all prompt tokens of
  the workload's requests, the same measure for both caches (a block cache's hit in tokens
  is its hit blocks x block size). Each request counts once, at its last admission, at most
  its prompt: a request preempted or retracted and readmitted hits its own earlier KV, and
  counting every readmission would reward a scheduler for preempting (the engine's
  ``cached_prompt_tokens`` counter does count them all);
* ``preemptions`` (vLLM: recompute preemptions; SGLang: retractions);
* TTFT mean / p50 / p99 (ms), request and total-token throughput (per s);
* the time-weighted memory classes (% of KV slots: token states, reserved, internal
  fragmentation, free with and without a request waiting).

    python -m kvsim.simulator.app.prefix_cache_experiment [--out results/sglang_vs_vllm] [--tiny]

writes ``table.md``, ``table.csv`` and ``sglang_vs_vllm.png`` (hit ratio and mean TTFT per
workload, one bar per system). ``--tiny`` cuts every workload to its first 120 requests (the
test's size: same configs, seconds to run).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from kvsim.simulator.app.shipped_configs import CONFIG_DIR as SHIPPED
from kvsim.simulator.config import load_config  # noqa: E402
from kvsim.simulator.engine.runner import run_experiment  # noqa: E402
from kvsim.simulator.outputs import OutputError, atomic_write, claim_folder  # noqa: E402

CONFIG_DIR = SHIPPED / "sglang_vs_vllm"
WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {  # name -> (config, overrides)
    "Mooncake synthetic (first 400)": ("mooncake.yaml", ()),
    "multi-turn chat": ("multi_turn.yaml", ()),
    "multi-turn chat, 4 GiB KV": ("multi_turn.yaml", ("hardware.kv_cache_gib=4",)),
    "few-shot (341-token prefix)": ("fewshot.yaml", ()),
}
"""The multi-turn workload runs twice: with the H100's whole KV cache (nothing is evicted)
and with 4 GiB (about 32K tokens, below the live conversations' working set)."""
TINY_REQUESTS = 120


@dataclass(frozen=True)
class System:
    """One column of the comparison: a name and the config overrides that make it."""

    name: str
    overrides: tuple[str, ...]


SYSTEMS = (
    System("vLLM v1 (block 16)", ("scheduler.policy=vllm-v1", "allocator.block_size=16")),
    System("SGLang (page 1)", ("scheduler.policy=sglang", "allocator.block_size=1",
                               "scheduler.enable_mixed_chunk=false")),
    System("SGLang (page 1, mixed chunk)", ("scheduler.policy=sglang", "allocator.block_size=1",
                                            "scheduler.enable_mixed_chunk=true")),
)

COLUMNS = {  # table column -> summary key
    "mean_ttft_ms": "mean_ttft_ms", "p50_ttft_ms": "median_ttft_ms", "p99_ttft_ms": "p99_ttft_ms",
    "req_per_s": "request_throughput", "tok_per_s": "total_token_throughput",
    "token_states_perc": "mem_token_states_perc", "reserved_perc": "mem_reserved_perc",
    "internal_frag_perc": "mem_internal_frag_perc", "stranded_free_perc": "mem_stranded_free_perc",
    "idle_free_perc": "mem_idle_free_perc",
}


def _tiny_overrides(config: str) -> list[str]:
    """Overrides that keep a workload's first :data:`TINY_REQUESTS` requests."""
    if config == "fewshot.yaml":
        return [f"workload.num_requests={TINY_REQUESTS}"]
    return [f"workload.window.num_requests={TINY_REQUESTS}"]


def run_comparison(*, tiny: bool = False, systems: Sequence[System] = SYSTEMS,
                   config_dir: Path = CONFIG_DIR,
                   workloads: Sequence[str] = tuple(WORKLOADS)) -> pd.DataFrame:
    """One row per (workload, system), in ``workloads`` x ``systems`` order (``workloads``:
    names of :data:`WORKLOADS`, so a test can run the cheap ones alone)."""
    rows = []
    for workload in workloads:
        config, extra = WORKLOADS[workload]
        for system in systems:
            overrides = [*system.overrides, *extra, *(_tiny_overrides(config) if tiny else [])]
            cfg, base = load_config(config_dir / config, overrides)
            result = run_experiment(cfg, base)
            s, req = result.summary, result.requests
            prompts = int(req["prompt_tokens"].sum())
            hits = int(req["cached_prompt_tokens"].clip(upper=req["prompt_tokens"]).sum())
            row = {"workload": workload, "system": system.name, "requests": s["num_requests"],
                   "completed": s["completed"], "preemptions": s["num_preemptions"],
                   "hit_ratio_perc": 100.0 * hits / prompts if prompts else 0.0}
            row.update({col: float(s[key]) for col, key in COLUMNS.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def markdown_table(df: pd.DataFrame) -> str:
    """The README's table: hit ratio, TTFT, throughput, the two largest memory classes."""
    lines = ["| workload | system | prompt tokens from cache | TTFT mean / p50 / p99 (ms) | "
             "throughput (req/s, tok/s) | preemptions | token states / reserved / idle free (% of KV) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(
            f"| {r.workload} | {r.system} | {r.hit_ratio_perc:.1f}% | "
            f"{r.mean_ttft_ms:,.0f} / {r.p50_ttft_ms:,.0f} / {r.p99_ttft_ms:,.0f} | "
            f"{r.req_per_s:.2f}, {r.tok_per_s:,.0f} | {r.preemptions} | "
            f"{r.token_states_perc:.1f} / {r.reserved_perc:.1f} / {r.idle_free_perc:.1f} |")
    return "\n".join(lines)


def plot_comparison(df: pd.DataFrame, path: Path) -> Path:
    """Two panels, one group of bars per workload, one bar per system: prompt tokens from
    cache (%) and mean TTFT (ms, log scale: the overloaded Mooncake head waits seconds)."""
    workloads = list(dict.fromkeys(df["workload"]))
    systems = list(dict.fromkeys(df["system"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(systems)
    for ax, column, label in ((axes[0], "hit_ratio_perc", "prompt tokens from cache (%)"),
                              (axes[1], "mean_ttft_ms", "mean TTFT (ms)")):
        for i, system in enumerate(systems):
            sub = df[df["system"] == system].set_index("workload").reindex(workloads)
            xs = [w + (i - (len(systems) - 1) / 2) * width for w in range(len(workloads))]
            ax.bar(xs, sub[column], width, label=system, color=f"C{i}")
        ax.set_xticks(range(len(workloads)), [textwrap.fill(w, 16) for w in workloads], fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("vLLM v1 block cache vs SGLang radix cache (Llama-3-8B, H100)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/sglang_vs_vllm"))
    parser.add_argument("--tiny", action="store_true", help=f"first {TINY_REQUESTS} requests per workload")
    args = parser.parse_args(argv)
    try:
        claim_folder(args.out)  # kvsim's, or refused before anything runs (simulator.outputs)
    except OutputError as e:
        raise SystemExit(f"error: {e}") from None
    df = run_comparison(tiny=args.tiny)
    with atomic_write(args.out / "table.csv") as tmp:
        df.to_csv(tmp, index=False)
    with atomic_write(args.out / "table.md") as tmp:
        tmp.write_text(markdown_table(df) + "\n")
    print(markdown_table(df))
    print(f"plot: {plot_comparison(df, args.out / 'sglang_vs_vllm.png')}")


if __name__ == "__main__":
    main()
