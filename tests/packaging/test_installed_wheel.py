"""kvsim installed from a built wheel works where users install it (issue: packaging).

The wheel is built from a copy of the checkout (nothing is written into the checkout),
installed with ``pip --target`` into a fresh folder, and run from an empty directory with
the checkout off ``sys.path``: every module, config, trace and profile must come from the
wheel, under the one ``kvsim`` package. Dependencies come from this environment (the CI
step ``make wheel-check`` also installs them into a fresh virtualenv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COPIED = ["pyproject.toml", "README.md", "kvsim", "simulator", "policies", "traces", "gpu_validation",
          "configs"]
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "results")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder holding kvsim installed from its wheel (``pip install --target``)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in COPIED:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, src / name, symlinks=True, ignore=JUNK)
        else:
            shutil.copy2(item, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)],
                   check=True, capture_output=True, text=True, cwd=root)
    (wheel,) = (root / "dist").glob("kvsim-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(root / "site"), str(wheel)],
                   check=True, capture_output=True, text=True, cwd=root)
    return root


def run_installed(root: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -P ARGS`` seeing the wheel's kvsim (and this environment's dependencies) only."""
    env = {**os.environ, "PYTHONPATH": str(root / "site")}
    return subprocess.run([sys.executable, "-P", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_wheel_holds_one_top_level_package_with_its_data(installed):
    (wheel,) = (installed / "dist").glob("kvsim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("kvsim-")}
    assert tops == {"kvsim"}  # no `simulator`, `policies`, `traces` beside it
    for data in ("kvsim/configs/quickstart.yaml", "kvsim/configs/vllm_paper/fig2_memory_breakdown.yaml",
                 "kvsim/traces/data/AzureLLMInferenceTrace_conv.csv", "kvsim/traces/data/SOURCES.md",
                 "kvsim/gpu_validation/run_h200.sh"):
        assert data in names, data
    assert any(n.startswith("kvsim/gpu_validation/profiles/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("kvsim/gpu_validation/runs/") and n.endswith("LICENSE") for n in names)


def test_the_quickstart_runs_from_an_empty_directory(installed, tmp_path):
    done = run_installed(installed, "-c", "import kvsim.simulator.app.cli as c, sys; sys.exit(c.main())",
                         "run", "quickstart", "--run", "q", "--out", "out", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "out" / "quickstart" / "q"
    assert (run_dir / "summary.json").is_file()
    assert any(p.suffix == ".png" for p in run_dir.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # wrote only where asked


def test_the_installed_modules_come_from_the_wheel(installed, tmp_path):
    code = ("import kvsim, kvsim.simulator.engine.simulation as e, kvsim.traces as t, sys\n"
            "print(kvsim.__file__); print(e.__file__); print(t.DATA_DIR)\n")
    done = run_installed(installed, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    site = str(installed / "site")
    assert len(lines) == 3 and all(line.startswith(site) for line in lines), lines
    installed_tops = {p.name for p in (installed / "site").iterdir() if not p.name.endswith(".dist-info")}
    assert installed_tops <= {"kvsim", "bin"}  # no top-level simulator/policies/traces


def test_reproduce_quick_runs_from_an_empty_directory(installed, tmp_path):
    """`kvsim reproduce vllm-paper --quick` reads its sweeps and traces from the wheel (two
    figures here, one of them on the shipped Mooncake trace; ``make wheel-check`` runs all)."""
    done = run_installed(installed, "-c", "import kvsim.simulator.app.cli as c, sys; sys.exit(c.main())",
                         "reproduce", "vllm-paper", "--quick", "--only", "fig2,mooncake", "--out", "paper",
                         "--no-progress", "--workers", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "paper" / "report.md").read_text()
    assert "Figure 2" in report and "Mooncake" in report
    assert any((tmp_path / "paper").rglob("*.png"))
