"""Sweep files and grid expansion: the points, their configs, and errors before any run."""

import itertools

import pytest
import yaml

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.results import config_hash
from kvsim.simulator.app.sweep import (
    SweepError,
    expand_points,
    load_sweep,
    parse_axis,
    resolve_config,
    run_sweep,
)
from kvsim.simulator.config import validate_config
from kvsim.simulator.engine.runner import run_experiment


def test_points_are_the_grid_product_times_the_zip_rows_last_axis_fastest(write_sweep):
    path = write_sweep(
        {
            "grid": {"allocator.block_size": [8, 16], "scheduler.max_num_seqs": [4, 64, 256]},
            "zip": {
                "label": ["vLLM", "Orca-Max"],
                "allocator.kind": ["paged", "contiguous"],
                "allocator.preset": [None, "orca-max"],
            },
        }
    )
    points = expand_points(load_sweep(path))
    expected = [
        (b, m, z)
        for b, m, z in itertools.product(
            [8, 16], [4, 64, 256], [("vLLM", "paged", None), ("Orca-Max", "contiguous", "orca-max")]
        )
    ]
    got = [
        (
            p.params["allocator.block_size"],
            p.params["scheduler.max_num_seqs"],
            (p.params["label"], p.params["allocator.kind"], p.params["allocator.preset"]),
        )
        for p in points
    ]
    assert got == expected
    assert [p.index for p in points] == list(range(12))
    assert [p.label for p in points[:2]] == ["vLLM", "Orca-Max"]


def test_without_label_the_system_is_named_by_the_varied_values(write_sweep):
    path = write_sweep(
        {"grid": {"allocator.block_size": [8], "preemption.mode": ["swap", "recompute"]}}
    )
    assert [p.label for p in expand_points(load_sweep(path))] == [
        "block_size=8, mode=swap",
        "block_size=8, mode=recompute",
    ]


def test_each_config_is_the_base_with_set_then_axis_values(write_sweep):
    path = write_sweep(
        {
            "set": {"workload.num_requests": 25, "scheduler.max_num_seqs": 7},
            "grid": {"allocator.block_size": [32, 64]},
        }
    )
    spec = load_sweep(path)
    cfgs = [resolve_config(spec, p) for p in expand_points(spec)]
    assert [c.allocator.block_size for c in cfgs] == [32, 64]
    assert all(c.workload.num_requests == 25 and c.scheduler.max_num_seqs == 7 for c in cfgs)
    assert all(c.workload.arrivals.rate == 8.0 for c in cfgs)  # untouched base value


@pytest.mark.parametrize(
    "text, key, values",
    [
        ("allocator.block_size=1,2,4", "allocator.block_size", (1, 2, 4)),
        ("allocator.block_size=[8, 16]", "allocator.block_size", (8, 16)),
        ("allocator.preset=null,orca-max", "allocator.preset", (None, "orca-max")),
        ("workload.arrivals.rate=0.5", "workload.arrivals.rate", (0.5,)),
    ],
)
def test_command_line_axes_parse_as_yaml_values(text, key, values):
    assert parse_axis(text) == (key, values)


def test_an_invalid_value_names_the_sweep_file_line_and_nothing_runs(write_sweep, tmp_path):
    path = write_sweep({"grid": {"allocator.block_size": [16, 3]}})
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == "- 3"
    )
    with pytest.raises(SweepError) as err:
        run_sweep(load_sweep(path), workers=1)
    msg = str(err.value)
    assert f"{path}:{line}: allocator.block_size: must be a power of two" in msg
    assert "1 of 2 runs are invalid" in msg
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "body, needle",
    [
        (
            {"zip": {"allocator.kind": ["paged", "contiguous"], "allocator.preset": [None]}},
            "every axis needs the same number of values",
        ),
        ({"grids": {"allocator.block_size": [8]}}, "grids: unknown key; allowed: name"),
        (
            {"grid": {"allocator.block_size": 8}},
            "grid.allocator.block_size: must be a non-empty list",
        ),
        (
            {"set": {"allocator.block_size": 8}, "grid": {"allocator.block_size": [8, 16]}},
            "both set for every run",
        ),
        ({"grid": {"allocator.block_sise": [8]}}, "allocator.block_sise: unknown key"),
        ({"find_rate": {"lo": 4, "hi": 2}}, "find_rate: lo (4) must be below hi (2)"),
    ],
)
def test_bad_sweep_files_fail_with_one_clear_message(write_sweep, body, needle):
    path = write_sweep(body)
    with pytest.raises(SweepError, match=None) as err:
        run_sweep(load_sweep(path), workers=1)
    assert needle in str(err.value)


def test_points_that_resolve_to_the_same_config_run_once(write_sweep):
    path = write_sweep({"zip": {"label": ["A", "B"], "allocator.block_size": [16, 16]}})
    calls = []

    def counting(job):
        from kvsim.simulator.app.executors import execute_run

        calls.append(job.run_id)
        return execute_run(job)

    from kvsim.simulator.app.executors import InProcessExecutor

    result = run_sweep(load_sweep(path), InProcessExecutor(counting))
    assert len(calls) == 1
    assert list(result.table["system"]) == ["A", "B"]
    assert result.table["run_id"].nunique() == 1 and (result.table["status"] == "ok").all()


def test_cli_sweeps_a_plain_config_and_each_row_matches_a_direct_run(tmp_path, tiny_base, capsys):
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_base))
    rc = main(
        [
            "sweep",
            str(cfg_path),
            "--grid",
            "allocator.block_size=8,32",
            "--set",
            "seed=3",
            "--workers",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    import pandas as pd

    (folder,) = (tmp_path / "out").glob("tiny-sweep-grid-block_size-*")  # named by what was swept
    table = pd.read_parquet(folder / "sweep.parquet")
    assert list(table["allocator.block_size"]) == [8, 32] and (table["status"] == "ok").all()
    for block, (_, row) in zip((8, 32), table.iterrows()):
        raw = dict(tiny_base, seed=3, allocator={"kind": "paged", "block_size": block})
        cfg = validate_config(raw)
        direct = run_experiment(cfg, tmp_path).summary
        assert row["run_id"] == config_hash(cfg)
        assert row["normalized_latency_s_per_token"] == direct["normalized_latency_s_per_token"]
        assert row["mean_batched_requests"] == direct["mean_batched_requests"]
    assert "sweep.parquet" in capsys.readouterr().out


def test_dry_run_validates_and_lists_points_without_running(write_sweep, tmp_path, capsys):
    path = write_sweep({"grid": {"allocator.block_size": [8, 16, 32]}})
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 runs, all valid" in out and "block_size=32" in out
    assert not (tmp_path / "results" / "s" / "runs").exists()


def test_errors_in_zipped_axes_point_at_each_runs_own_value(write_sweep):
    path = write_sweep({"zip": {"label": ["a", "b"], "allocator.block_size": [3, 3]}})
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == "- 3"]
    with pytest.raises(SweepError) as err:
        run_sweep(load_sweep(path), workers=1)
    msg = str(err.value)
    assert f"run 0 [a]: {path}:{lines[0]}: allocator.block_size" in msg
    assert f"run 1 [b]: {path}:{lines[1]}: allocator.block_size" in msg
