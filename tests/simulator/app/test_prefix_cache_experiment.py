"""The SGLang vs vLLM experiment's table comes from its configs and shows the claimed directions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvsim.simulator.app.prefix_cache_experiment import (
    CONFIG_DIR,
    SYSTEMS,
    WORKLOADS,
    markdown_table,
    plot_comparison,
    run_comparison,
)
from kvsim.simulator.app.sweep import expand_points, load_sweep, validate_points

README = Path(__file__).resolve().parents[3] / "README.md"
ALL_ROWS = tuple(WORKLOADS)
"""The README table's workloads, each run again whole (~12 s on one core)."""


@pytest.fixture(scope="module")
def table():
    return run_comparison(tiny=True)


def hit(df, workload, system):
    row = df[(df["workload"] == workload) & (df["system"] == system)]
    assert len(row) == 1
    return float(row["hit_ratio_perc"].iloc[0])


VLLM, RADIX = SYSTEMS[0].name, SYSTEMS[1].name


def test_one_row_per_workload_and_system_every_request_accounted(table):
    assert list(table["workload"]) == [w for w in WORKLOADS for _ in SYSTEMS]
    assert (table["requests"] == 120).all()
    assert (table["completed"] >= 119).all()  # Mooncake's head holds one request over the window
    classes = table[["token_states_perc", "reserved_perc", "internal_frag_perc", "stranded_free_perc",
                     "idle_free_perc"]].sum(axis=1)
    assert (classes <= 100.0 + 1e-6).all() and (classes > 80.0).all()


def test_radix_cache_hits_the_unaligned_tail_of_a_few_shot_prefix(table):
    # 341 shared tokens: the block cache can serve 336 of them, the radix cache all 341
    few = "few-shot (341-token prefix)"
    assert hit(table, few, RADIX) > hit(table, few, VLLM) + 0.5
    mooncake = "Mooncake synthetic (first 400)"
    assert hit(table, mooncake, RADIX) >= hit(table, mooncake, VLLM)


def test_multi_turn_conversations_hit_their_own_history(table):
    for system in (VLLM, RADIX):
        assert hit(table, "multi-turn chat", system) > 50.0
        assert hit(table, "Mooncake synthetic (first 400)", system) < 20.0


def test_the_table_follows_the_configs(tmp_path):
    """A block-aligned few-shot prefix (352 = 22 x 16 tokens) takes the radix cache's edge away."""
    shutil.copytree(CONFIG_DIR, tmp_path / "c")
    path = tmp_path / "c" / "fewshot.yaml"
    path.write_text(path.read_text().replace("tokens: 341", "tokens: 352"))
    df = run_comparison(tiny=True, systems=SYSTEMS[:2], config_dir=tmp_path / "c")
    few = "few-shot (341-token prefix)"  # the row's name; its config now says 352
    assert hit(df, few, RADIX) == pytest.approx(hit(df, few, VLLM), abs=0.3)


def test_table_and_plot_are_written(table, tmp_path):
    text = markdown_table(table)
    assert text.count("\n") == 1 + len(table) and "| few-shot (341-token prefix) | SGLang (page 1) |" in text
    path = plot_comparison(table, tmp_path / "p.png")
    assert path.stat().st_size > 10_000


def test_the_multi_turn_sweep_resolves_to_valid_configs():
    """sweep_multi_turn.yaml: 2 conversation rates x 4 systems, each a valid config."""
    spec = load_sweep(CONFIG_DIR / "sweep_multi_turn.yaml")
    points = expand_points(spec)
    assert len(points) == 8
    validate_points(spec, points)


def readme_rows(workloads) -> dict[tuple[str, str], list[str]]:
    """The README's "SGLang vs vLLM prefix caching" rows of ``workloads``, by (workload,
    system), as their cells."""
    text = README.read_text()
    start = text.index("SGLang vs vLLM prefix caching (`configs/sglang_vs_vllm/`)")
    table = text[start:text.index("sglang_vs_vllm.png", start)]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in workloads:
            rows[cells[0], cells[1]] = cells
    return rows


def test_the_readme_rows_match_a_fresh_run():
    """Every cell of the README's table is what the experiment prints now, character by
    character (whole workloads, not ``--tiny``)."""
    fresh = markdown_table(run_comparison(workloads=ALL_ROWS)).splitlines()[2:]
    expected = readme_rows(ALL_ROWS)
    assert len(fresh) == len(expected) == len(ALL_ROWS) * len(SYSTEMS)
    for line in fresh:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert expected[cells[0], cells[1]] == cells, line
