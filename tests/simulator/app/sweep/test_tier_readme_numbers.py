"""The README's "Cache tiers" numbers come from the shipped configs: the multi-turn table's
no-tier row (write-back) and its whole 128 GiB row are run again here and compared digit by
digit with what the README prints (a wrong number in the README, or a change that moves them,
fails); the tables' generator (``simulator/app/tier_tables.py``) is checked on a made-up sweep."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from kvsim.simulator.app import tier_tables
from kvsim.simulator.app.tier_tables import EVICTION, SIZE, WRITE, TierTable
from kvsim.simulator.config import load_config
from kvsim.simulator.engine.runner import run_experiment

ROOT = Path(__file__).resolve().parents[4]


def readme_row(size: str) -> list[str]:
    """The cells of the multi-turn table's row for ``size`` GiB."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("*Multi-turn chat*"):text.index("cache_tiers_multi_turn.png")]
    row = next(line for line in table.splitlines() if line.startswith(f"| {size} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def run(overrides: list[str]) -> dict:
    cfg, base = load_config(ROOT / "configs/tiers/multi_turn.yaml", overrides)
    return run_experiment(cfg, base).summary


@pytest.mark.parametrize("size", ["0"])
def test_the_multi_turn_rows_match_a_fresh_run(size):
    cells = readme_row(size)
    back = run([f"allocator.tiers.0.capacity_gib={size}", "allocator.tiers.0.write_policy=write-back"])
    gpu, cpu = re.findall(r"([\d.]+) \+ ([\d.]+)", cells[1])[2]  # the write-back pair
    assert float(gpu) == round(back["prefix_cache_hit_ratio"], 3)
    assert float(cpu) == round(back["tier_cpu_hit_ratio"], 3)
    assert float(cells[2].split(" / ")[1]) == round(back["mean_ttft_ms"], 1)
    split = [round(back[f"mean_ttft_{p}_ms"], 1) for p in ("queue", "load", "prefill")]
    assert [float(c) for c in cells[3].split(" / ")] == split
    assert float(cells[4]) == round(back["output_throughput"])
    assert int(cells[5].replace(",", "")) == back["tier_cpu_evictions"]


def test_the_mooncake_row_at_one_tib_matches_a_fresh_run():
    """(ARC, write-through: the first pair of hit ratios and of TTFTs, in seconds.)"""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("*Mooncake synthetic trace*"):text.index("cache_tiers_mooncake.png")]
    row = next(line for line in table.splitlines() if line.startswith("| 1024 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    cfg, base = load_config(ROOT / "configs/tiers/mooncake.yaml", [
        "allocator.tiers.0.capacity_gib=1024", "allocator.tiers.0.eviction_policy=arc",
        "allocator.tiers.0.write_policy=write-through"])
    s = run_experiment(cfg, base).summary
    gpu, cpu = re.findall(r"([\d.]+) \+ ([\d.]+)", cells[1])[0]
    assert (float(gpu), float(cpu)) == (round(s["prefix_cache_hit_ratio"], 3), round(s["tier_cpu_hit_ratio"], 3))
    assert float(cells[2].split(" / ")[0]) == round(s["mean_ttft_ms"] / 1000, 1)


def test_the_multi_turn_row_at_128_gib_is_what_the_generator_prints_for_fresh_runs():
    """The three write policies at 128 GiB (LRU), run again and put through the generator:
    the README's header and row, character by character."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("*Multi-turn chat*"):text.index("cache_tiers_multi_turn.png")]
    lines = [line for line in table.splitlines() if line.startswith("|")]
    runs = [{SIZE: 128, EVICTION: "lru", WRITE: policy, **run([
        "allocator.tiers.0.capacity_gib=128", f"allocator.tiers.0.write_policy={policy}",
        *(["allocator.tiers.0.write_after_hits=2"] if policy.endswith("hits") else [])])}
        for policy in tier_tables.WRITE_POLICIES]
    runs[1][tier_tables.AFTER_HITS] = 2
    printed = tier_tables.markdown(pd.DataFrame(runs), tier_tables.TABLES[0]).splitlines()
    assert printed[:2] == lines[:2]
    assert printed[2] == next(line for line in lines if line.startswith("| 128 |"))


def summary(size, eviction, write, gpu, cpu, ttft_s, queue_s, load_ms, prefill_ms, tok_s, evicted):
    """A made-up sweep row (the columns the generator reads, in the sweep's units)."""
    return {SIZE: size, EVICTION: eviction, WRITE: write, "status": "ok",
            "prefix_cache_hit_ratio": gpu, "tier_cpu_hit_ratio": cpu,
            "mean_ttft_ms": ttft_s * 1000, "mean_ttft_queue_ms": queue_s * 1000,
            "mean_ttft_load_ms": load_ms, "mean_ttft_prefill_ms": prefill_ms,
            "output_throughput": tok_s, "tier_cpu_evictions": evicted}


MADE_UP = pd.DataFrame([  # sizes out of order, an ARC row and a failed run to be left out
    summary(64, "lru", "write-back", 0.52049, 0.0004, 0.0312, 0.0071, 0.4, 23.06, 916.6, 183614),
    summary(64, "lru", "write-through", 0.5, 0.25, 0.04, 0.01, 0.0, 30.0, 900.0, 5),
    summary(64, "lru", "write-through-after-hits", 0.5, 0.0, 0.05, 0.01, 0.0, 40.0, 900.0, 0),
    summary(0, "lru", "write-back", 0.0, 0.0, 529.46, 529.04, 0.0, 580.84, 263.4, 0),
    summary(0, "lru", "write-through", 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0),
    summary(0, "lru", "write-through-after-hits", 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0),
    summary(0, "arc", "write-back", 0.9, 0.9, 9.0, 9.0, 9.0, 9.0, 9.0, 9),
    {**summary(0, "lru", "write-back", 0.9, 0.9, 9.0, 9.0, 9.0, 9.0, 9.0, 9), "status": "failed"},
])


def test_the_generator_formats_a_made_up_sweep_in_ms_and_in_s():
    ms = tier_tables.markdown(MADE_UP, TierTable("t", eviction="lru")).splitlines()
    assert ms[0].startswith("| CPU tier (GiB) | hits: write-through / after hits / write-back | "
                            "mean TTFT (ms): write-through / write-back | write-back TTFT: queue / "
                            "load / prefill (ms) |")
    assert ms[2:] == [
        "| 0 | 0 + 0 / 0 + 0 / 0 + 0 | 1000.0 / 529460.0 | 529040.0 / 0.0 / 580.8 | 263 | 0 |",
        "| 64 | 0.500 + 0.250 / 0.500 + 0 / 0.520 + 0.000 | 40.0 / 31.2 | 7.1 / 0.4 / 23.1 | 917"
        " | 183,614 |",
    ]
    s = tier_tables.markdown(MADE_UP, TierTable("t", eviction="lru", seconds=True)).splitlines()
    assert "mean TTFT: write-through / write-back | write-back TTFT: queue (s) / load / prefill (ms)" \
        in s[0]
    assert s[2] == "| 0 | 0 + 0 / 0 + 0 / 0 + 0 | 1.0 / 529.5 s | 529.0 / 0.0 / 580.8 | 263 | 0 |"


def test_the_generator_refuses_a_size_without_every_write_policy():
    df = MADE_UP[~((MADE_UP[SIZE] == 64) & (MADE_UP[WRITE] == "write-through"))]
    with pytest.raises(ValueError, match="size 64 GiB needs one run per write policy"):
        tier_tables.markdown(df, TierTable("t", eviction="lru"))
    with pytest.raises(ValueError, match="no run with eviction policy 'lfu'"):
        tier_tables.markdown(MADE_UP, TierTable("t", eviction="lfu"))


def test_the_command_prints_both_tables_from_the_sweep_folders(tmp_path, capsys):
    for table in tier_tables.TABLES:
        (tmp_path / table.sweep).mkdir()
        lru = MADE_UP[MADE_UP[EVICTION] == "lru"]
        lru.assign(**{EVICTION: table.eviction}).to_csv(tmp_path / table.sweep / "sweep.csv")
    tier_tables.main(["--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("| 64 | 0.500 + 0.250 / 0.500 + 0 / 0.520 + 0.000 |") == 2
    assert "| 1.0 / 529.5 s |" in out and "| 1000.0 / 529460.0 |" in out
