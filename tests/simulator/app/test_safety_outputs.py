"""No data loss, no writing outside the results folder, and outputs that say only what is true.

The commands are run as written, from inside a throwaway copy of a checkout
(``tmp_path/home/repo``, with a ``.git`` and earlier results), and every file under
``tmp_path`` is compared before and after: a command may add files only where it should.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console
from run_configs import TINY

from kvsim.simulator.app.cli import main, rates_table, summary_table, sweep_table
from kvsim.simulator.app.display import fmt_cell, fmt_number
from kvsim.simulator.app.results import MARKER, RUN_INFO

README = Path(__file__).resolve().parents[3] / "README.md"


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: its relative path -> a hash of its bytes ('dir' for folders)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout-like tree at tmp_path/home/repo (cwd), with a first run already in results/."""
    repo = tmp_path / "home" / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / "configs").mkdir()
    (repo / "configs" / "quickstart.yaml").write_text(yaml.safe_dump(TINY))
    (repo / "notes.txt").write_text("my notes\n")
    (tmp_path / "home" / "other.txt").write_text("not kvsim's\n")
    monkeypatch.chdir(repo)
    assert main(["run", "configs/quickstart.yaml", "--run", "first", "--no-plot", "--quiet"]) == 0
    return repo


@pytest.mark.parametrize("argv", [
    ["--run", "../.."], ["--run", ".."], ["--run", "."], ["--run", "../../x"], ["--run", "{tmp}/abs/path"],
    ["--run", ""], ["--run", ".hidden"], ["--run", "a/b"],
    ["--set", "name=../../x"], ["--set", "name={tmp}/abs"], ["--set", "name=.."], ["--set", "name=a/b"],
])
def test_unsafe_run_and_experiment_names_are_refused_and_nothing_changes(checkout, tmp_path, capsys, argv):
    # Absolute paths point into tmp_path (not /abs): a regression must not write outside it.
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = snapshot(tmp_path)
    assert main(["run", "configs/quickstart.yaml", "--no-plot", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "plain folder name" in err[0]
    assert snapshot(tmp_path) == before


def test_output_dir_may_be_anywhere_and_only_the_run_folder_is_added(checkout, tmp_path, capsys):
    before = snapshot(tmp_path)
    assert main(["run", "configs/quickstart.yaml", "--no-plot", "--quiet", "--run", "r",
                 "--set", "output_dir=../../x"]) == 0
    after = snapshot(tmp_path)
    assert all(after[k] == v for k, v in before.items())  # nothing changed or removed
    added = set(after) - set(before)
    assert added and all(k == "x" or k.startswith("x/quickstart") for k in added), added
    assert (tmp_path / "x" / "quickstart" / "r" / "summary.json").is_file()


def test_rerun_replaces_only_its_own_marked_folder(checkout, capsys):
    run = checkout / "results" / "quickstart" / "first"
    assert (run / MARKER).is_file()
    (run / "stale.txt").write_text("from the old run\n")
    assert main(["run", "configs/quickstart.yaml", "--run", "first", "--no-plot", "--quiet"]) == 0
    assert not (run / "stale.txt").exists() and (run / "summary.json").is_file()
    # nothing left beside it (no temporary or old folders)
    assert sorted(p.name for p in run.parent.iterdir()) == ["first"]


def test_a_folder_kvsim_did_not_make_is_never_replaced(checkout, tmp_path, capsys):
    mine = checkout / "results" / "quickstart" / "mine"
    mine.mkdir(parents=True)
    (mine / "data.csv").write_text("precious\n")
    before = snapshot(tmp_path)
    assert main(["run", "configs/quickstart.yaml", "--run", "mine", "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not written by kvsim" in err[0]
    assert snapshot(tmp_path) == before


def test_old_run_survives_a_failed_rewrite(checkout, monkeypatch):
    run = checkout / "results" / "quickstart" / "first"
    old = snapshot(run)

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    assert main(["run", "configs/quickstart.yaml", "--run", "first", "--no-plot", "--quiet"]) == 2
    assert snapshot(run) == old
    assert sorted(p.name for p in run.parent.iterdir()) == ["first"]  # the temporary folder is gone


def test_results_path_that_is_a_file_fails_before_simulating(checkout, monkeypatch, capsys):
    (checkout / "blocked").write_text("a file where a folder should be\n")

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the results cannot be written")

    monkeypatch.setattr("kvsim.simulator.engine.runner.run_experiment", no_simulation)
    assert main(["run", "configs/quickstart.yaml", "--out", "blocked", "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write results here" in err[0] and "Not a directory" in err[0]


def test_read_only_results_folder_fails_before_simulating(checkout, monkeypatch, capsys):
    # Tests may run as root, for whom chmod does not deny: deny the probe file instead.
    def denied(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr("kvsim.simulator.outputs.tempfile.TemporaryFile", denied)
    monkeypatch.setattr("kvsim.simulator.engine.runner.run_experiment", lambda *a, **k: pytest.fail("simulated"))
    assert main(["run", "configs/quickstart.yaml", "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write results here (Permission denied)" in err[0]


def test_sweep_with_an_unsafe_name_writes_nothing(checkout, tmp_path, capsys):
    before = snapshot(tmp_path)
    assert main(["sweep", "configs/quickstart.yaml", "--grid", "seed=1,2", "--name", "../../x",
                 "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--name '../../x' is not a plain folder name" in err[0]
    assert snapshot(tmp_path) == before


def test_sweep_file_with_an_unsafe_name_is_one_line_naming_its_line(checkout, tmp_path, capsys):
    sweep = checkout / "unsafe-sweep.yaml"
    sweep.write_text("base: configs/quickstart.yaml\nname: ../../bad\ngrid:\n  seed: [1, 2]\n")
    before = snapshot(tmp_path)
    assert main(["sweep", str(sweep), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "unsafe-sweep.yaml:2: sweep name '../../bad' is not a plain folder name" in err[0]
    assert snapshot(tmp_path) == before


# --- outputs that say what is true --------------------------------------------------------

def test_equal_configs_give_byte_identical_results_and_timing_lives_apart(checkout):
    for run in ("a", "b"):
        assert main(["run", "configs/quickstart.yaml", "--run", run, "--no-plot", "--quiet"]) == 0
    a, b = (checkout / "results" / "quickstart" / r for r in ("a", "b"))
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert {"summary.json", "config.yaml", "requests.parquet", RUN_INFO, MARKER} <= set(files)
    for name in files:
        if name != RUN_INFO:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert "wall_s" not in json.loads((a / "summary.json").read_text())
    assert json.loads((a / RUN_INFO).read_text())["wall_s"] > 0


def test_plot_path_is_printed_only_when_the_file_exists(checkout, capsys):
    assert main(["run", "configs/quickstart.yaml", "--run", "nosteps", "--quiet",
                 "--set", "metrics.step_table=false"]) == 0
    out = capsys.readouterr().out
    assert "plot:" not in out and not (checkout / "results/quickstart/nosteps/memory_timeline.png").exists()
    assert main(["run", "configs/quickstart.yaml", "--run", "steps", "--quiet"]) == 0
    printed = re.search(r"plot:\s+(\S+)", capsys.readouterr().out)
    assert printed and Path(printed.group(1)).is_file()


def test_trace_plot_prints_the_file_it_wrote(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,6\n1.0,30,7\n")
    assert main(["trace", "plot", str(trace), "--format", "generic",
                 "--columns", "arrival_time,prompt_tokens,output_tokens", "-o", "xnoext"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == "wrote xnoext.png" and (tmp_path / "xnoext.png").is_file()
    assert not (tmp_path / "xnoext").exists()


@pytest.mark.parametrize(("value", "fmt", "shown"), [
    (-2.22e-14, "{:.1f}", "0.0"), (-2.22e-14, "{:g}", "0"), (-0.0, "{:.1f}", "0.0"), (-0.04, "{:.1f}", "0.0"),
    (-0.06, "{:.1f}", "-0.1"), (float("nan"), "{:.1f}", "-"), (None, "{:.1f}", "-"), (-1e-5, "{:g}", "-1e-05"),
    (float("-inf"), "{:g}", "-inf"), (12.345, "{:.2f}", "12.35"),
])
def test_numbers_print_without_float_noise(value, fmt, shown):
    assert fmt_number(value, fmt) == shown


def test_tables_round_for_display_and_files_keep_full_precision():
    def render(table) -> str:
        buf = io.StringIO()
        Console(file=buf, width=300).print(table)
        return buf.getvalue()

    text = render(summary_table({"mem_external_frag_perc": -2.22e-14, "completed": 3.0}, "t"))
    assert "-0.0" not in text and "e-14" not in text
    row = {"run": 0, "system": "s", "status": "ok", "allocator.block_size": 0.30000000000000004,
           "normalized_latency_s_per_token": -2.22e-14}
    text = render(sweep_table(pd.DataFrame([row]), ["allocator.block_size"], "t"))
    assert "0.30000000000000004" not in text and "0.3" in text and "-0.0" not in text
    rates = pd.DataFrame([{"system": "s", "sustainable_rate": -2.22e-14, "search_status": "ok",
                           "bracket_lo": -2.22e-14, "bracket_hi": 1.0, "evaluations": 3}])
    assert "e-14" not in render(rates_table(rates, "t"))
    assert fmt_cell(0.1 + 0.2) == "0.3"


def test_readme_error_example_is_the_real_message(tmp_path, monkeypatch, capsys):
    block = re.search(r"```console\n\$ cat (\S+)\n(.*?)\$ (kvsim [^\n]+)\n(error: [^\n]+)\n```", README.read_text(),
                      re.S)
    assert block, "README lost its error example"
    name, content, command, message = block.groups()
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(content)
    assert main(command.split()[1:]) == 2
    assert capsys.readouterr().err.strip() == message



# --- progress of long runs ------------------------------------------------------------------

def _tiny_config(num_requests: int):
    from kvsim.simulator.config import validate_config

    raw = {**TINY, "workload": {**TINY["workload"], "num_requests": num_requests}}
    return validate_config(yaml.safe_load(yaml.safe_dump(raw)))


def test_progress_bar_shows_requests_simulated_time_rate_and_eta_on_a_terminal():
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.engine.runner import expected_requests, run_experiment

    cfg = _tiny_config(400)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200)
    with RunProgress(cfg.name, expected_requests(cfg), console=console, interval_s=0.001) as bar:
        result = run_experiment(cfg, progress=bar)
        bar.sample()  # the thread samples every interval; take the final state now
        drawn = bar.bar.get_renderable()
    assert bar.enabled and result.summary["completed"] == 400
    shown = Console(file=io.StringIO(), width=200, record=True)
    shown.print(drawn)
    line = shown.export_text()
    assert "400/400 requests" in line and "s simulated" in line and "req/s" in line and "ETA" in line, line


@pytest.mark.parametrize("console", [
    Console(file=io.StringIO()),  # not a terminal: a log file, a pipe, a test
    Console(file=io.StringIO(), force_terminal=True, quiet=True),  # kvsim run --quiet
])
def test_progress_bar_is_off_when_not_a_terminal_or_quiet(console):
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.engine.runner import run_experiment

    with RunProgress("tiny", 20, console=console) as bar:
        run_experiment(_tiny_config(20), progress=bar)
    assert not bar.enabled and bar.bar is None and console.file.getvalue() == ""


def test_run_without_a_terminal_prints_nothing_on_stderr(checkout, capsys):
    assert main(["run", "configs/quickstart.yaml", "--run", "x", "--no-plot"]) == 0
    assert capsys.readouterr().err == ""


def test_progress_follows_the_clock_when_only_the_duration_is_known():
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.config import validate_config
    from kvsim.simulator.engine.runner import expected_duration_s, expected_requests, run_experiment

    raw = {**TINY, "workload": {**TINY["workload"], "num_requests": None, "duration_s": 20.0}}
    cfg = validate_config(yaml.safe_load(yaml.safe_dump(raw)))
    assert expected_requests(cfg) is None and expected_duration_s(cfg) == 20.0
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with RunProgress(cfg.name, None, console=console, total_sim_s=20.0) as bar:
        result = run_experiment(cfg, progress=bar)
        bar.sample()
        task = bar.bar.tasks[0]
        completed = task.completed  # (at the exit the bar is set done: ETA 0)
    assert task.total == 20.0 and completed == pytest.approx(bar._sim.env.now) and completed > 15
    assert task.fields["done"] == result.summary["completed"] > 0
