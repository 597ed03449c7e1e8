"""``benchmarks.compare``: the side-by-side bench's overrides, its rotation of the trees, its
minimum-of-repeats table, and its check that both sides did the same work (no subprocess:
``run_once`` is replaced by a fake that returns scripted timings)."""

from pathlib import Path

import pytest

import benchmarks.compare as compare_mod
from benchmarks.compare import Side, compare, parse_overrides


def test_overrides_parse_case_key_and_value():
    assert parse_overrides(["*:cost_model.efficiencies=hand-picked", "c:hardware.kv_cache_gb=13.5"],
                           "--new-set") == [("*", "cost_model.efficiencies", "hand-picked"),
                                            ("c", "hardware.kv_cache_gb", "13.5")]


@pytest.mark.parametrize("bad", ["hardware.x=1", "c:hardware.x", ":x=1", "c:=1"])
def test_a_malformed_override_is_a_one_line_error(bad):
    with pytest.raises(SystemExit) as err:
        parse_overrides([bad], "--old-set")
    assert str(err.value) == f"--old-set {bad!r}: expected CASE:dotted.key=value (CASE may be *)"


def test_side_keeps_the_least_time_and_the_median_spread():
    side = Side(walls_s=[2.0, 1.0, 1.5], cpus_s=[0.9, 0.8, 1.2])
    assert side.best_s == 1.0 and side.best_cpu_s == 0.8
    assert side.noise == pytest.approx(0.5)  # median 1.5 over min 1.0


def _fake_runs(monkeypatch, walls: dict[str, list[float]], work: dict[str, int]):
    """Replace ``run_once``: tree ``name`` returns its next scripted wall time; record the order."""
    order: list[str] = []
    left = {k: list(v) for k, v in walls.items()}

    def run_once(tree: Path, case: str, overrides):
        order.append(tree.name)
        wall = left[tree.name].pop(0)
        return {"wall_s": wall, "cpu_s": wall / 2, "iterations": work[tree.name], "rows": 1, "completed": 1}

    monkeypatch.setattr(compare_mod, "run_once", run_once)
    return order


def test_trees_take_turns_and_the_table_shows_the_least_time(monkeypatch):
    order = _fake_runs(monkeypatch, {"old": [1.0, 1.2, 1.1], "new": [1.5, 1.1, 1.3]}, {"old": 7, "new": 7})
    table = compare(Path("old"), [Path("new")], ["d10k"], 3, [], [])
    assert order == ["old", "new", "new", "old", "old", "new"]  # the first runner alternates
    row = table.splitlines()[2]
    assert row.startswith("| d10k | new | 1.000 | 1.100 | +10.0% | 0.500 | 0.550 | +10.0% |")
    assert row.endswith("| yes |")


def test_a_case_whose_work_differs_is_marked(monkeypatch):
    _fake_runs(monkeypatch, {"old": [1.0], "new": [1.0]}, {"old": 7, "new": 8})
    row = compare(Path("old"), [Path("new")], ["a"], 1, [], []).splitlines()[2]
    assert "NO: old {'iterations': 7" in row and "new {'iterations': 8" in row
