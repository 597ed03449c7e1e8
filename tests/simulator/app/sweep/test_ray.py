"""The Ray executor (a local 2-CPU Ray) gives the same table as the local process pool."""

import copy

import pandas as pd

from kvsim.simulator.app.sweep import load_sweep, run_sweep

MISSING_TRACE = {"trace": {"format": "azure", "path": "/nonexistent/kvsim-missing-trace.csv"}}


def test_ray_on_two_local_cpus_gives_the_local_executors_table(write_sweep, tiny_base):
    other = copy.deepcopy(tiny_base["workload"])
    other["arrivals"]["rate"] = 20.0
    path = write_sweep(
        {
            "grid": {"allocator.block_size": [8, 32]},
            "zip": {
                "label": ["a", "broken", "b"],
                "workload": [tiny_base["workload"], MISSING_TRACE, other],
            },
        }
    )
    local = run_sweep(load_sweep(path, name="local"), "local", workers=2)
    ray = run_sweep(load_sweep(path, name="ray"), "ray", workers=2)
    assert ray.executed == local.executed == 6
    # Every column is identical, row for row (wall-clock time is in run_info.json, not the table).
    pd.testing.assert_frame_equal(ray.table, local.table)
    assert list(ray.table["status"]) == ["ok", "failed", "ok"] * 2
    # The driver wrote the Ray runs' folders: the same files as the pool's workers wrote.
    for run_id in ray.table.loc[ray.table["status"] == "ok", "run_id"]:
        names = sorted(p.name for p in (ray.dir / "runs" / run_id).iterdir())
        assert names == sorted(p.name for p in (local.dir / "runs" / run_id).iterdir())
        assert "requests.parquet" in names


def test_an_unreachable_ray_address_fails_fast_with_one_line(write_sweep, capsys):
    from kvsim.simulator.app.cli import main

    path = write_sweep({"grid": {"allocator.block_size": [16]}})
    assert (
        main(["sweep", str(path), "--executor", "ray", "--address", "127.0.0.1:1", "--no-progress"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Ray cluster answers at 127.0.0.1:1" in err
