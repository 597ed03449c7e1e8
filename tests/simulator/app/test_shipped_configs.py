"""A config argument names a file, or a shipped config by name (``kvsim run quickstart``)."""

from __future__ import annotations

import pytest

from kvsim.simulator.app.cli import main
from kvsim.simulator.app.shipped_configs import CONFIG_DIR, find_config, shipped_names


@pytest.mark.parametrize("arg", ["quickstart", "quickstart.yaml", "configs/quickstart.yaml"])
def test_a_shipped_config_is_found_by_name_from_any_directory(arg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config(arg).resolve() == (CONFIG_DIR / "quickstart.yaml").resolve()


def test_a_file_that_exists_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("name: mine\n")
    assert find_config("quickstart").resolve() == (tmp_path / "quickstart").resolve()


def test_shipped_names_are_paths_below_configs_without_suffix():
    names = shipped_names()
    assert "quickstart" in names and "sglang_vs_vllm/mooncake" in names
    assert all(not n.endswith(".yaml") for n in names)


def test_an_unknown_name_is_a_one_line_error_listing_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "nosuch"]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("error: nosuch: no such file, nor a shipped config of that name (shipped: ")
    assert " quickstart," in err and "moe/qwen3-30b-a3b" in err
    assert list(tmp_path.iterdir()) == []  # nothing written
