"""The checkout is the kvsim package too: ``kvsim/`` links to the top-level folders, a copy
without links still imports, and a folder imported by its bare name says what to import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("simulator", "policies", "traces", "gpu_validation", "configs")


def python(code: str, path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, "-P", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_kvsim_links_every_top_level_folder():
    for name in FOLDERS:
        link = REPO / "kvsim" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve(), name


def test_a_copy_without_links_finds_the_folders_beside_the_package(tmp_path):
    """Where links are lost (an archive, a file copy), kvsim searches the repository root."""
    (tmp_path / "kvsim").mkdir()
    shutil.copy2(REPO / "kvsim" / "__init__.py", tmp_path / "kvsim" / "__init__.py")
    shutil.copytree(REPO / "simulator", tmp_path / "simulator", ignore=shutil.ignore_patterns("__pycache__"))
    done = python("import kvsim.simulator.cost_model.catalogue as c; print(c.__file__)", tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(tmp_path / "simulator" / "cost_model" / "catalogue.py")


def test_a_folder_imported_by_its_bare_name_names_the_package_to_import(tmp_path):
    for name in ("simulator", "policies", "traces", "gpu_validation"):
        done = python(f"import {name}", REPO, tmp_path)
        assert done.returncode == 1
        assert f"ImportError: import kvsim.{name}, not {name}:" in done.stderr
