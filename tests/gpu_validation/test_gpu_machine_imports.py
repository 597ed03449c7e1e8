"""The GPU run works on a machine that has only python, torch, triton, numpy and PyYAML.

``bash gpu_validation/run_h200.sh`` is run from the repository root as on the GPU machine,
with its CPU path (``--cpu-smoke-test``: the Triton kernels in the interpreter), by a
``python`` that cannot see kvsim's install or the simulator's dependencies:

- ``-S``: no ``site``, so no ``.pth`` file runs and the editable install of kvsim is not on
  the path; the project is found only through ``PYTHONPATH=$PWD``, as the script sets it;
- the packages torch, triton, numpy and PyYAML come from this environment's site-packages,
  put on ``PYTHONPATH`` after a folder of stand-ins for simpy, pydantic, pandas, matplotlib,
  rich and pyarrow whose import raises ``ImportError`` (as an absent package does).
"""

import json
import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kvsim.simulator.cost_model.calibration_profile import read_profile

REPO = Path(__file__).resolve().parents[2]
NOT_ON_THE_GPU_MACHINE = ("simpy", "pydantic", "pandas", "matplotlib", "rich", "pyarrow")


@pytest.fixture(scope="module")
def gpu_machine_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables of a shell on the GPU machine: ``python`` on PATH is bare."""
    root = tmp_path_factory.mktemp("gpu-machine")
    stubs = root / "not-installed"
    stubs.mkdir()
    for name in NOT_ON_THE_GPU_MACHINE:
        (stubs / f"{name}.py").write_text(
            f"raise ImportError('{name} is not installed on the GPU machine')\n"
        )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -s "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    site_packages = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHONPATH=os.pathsep.join([str(stubs), *site_packages]),
        TRITON_CACHE_DIR=str(root / "triton-cache"),
    )
    return env


def test_gpu_validation_imports_nothing_the_gpu_machine_lacks(gpu_machine_env):
    """Every gpu_validation module imports with the project found only through PYTHONPATH."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "from kvsim import gpu_validation\n"
        "names = [m.name for m in pkgutil.iter_modules(gpu_validation.__path__, 'kvsim.gpu_validation.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "mods = {n: m for n, m in sys.modules.items() if n.split('.')[0] == 'kvsim'}\n"
        "where = [p for m in mods.values() for p in ([m.__file__] if m.__file__ else m.__path__)]\n"
        "assert all(p.startswith(sys.argv[1]) for p in where), ('not from the checkout', where)\n"
        f"blocked = {NOT_ON_THE_GPU_MACHINE!r}\n"
        "assert not [n for n in sys.modules if n.split('.')[0] in blocked]\n"
        "print(json.dumps([len(names), sorted(n for n in mods if n.startswith('kvsim.simulator'))]))\n"
    )
    env = {**gpu_machine_env, "PYTHONPATH": f"{REPO}{os.pathsep}{gpu_machine_env['PYTHONPATH']}"}
    done = subprocess.run(
        ["python", "-c", code, str(REPO)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    count, simulator_modules = json.loads(done.stdout)
    assert count >= 10  # bench, measurements, correctness, paged_attention, ...
    # from the simulator, only plain-Python cost_model modules (DESIGN.md "Layout and layering")
    assert "kvsim.simulator.cost_model.calibration_profile" in simulator_modules
    assert {n for n in simulator_modules if not n.startswith("kvsim.simulator.cost_model")} <= {"kvsim.simulator"}


def test_run_h200_script_runs_its_cpu_path_without_the_simulator_dependencies(
    gpu_machine_env, tmp_path
):
    out = tmp_path / "gpu_out"
    env = {**gpu_machine_env, "OUT": str(out)}
    done = subprocess.run(
        ["bash", "gpu_validation/run_h200.sh", "--cpu-smoke-test"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "bench exit code: 0" in log
    assert "torch" in (out / "env.txt").read_text()  # the script's own version report ran
    profile = read_profile(out / "cpu-smoke-test.yaml")
    assert sorted(profile.decode_paged) == [1, 16] and profile.metadata.synthetic is False
    assert (out / "cpu-smoke-test_raw.csv").is_file() and (out / "cpu-smoke-test_summary.json").is_file()
