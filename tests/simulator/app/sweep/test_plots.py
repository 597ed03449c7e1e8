"""``kvsim plot``: the figures that apply to a sweep or a run folder, as PNG and SVG."""

import pandas as pd
import pytest

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.plot_cli import group_labels, plot_results, sustainable_from_curve
from kvsim.simulator.app.rate_search import SustainabilityCriterion
from kvsim.simulator.app.sweep import load_sweep, run_sweep


def _assert_figures(paths, stems):
    assert sorted({p.stem for p in paths}) == sorted(stems)
    for p in paths:
        data = p.read_bytes()
        if p.suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
        else:
            assert p.suffix == ".svg" and b"<svg" in data[:2000]
    assert sorted(p.suffix for p in paths) == sorted([".png", ".svg"] * len(stems))


def test_block_size_and_preemption_sweep_gets_its_figures(write_sweep, tiny_base):
    tiny_base["hardware"]["kv_cache_gib"] = 0.5  # tight memory: preemptions happen
    path = write_sweep(
        {
            "grid": {"allocator.block_size": [8, 32]},
            "zip": {"preemption.mode": ["swap", "recompute"]},
        },
        base=tiny_base,
    )
    result = run_sweep(load_sweep(path), workers=1)
    assert (result.table["num_preemptions"] > 0).all()
    paths = plot_results(result.dir)
    _assert_figures(
        paths, ["memory_breakdown", "batched_requests", "block_size", "swap_vs_recompute"]
    )
    assert all(p.parent == result.dir / "plots" for p in paths)
    svg = (result.dir / "plots" / "block_size.svg").read_text()
    assert "block size (tokens)" in svg and "internal fragmentation (% of KV cache)" in svg
    assert "mode=swap" in svg and "mode=recompute" in svg  # one line per system, in the legend


def test_rate_search_sweep_marks_each_systems_sustainable_rate(write_sweep, tiny_base, capsys):
    path = write_sweep(
        {
            "zip": {"label": ["small-blocks", "huge-blocks"], "allocator.block_size": [16, 256]},
            "find_rate": {"lo": 1.0, "hi": 64.0, "tolerance": 4.0, "max_normalized_latency": 0.03},
        }
    )
    result = run_sweep(load_sweep(path), workers=1)
    assert main(["plot", str(result.dir)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(result.dir / "plots" / "latency_vs_rate.svg") in printed
    svg = (result.dir / "plots" / "latency_vs_rate.svg").read_text()
    for rate in result.rates["sustainable_rate"]:
        assert f"{rate:.3g} req/s" in svg  # the label of the dotted line
    assert "normalized latency (s/token)" in svg and "request rate (req/s)" in svg
    assert "small-blocks" in svg and "bound (0.03 s/token)" in svg


def test_run_folder_gets_its_memory_timeline(write_sweep):
    result = run_sweep(load_sweep(write_sweep({})), workers=1)
    run_dir = result.dir / "runs" / result.table["run_id"][0]
    paths = plot_results(run_dir)
    _assert_figures(paths, ["memory_timeline"])
    assert "share of KV cache (%)" in (run_dir / "plots" / "memory_timeline.svg").read_text()


def test_plotting_a_folder_without_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a sweep folder" in err


@pytest.mark.parametrize(
    "latencies, expected",
    [
        ([0.01, 0.02, 0.05, 0.2, 0.5], 4.0),
        ([0.01, 0.2, 0.05, 0.2, 0.5], 1.0),  # the first failure ends the sustainable range
        ([0.5, 0.6, 0.7, 0.8, 0.9], None),
        ([0.01, 0.01, 0.01, 0.01, 0.01], 16.0),
    ],
)
def test_sustainable_rate_from_a_rate_grid(latencies, expected):
    df = pd.DataFrame(
        {
            "rate": [8.0, 1.0, 4.0, 16.0, 2.0],
            "completed": 10,
            "normalized_latency_s_per_token": [latencies[i] for i in (3, 0, 2, 4, 1)],
        }
    )
    crit = SustainabilityCriterion(max_normalized_latency=0.1)
    assert sustainable_from_curve(df, "rate", crit) == expected


def test_group_labels_combine_the_system_label_and_other_varied_values():
    df = pd.DataFrame(
        {
            "system": ["vLLM", "Orca"],
            "allocator.block_size": [16, 32],
            "preemption.mode": ["swap", "swap"],
        }
    )
    assert group_labels(df, ["allocator.block_size"], use_system=True).tolist() == [
        "vLLM, block_size=16",
        "Orca, block_size=32",
    ]
    assert group_labels(df, [], use_system=False, fallback="x").tolist() == ["x", "x"]
