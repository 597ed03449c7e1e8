"""The README's "Cache tiers" numbers come from the shipped configs: the multi-turn table's
no-tier row and its 128 GiB write-back row are run again here and compared digit by digit
with what the README prints (a wrong number in the README, or a change that moves them, fails)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvsim.simulator.config import load_config
from kvsim.simulator.runner import run_experiment

ROOT = Path(__file__).resolve().parents[2]


def readme_row(size: str) -> list[str]:
    """The cells of the multi-turn table's row for ``size`` GiB."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("*Multi-turn chat*"):text.index("cache_tiers_multi_turn.png")]
    row = next(line for line in table.splitlines() if line.startswith(f"| {size} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def run(overrides: list[str]) -> dict:
    cfg, base = load_config(ROOT / "configs/tiers/multi_turn.yaml", overrides)
    return run_experiment(cfg, base).summary


@pytest.mark.parametrize("size", ["0", "128"])
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
