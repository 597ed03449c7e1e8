"""The cache-tier sweeps (configs/tiers/): one key of a list item swept by index, and a
2-point version of each shipped sweep run end to end (config validity, tier metrics, plot)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.sweep import expand_points, load_sweep, resolve_config
from kvsim.simulator.config import ConfigError, apply_override, load_config

ROOT = Path(__file__).resolve().parents[4]
TIERS = ROOT / "configs" / "tiers"
SIZE = "allocator.tiers.0.capacity_gib"
EVICT = "allocator.tiers.0.eviction_policy"
WRITE = "allocator.tiers.0.write_policy"
AFTER = "allocator.tiers.0.write_after_hits"


def test_an_override_steps_into_a_list_by_index_and_creates_missing_sections():
    raw = {"allocator": {"tiers": [{"name": "cpu", "capacity_gib": 1}, {"name": "disk"}]}}
    apply_override(raw, ["allocator", "tiers", "1", "capacity_gib"], 64)
    apply_override(raw, ["workload", "window", "num_requests"], 5)
    assert raw == {"allocator": {"tiers": [{"name": "cpu", "capacity_gib": 1},
                                           {"name": "disk", "capacity_gib": 64}]},
                   "workload": {"window": {"num_requests": 5}}}


@pytest.mark.parametrize("keys, message", [
    (["allocator", "tiers", "2", "capacity_gib"], "allocator.tiers.2.capacity_gib: tiers is a list of 2 items; "
     "2 is not an index .0..1."),
    (["allocator", "tiers", "cpu"], "tiers is a list of 2 items; cpu is not an index"),
    (["allocator", "kind", "x"], "allocator.kind.x: kind is not a section"),
])
def test_a_bad_step_is_a_one_line_error(keys, message):
    raw = {"allocator": {"kind": "paged", "tiers": [{"name": "cpu"}, {"name": "disk"}]}}
    with pytest.raises(ConfigError, match=message):
        apply_override(raw, keys, 1)


def test_the_shipped_sweeps_vary_size_eviction_and_write_policy_of_the_cpu_tier():
    for name, sizes in (("sweep_mooncake.yaml", [0, 64, 256, 1024, 2048, 4096, 8192]),
                        ("sweep_multi_turn.yaml", [0, 8, 32, 128, 512])):
        spec = load_sweep(TIERS / name)
        points = expand_points(spec)
        assert len(points) == len(sizes) * 4 * 3
        cfgs = [resolve_config(spec, p) for p in points]
        tiers = [c.allocator.tiers for c in cfgs]
        assert all(len(t) == 1 and t[0].name == "cpu" for t in tiers)
        assert sorted({t[0].capacity_gib for t in tiers}) == sizes
        assert {t[0].eviction_policy for t in tiers} == {"lru", "lfu", "arc", "priority"}
        assert {(t[0].write_policy, t[0].write_after_hits) for t in tiers} == {
            ("write-through", None), ("write-through-after-hits", 2), ("write-back", None)}
        assert all(c.scheduler.policy == "vllm-v1" and c.allocator.prefix_caching for c in cfgs)
    # the experiment files alone run one point each
    for name in ("mooncake.yaml", "multi_turn.yaml"):
        cfg, _ = load_config(TIERS / name)
        assert [t.name for t in cfg.allocator.tiers] == ["cpu"]


@pytest.mark.parametrize("sweep, shrink, tier_hits", [
    ("sweep_multi_turn.yaml", ["workload.multi_turn.conversations=12", "hardware.kv_cache_gib=1"], True),
    ("sweep_mooncake.yaml", ["workload.window.num_requests=12", "hardware.kv_cache_gib=8",
                             "model.context_len_tokens=32768"], False),
])
def test_a_two_point_version_of_the_sweep_runs_and_plots(sweep, shrink, tier_hits, tmp_path, capsys):
    """The shipped sweep, cut to 2 points (a tier of 0 and of 8 GiB, LRU, write-back) on a
    few requests: every run ok, the tier metrics in the table, the tier figure drawn. On 12
    conversations with a 1 GiB GPU cache, the tier serves turns the GPU evicted: prefill time
    moves to (shorter) load waits."""
    args = ["sweep", str(TIERS / sweep), "--out", str(tmp_path), "--workers", "1", "--no-progress",
            "--plot", "--grid", f"{SIZE}=0,8", "--grid", f"{EVICT}=lru", "--zip", "label=write-back",
            "--zip", f"{WRITE}=write-back", "--zip", f"{AFTER}=null"]
    for text in shrink:
        args += ["--set", text]
    assert main(args) == 0, capsys.readouterr().err
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    table = pd.read_parquet(folder / "sweep.parquet")
    assert list(table["status"]) == ["ok", "ok"]
    assert list(table[SIZE]) == [0, 8]
    for col in ("prefix_cache_hit_ratio", "tier_cpu_hit_ratio", "tier_cpu_store_bytes",
                "mean_ttft_queue_ms", "mean_ttft_load_ms", "mean_ttft_prefill_ms"):
        assert col in table, col
    empty = table[table[SIZE] == 0].iloc[0]
    assert empty["tier_cpu_hit_ratio"] == 0 and empty["tier_cpu_store_bytes"] == 0
    assert empty["mean_ttft_load_ms"] == 0
    tier = table[table[SIZE] == 8].iloc[0]
    if tier_hits:
        assert tier["tier_cpu_hit_ratio"] > 0.1 and tier["mean_ttft_load_ms"] > 0
        assert tier["mean_ttft_prefill_ms"] < empty["mean_ttft_prefill_ms"]
        assert tier["mean_ttft_ms"] < empty["mean_ttft_ms"]
    assert (folder / "plots" / "cache_tiers.png").is_file()
