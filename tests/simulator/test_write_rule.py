"""One write rule for every command that writes (``simulator/outputs.py``).

Each writer is run against a tree of the user's files (in ``tmp_path``): where it would
replace one of them, or write outside the folder asked for, it must fail with one line
naming the path and leave every file byte-identical. And each one replaces its *own*
earlier output when run again, so the rule is not "refuse everything".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
import yaml
from run_configs import TINY

import kvsim.simulator.app.reproduce as rp
from kvsim.simulator.app.cli import main
from kvsim.simulator.app.sweep import SweepResult
from kvsim.simulator.cost_model.operator_profile import PROFILES_DIR
from kvsim.simulator.outputs import (
    MANIFEST,
    MARKER,
    OutputError,
    atomic_write,
    is_kvsim_file,
    write_file,
)

TRACE = "arrival_time,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,6\n1.0,30,7\n"
TRACE_ARGS = ["--format", "generic", "--columns", "arrival_time,prompt_tokens,output_tokens"]
VIDUR = PROFILES_DIR / "a100-llama-3-8b.vidur" / "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B"
QUIET_SWEEP = ["--workers", "1", "--no-progress"]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: relative path -> SHA-256 of its bytes ('dir' for folders)."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def user_tree(tmp_path, monkeypatch):
    """The user's working folder (cwd): their own files where each writer would write, a
    config and a trace to run with, and one run kvsim made (for ``kvsim plot``)."""
    work = tmp_path / "work"
    files = {
        "notes.txt": "my notes\n",
        "t.png": "my picture, not a plot\n",
        "mine/sweep.csv": "my,table\n1,2\n",
        "mine/rates.csv": "my,rates\n",
        "mine/rates.parquet": "not even parquet\n",
        "report/report.md": "# my report\n",
        "report/figures/fig2_memory_breakdown.png": "my figure\n",
        "profiles/mine.yaml": "my: profile\n",
        "profiles/mine.LICENSE": "my licence\n",
        "plots/memory_timeline.png": "my plot\n",
        "results/quickstart/mine/data.csv": "precious\n",
        "configs/quickstart.yaml": yaml.safe_dump(TINY),
        "t.csv": TRACE,
    }
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    (tmp_path / "above.txt").write_text("outside the folder asked for\n")
    monkeypatch.chdir(work)
    assert main(["run", "configs/quickstart.yaml", "--run", "first", "--quiet"]) == 0
    return work


@pytest.mark.parametrize(("argv", "names"), [
    (["trace", "plot", "t.csv", *TRACE_ARGS], "t.png"),
    (["trace", "plot", "t.csv", *TRACE_ARGS, "-o", "notes.txt"], "notes.txt"),
    (["sweep", "configs/quickstart.yaml", "--grid", "seed=1,2", "--out", ".", "--name", "mine", *QUIET_SWEEP],
     "mine"),
    (["sweep", "configs/quickstart.yaml", "--grid", "seed=1,2", "--name", "", *QUIET_SWEEP], "plain folder name"),
    (["reproduce", "vllm-paper", "--only", "fig2", "--out", "report", *QUIET_SWEEP], "report"),
    (["calibrate", "--import", str(VIDUR), "--out", "profiles", "--name", "mine"], "profiles/mine.yaml"),
    (["calibrate", "--import", str(VIDUR), "--out", "profiles", "--name", "../../escaped"], "plain folder name"),
    (["calibrate", "--import", str(VIDUR), "--out", "profiles", "--name", "a/b"], "plain folder name"),
    (["calibrate", "--import", str(VIDUR), "--out", "profiles", "--name", ""], "plain folder name"),
    (["plot", "results/quickstart/first", "--out", "plots"], "plots"),
    (["run", "configs/quickstart.yaml", "--run", "mine", "--quiet"], "results/quickstart/mine"),
    (["validate", "anything", "--out", "report"], "report"),
], ids=["trace-plot", "trace-plot-o", "sweep", "sweep-empty-name", "reproduce", "import", "import-escape",
        "import-slash", "import-empty-name", "plot", "run", "validate"])
def test_a_writer_never_touches_the_users_files(user_tree, tmp_path, capsys, argv, names):
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert names in lines[0] and "Traceback" not in captured.err + captured.out
    assert snapshot(tmp_path) == before


def test_trace_plot_replaces_its_own_png_but_not_once_the_user_edited_it(user_tree, capsys):
    png = user_tree / "t2.png"
    assert main(["trace", "plot", "t.csv", *TRACE_ARGS, "-o", "t2.png"]) == 0
    first = png.read_bytes()
    assert is_kvsim_file(png) and "t2.png" in (user_tree / MANIFEST).read_text()
    (user_tree / "t.csv").write_text(TRACE + "9.0,400,70\n")
    assert main(["trace", "plot", "t.csv", *TRACE_ARGS, "-o", "t2.png"]) == 0  # re-run: replaced
    assert png.read_bytes() != first and is_kvsim_file(png)
    png.write_bytes(b"edited by the user")  # now it is theirs
    capsys.readouterr()
    assert main(["trace", "plot", "t.csv", *TRACE_ARGS, "-o", "t2.png"]) == 2
    assert png.read_bytes() == b"edited by the user" and "t2.png" in capsys.readouterr().err
    assert not [p for p in user_tree.iterdir() if ".tmp" in p.name]


def test_calibrate_import_replaces_its_own_profile_and_defaults_to_results(user_tree, capsys):
    assert main(["calibrate", "--import", str(VIDUR), "--name", "fresh"]) == 0
    out = user_tree / "results" / "profiles"  # not the package's gpu_validation/profiles
    assert {p.name for p in out.iterdir()} == {"fresh.yaml", "fresh.LICENSE", "fresh.SOURCES.md", MANIFEST}
    (out / "fresh.LICENSE").unlink()  # a re-run puts back and replaces only kvsim's files
    assert main(["calibrate", "--import", str(VIDUR), "--name", "fresh"]) == 0
    assert all(is_kvsim_file(out / n) for n in ("fresh.yaml", "fresh.LICENSE", "fresh.SOURCES.md"))
    (out / "fresh.yaml").write_text("hand-tuned: true\n")
    capsys.readouterr()
    assert main(["calibrate", "--import", str(VIDUR), "--name", "fresh"]) == 2
    assert (out / "fresh.yaml").read_text() == "hand-tuned: true\n"
    assert "fresh.yaml: exists and was not written by kvsim" in capsys.readouterr().err


def test_sweep_replaces_its_own_tables_and_may_fill_an_empty_folder(user_tree):
    sweep = ["sweep", "configs/quickstart.yaml", "--out", ".", "--name", "grid", *QUIET_SWEEP]
    assert main([*sweep, "--grid", "seed=1,2"]) == 0
    assert (user_tree / "grid" / MARKER).is_file()
    assert main([*sweep, "--grid", "seed=3,4,5"]) == 0  # re-run: its tables replaced
    assert len(pd.read_csv(user_tree / "grid" / "sweep.csv")) == 3
    (user_tree / "empty").mkdir()  # nothing of the user's to lose
    assert main(["sweep", "configs/quickstart.yaml", "--out", ".", "--name", "empty", "--grid", "seed=1",
                 *QUIET_SWEEP]) == 0
    assert (user_tree / "empty" / MARKER).is_file() and (user_tree / "empty" / "sweep.csv").is_file()


def test_reproduce_replaces_its_own_report(user_tree, monkeypatch):
    def no_runs(spec, *args, **kwargs):  # the sections then fail: the report is written all the same
        return SweepResult(spec.dir, pd.DataFrame(), None, 0, 0, 0, [])

    monkeypatch.setattr(rp, "run_sweep", no_runs)
    argv = ["reproduce", "vllm-paper", "--only", "fig2", "--out", "paper", *QUIET_SWEEP]
    assert main(argv) == 1 and (user_tree / "paper" / MARKER).is_file()
    (user_tree / "paper" / "report.md").write_text("stale\n")
    assert main(argv) == 1
    assert (user_tree / "paper" / "report.md").read_text().startswith("# The PagedAttention paper")


def test_plot_replaces_its_own_figures(user_tree):
    run = user_tree / "results" / "quickstart" / "first"
    assert main(["plot", str(run)]) == 0
    png = run / "plots" / "memory_timeline.png"
    png.write_bytes(b"stale")  # inside kvsim's plots folder: kvsim's
    assert main(["plot", str(run)]) == 0 and png.read_bytes() != b"stale"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.png"
    with write_file(path) as tmp:
        tmp.write_text("old")
    with pytest.raises(RuntimeError), write_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError), atomic_write(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "out.png"]


def test_a_link_is_never_kvsims(tmp_path):
    (tmp_path / "target.png").write_text("the user's")
    (tmp_path / "link.png").symlink_to(tmp_path / "target.png")
    with pytest.raises(OutputError, match="link.png: exists and was not written by kvsim"), \
            write_file(tmp_path / "link.png"):
        pass
    assert (tmp_path / "target.png").read_text() == "the user's"


def test_the_prefix_cache_experiment_refuses_a_users_folder_in_one_line(user_tree, tmp_path):
    """``python -m kvsim.simulator.app.prefix_cache_experiment --out mine`` (the user's folder):
    refused before anything runs, one line, nothing touched."""
    from kvsim.simulator.app.prefix_cache_experiment import main as experiment

    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        experiment(["--tiny", "--out", "mine"])
    message = str(exit_.value.code)
    assert message.startswith("error: mine: exists and was not written by kvsim") and "\n" not in message
    assert snapshot(tmp_path) == before


def test_the_tier_tables_name_the_sweeps_still_to_run(tmp_path):
    """``python -m kvsim.simulator.app.tier_tables`` before the sweeps: one line naming the
    missing tables and the command that makes each, not a traceback from pandas."""
    from kvsim.simulator.app.tier_tables import main as tables

    (tmp_path / "tiers-mooncake").mkdir()
    (tmp_path / "tiers-mooncake" / "sweep.csv").write_text("not read\n")
    with pytest.raises(SystemExit) as exit_:
        tables(["--results", str(tmp_path)])
    assert exit_.value.code == (f"error: no {tmp_path / 'tiers-multi-turn' / 'sweep.csv'}: run kvsim sweep "
                                "configs/tiers/sweep_multi_turn.yaml first (or give --results)")


def test_two_writers_in_one_folder_both_stay_listed(tmp_path, monkeypatch):
    """Two loose files written into one folder at once: each read-modify-write of
    ``.kvsim-files`` is under the folder's lock, so neither writer drops the other's line.
    Writer A reads the manifest, then waits (up to 0.5 s) for writer B to finish its whole
    write; unlocked, B would finish in that gap and A's rewrite would drop B's line."""
    import threading

    import kvsim.simulator.outputs as outputs

    read = outputs._manifest
    b_done = threading.Event()
    first = threading.Event()

    def slow_first_read(folder: Path) -> dict[str, str]:
        got = read(folder)
        if not first.is_set():  # writer A's read
            first.set()
            b_done.wait(0.5)
        return got

    monkeypatch.setattr(outputs, "_manifest", slow_first_read)

    def write(name: str) -> None:
        with write_file(tmp_path / name) as tmp:
            tmp.write_text(name)

    a = threading.Thread(target=write, args=("a.png",))
    a.start()
    first.wait(5)
    write("b.png")
    b_done.set()
    a.join()
    assert is_kvsim_file(tmp_path / "a.png") and is_kvsim_file(tmp_path / "b.png")
