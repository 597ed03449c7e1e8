"""The README's two cache-tier tables, built from the sweeps of ``configs/tiers/``.

Each table reads one sweep's ``sweep.csv`` (one row per run: the tier's size, eviction
policy and write policy, and the run's summary), keeps one eviction policy, and prints a row
per tier size; each row puts the three write policies side by side::

    | CPU tier (GiB) | hits: write-through / after 2 hits / write-back | mean TTFT: write-through
      / write-back | write-back TTFT: queue / load / prefill | output tok/s | CPU evictions |

A hit cell is GPU hit ratio + CPU tier hit ratio (``0`` when the tier served nothing);
throughput, the TTFT split and evictions are the write-back run's. The Mooncake trace
overloads the H100, so its mean TTFT and queueing are in seconds (:attr:`TierTable.seconds`).

    python -m kvsim.simulator.app.tier_tables [--results results]

prints both tables from ``results/tiers-multi-turn/sweep.csv`` and
``results/tiers-mooncake/sweep.csv`` (written by ``kvsim sweep configs/tiers/sweep_*.yaml``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

SIZE = "allocator.tiers.0.capacity_gib"
EVICTION = "allocator.tiers.0.eviction_policy"
WRITE = "allocator.tiers.0.write_policy"
AFTER_HITS = "allocator.tiers.0.write_after_hits"
WRITE_POLICIES = ("write-through", "write-through-after-hits", "write-back")
"""The hit cell's order; the TTFT cell shows the first and the last."""


@dataclass(frozen=True)
class TierTable:
    """How one README table reads its sweep."""

    sweep: str  # the sweep's name: its results folder
    eviction: str  # the tier eviction policy whose runs make the rows
    seconds: bool = False  # mean TTFT and its queueing part in s (an overloaded run), else ms


TABLES = (
    TierTable("tiers-multi-turn", eviction="lru"),
    TierTable("tiers-mooncake", eviction="arc", seconds=True),
)


def _ratio(x: float) -> str:
    """A hit ratio to 3 decimals; exactly 0 as ``0`` (a tier that served nothing)."""
    return "0" if x == 0 else f"{x:.3f}"


def _hits(run: pd.Series) -> str:
    return f"{_ratio(run['prefix_cache_hit_ratio'])} + {_ratio(run['tier_cpu_hit_ratio'])}"


def header(table: TierTable, after_hits: int | None) -> list[str]:
    """The table's two header lines; ``after_hits``: the sweep's write_after_hits."""
    after = f"after {after_hits} hits" if after_hits is not None else "after hits"
    if table.seconds:
        ttft, split = "mean TTFT: write-through / write-back", "queue (s) / load / prefill (ms)"
    else:
        ttft, split = "mean TTFT (ms): write-through / write-back", "queue / load / prefill (ms)"
    return [f"| CPU tier (GiB) | hits: write-through / {after} / write-back | {ttft} | "
            f"write-back TTFT: {split} | output tok/s | CPU evictions (write-back) |",
            "|---:|---:|---:|---:|---:|---:|"]


def row(size: float, runs: dict[str, pd.Series], seconds: bool = False) -> str:
    """One size's line from its runs by write policy (:data:`WRITE_POLICIES`)."""
    through, back = runs["write-through"], runs["write-back"]
    scale, unit = (1000.0, " s") if seconds else (1.0, "")
    hits = " / ".join(_hits(runs[p]) for p in WRITE_POLICIES)
    ttft = f"{through['mean_ttft_ms'] / scale:.1f} / {back['mean_ttft_ms'] / scale:.1f}{unit}"
    split = " / ".join(f"{back[f'mean_ttft_{part}_ms'] / (scale if part == 'queue' else 1):.1f}"
                       for part in ("queue", "load", "prefill"))
    return (f"| {size:g} | {hits} | {ttft} | {split} | {back['output_throughput']:.0f} | "
            f"{int(back['tier_cpu_evictions']):,} |")


def markdown(df: pd.DataFrame, table: TierTable) -> str:
    """The table from sweep rows (:data:`SIZE`, :data:`EVICTION`, :data:`WRITE` and summary
    columns), sizes ascending. A size missing a write policy, or a failed run, is an error:
    a README row must not quietly mix policies."""
    if "status" in df:
        df = df[df["status"] == "ok"]
    runs = df[df[EVICTION] == table.eviction]
    if runs.empty:
        raise ValueError(f"{table.sweep}: no run with eviction policy {table.eviction!r}")
    after = runs.loc[runs[WRITE] == "write-through-after-hits", AFTER_HITS].dropna().unique() \
        if AFTER_HITS in runs else []
    lines = header(table, int(after[0]) if len(after) == 1 else None)
    for size, at in runs.groupby(SIZE, sort=True):
        by_policy = {p: at[at[WRITE] == p] for p in WRITE_POLICIES}
        if any(len(r) != 1 for r in by_policy.values()):
            counts = {p: len(r) for p, r in by_policy.items()}
            raise ValueError(f"{table.sweep}: size {size:g} GiB needs one run per write policy, "
                             f"has {counts}")
        lines.append(row(size, {p: r.iloc[0] for p, r in by_policy.items()}, table.seconds))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="the sweeps' output folder (default: results)")
    args = parser.parse_args(argv)
    missing = [t.sweep for t in TABLES if not (args.results / t.sweep / "sweep.csv").is_file()]
    if missing:
        raise SystemExit(f"error: no {' or '.join(str(args.results / m / 'sweep.csv') for m in missing)}: run "
                         + " and ".join(f"kvsim sweep configs/tiers/sweep_{m.removeprefix('tiers-').replace('-', '_')}"
                                        f".yaml" for m in missing) + " first (or give --results)")
    for table in TABLES:
        df = pd.read_csv(args.results / table.sweep / "sweep.csv")
        print(f"{table.sweep} ({table.eviction}):\n{markdown(df, table)}\n")


if __name__ == "__main__":
    main()
