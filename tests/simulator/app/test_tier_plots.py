"""The cache-tier sweep figure: its lines and bars carry the sweep table's numbers, and
``kvsim plot`` draws it for a sweep whose tier size varies (one line per policy)."""

from __future__ import annotations

import itertools
import json

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from kvsim.simulator.app import plot_cli, plots

SIZE = "allocator.tiers.0.capacity_gib"
EVICT = "allocator.tiers.0.eviction_policy"
WRITE = "allocator.tiers.0.write_policy"
SIZES = (0.0, 8.0, 32.0, 128.0)
POLICIES = (("lru", "write-through"), ("lru", "write-back"), ("arc", "write-through"),
            ("arc", "write-back"))


def row(size: float, evict: str, write: str) -> dict:
    """Made-up summary numbers, distinct for every (size, policy): a figure that mixed up two
    rows or two columns shows a wrong value somewhere."""
    p = POLICIES.index((evict, write))
    s = SIZES.index(size)
    return {
        SIZE: size, EVICT: evict, WRITE: write, "system": write, "status": "ok", "error": None,
        "prefix_cache_hit_ratio": 0.10 + 0.01 * p,
        "tier_cpu_hit_ratio": 0.05 * s + 0.001 * p,
        "mean_ttft_ms": 100.0 - 10 * s + p,
        "output_throughput": 1000.0 + 50 * s + p,
        "mean_ttft_queue_ms": 60.0 - 8 * s + p,
        "mean_ttft_load_ms": 2.0 * s + 0.5 * p,
        "mean_ttft_prefill_ms": 40.0 - 4 * s + 0.25 * p,
    }


@pytest.fixture
def table() -> pd.DataFrame:
    rows = [row(s, e, w) for s, (e, w) in itertools.product(SIZES, POLICIES)]
    return pd.DataFrame(rows)


def curves_of(table: pd.DataFrame) -> dict:
    return {(e, w): table[(table[EVICT] == e) & (table[WRITE] == w)] for e, w in POLICIES}


def test_each_panel_draws_one_line_per_policy_through_the_table_s_values(table):
    fig = plots.tier_sweep_figure(curves_of(table), SIZE, ["cpu"])
    gpu, cpu, ttft, tput, split = fig.axes
    columns = {gpu: "prefix_cache_hit_ratio", cpu: "tier_cpu_hit_ratio", ttft: "mean_ttft_ms",
               tput: "output_throughput"}
    for ax, col in columns.items():
        assert [line.get_label() for line in ax.get_lines()] == [f"{e}, {w}" for e, w in POLICIES]
        for line, (e, w) in zip(ax.get_lines(), POLICIES):
            assert list(line.get_xdata()) == list(SIZES)
            assert list(line.get_ydata()) == pytest.approx([row(s, e, w)[col] for s in SIZES])
    assert gpu.get_ylim() == (0, 1) and cpu.get_ylim() == (0, 1)
    assert "cpu tier hit ratio" in cpu.get_ylabel() and "TTFT" in ttft.get_ylabel()
    # one colour per eviction policy, one dash per write policy
    lines = dict(zip(POLICIES, gpu.get_lines()))
    color = {k: mcolors.to_hex(v.get_color()) for k, v in lines.items()}
    dash = {k: v.get_linestyle() for k, v in lines.items()}
    assert color[("lru", "write-through")] == color[("lru", "write-back")] != color[("arc", "write-back")]
    assert dash[("lru", "write-through")] == dash[("arc", "write-through")] != dash[("lru", "write-back")]


def test_the_split_stacks_queue_load_and_prefill_for_every_policy_and_size(table):
    fig = plots.tier_sweep_figure(curves_of(table), SIZE, ["cpu"])
    split = fig.axes[-1]
    bars = split.patches
    parts = [c for c, _, _ in plots.TTFT_PARTS]
    assert len(bars) == len(POLICIES) * len(parts) * len(SIZES)
    # bars are drawn policy by policy, part by part, size by size
    it = iter(bars)
    for e, w in POLICIES:
        by_part = {c: [next(it) for _ in SIZES] for c in parts}
        for i, s in enumerate(SIZES):
            r = row(s, e, w)
            stack = [by_part[c][i] for c in parts]
            assert [b.get_height() for b in stack] == pytest.approx([r[c] for c in parts])
            assert [b.get_y() for b in stack] == pytest.approx(
                [0.0, r[parts[0]], r[parts[0]] + r[parts[1]]])
            assert stack[-1].get_y() + stack[-1].get_height() == pytest.approx(
                sum(r[c] for c in parts))
            assert round(stack[0].get_x() + stack[0].get_width() / 2) == i  # at its size's slot
    labels = [t.get_text() for t in split.get_legend().get_texts()]
    assert labels == ["queueing", "load wait", "prefill"]
    assert [t.get_text() for t in split.get_xticklabels()] == ["0", "8", "32", "128"]


def test_a_missing_tier_column_draws_nan_not_zero(table):
    """A sweep without a tier's column must not pretend the tier hit nothing."""
    fig = plots.tier_sweep_figure(curves_of(table.drop(columns="tier_cpu_hit_ratio")), SIZE, ["cpu"])
    assert all(np.isnan(line.get_ydata()).all() for line in fig.axes[1].get_lines())


def test_kvsim_plot_draws_cache_tiers_for_a_sweep_whose_tier_size_varies(table, tmp_path, monkeypatch):
    table.to_parquet(tmp_path / "sweep.parquet")
    meta = {"name": "tiny-tiers", "params": [SIZE, EVICT, WRITE],
            "grid": {SIZE: list(SIZES), EVICT: ["lru", "arc"]},
            "zip": {"label": ["write-through", "write-back"], WRITE: ["write-through", "write-back"]}}
    (tmp_path / "sweep.json").write_text(json.dumps(meta))
    seen = {}
    draw = plots.plot_tier_sweep

    def spy(curves, path, **kwargs):
        seen.update(curves=curves, **kwargs)
        return draw(curves, path, **kwargs)

    monkeypatch.setattr(plots, "plot_tier_sweep", spy)
    written = plot_cli.plot_results(tmp_path)
    assert tmp_path / "plots" / "cache_tiers.png" in written
    assert (tmp_path / "plots" / "cache_tiers.png").stat().st_size > 10_000
    assert (tmp_path / "plots" / "cache_tiers.svg").is_file()
    # a policy is the eviction policy (colour) then the sweep's label (dash)
    assert list(seen["curves"]) == [("lru", "write-through"), ("lru", "write-back"),
                                    ("arc", "write-through"), ("arc", "write-back")]
    assert all(sorted(df[SIZE]) == list(SIZES) for df in seen["curves"].values())
    assert seen["size_col"] == SIZE and seen["tiers"] == ["cpu"]
    assert seen["size_label"] == "cpu tier size (GiB)"


def test_a_sweep_without_tiers_draws_no_tier_figure(table, tmp_path):
    table = table[table[SIZE] == 8.0]  # the size does not vary
    table.to_parquet(tmp_path / "sweep.parquet")
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "t", "params": [SIZE, EVICT, WRITE]}))
    written = plot_cli.plot_results(tmp_path)
    assert written and not any("cache_tiers" in p.name for p in written)
