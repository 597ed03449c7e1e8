"""The calibration entry point: refuses without a GPU; a tiny CPU run covers every path."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.gpu_validation import bench  # noqa: E402
from kvsim.simulator.cost_model.calibration_profile import read_profile  # noqa: E402

REPO = Path(__file__).parents[2]


def test_without_gpu_stops_with_a_clear_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_cpu_smoke_run_writes_profile_csv_and_summary(tmp_path, capsys):
    assert bench.main(["--cpu-smoke-test", "--out", str(tmp_path)]) == 0
    profile = read_profile(tmp_path / "cpu-smoke-test.yaml")
    assert profile.metadata.synthetic is False
    assert sorted(profile.decode_paged) == [1, 16]
    assert profile.decode_shape == {"num_kv_heads": 2, "head_dim": 16, "group": 2}
    assert set(profile.gemm_tables) == {(32, 16), (16, 32)}
    assert set(profile.block_copy) == {1, 16}
    with (tmp_path / "cpu-smoke-test_raw.csv").open() as f:
        rows = list(csv.DictReader(f))
    sections = {r["section"] for r in rows}
    assert {
        "check",
        "tune",
        "decode",
        "split_kv",
        "gemm",
        "prefill",
        "block_copy",
        "swap",
    } <= sections
    assert all(r["ok"] == "1" for r in rows if r["section"] == "check")
    # 3 x 2 points x (contiguous + 2 block sizes) decode rows
    assert sum(r["section"] == "decode" for r in rows) == 2 * 2 * 3
    summary = json.loads((tmp_path / "cpu-smoke-test_summary.json").read_text())
    assert summary["correctness_passed"] is True
    out = capsys.readouterr().out
    assert "Paged / contiguous" in out and "Swap GB/s" in out


def test_refit_reproduces_the_profile_from_its_csv(tmp_path):
    assert bench.main(["--cpu-smoke-test", "--skip-checks", "--out", str(tmp_path)]) == 0
    path = tmp_path / "cpu-smoke-test.yaml"
    first = read_profile(path)
    path.write_text(path.read_text().replace("decode_attention:", "decode_attention:  # edited"))
    assert bench.main(["--refit", str(path)]) == 0
    assert read_profile(path) == first


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert bench.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


def test_run_script_is_valid_bash():
    script = REPO / "gpu_validation" / "run_h200.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "timeout" in text and "$OUT" in text


def test_gpu_validation_needs_no_simulator_simpy_or_pydantic():
    """The GPU machine has torch, triton, numpy and pyyaml only.

    DESIGN.md "Layout and layering": gpu_validation may import ``simulator.cost_model``
    (the catalogue and the profile format, plain Python) and nothing else of the simulator.
    """
    code = """
import importlib, pkgutil, sys
ALLOWED = ("kvsim.simulator", "kvsim.simulator.cost_model")
class Block:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        inside = name in ALLOWED or name.startswith("kvsim.simulator.cost_model.")
        if top in ("simpy", "pydantic", "pandas", "rich") or (name.startswith("kvsim.simulator") and not inside):
            raise ImportError(f"{name} must not be imported by gpu_validation")
sys.meta_path.insert(0, Block())
from kvsim import gpu_validation
for m in pkgutil.iter_modules(gpu_validation.__path__):
    importlib.import_module(f"kvsim.gpu_validation.{m.name}")
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_a_run_never_replaces_a_file_and_writes_to_results_by_default(tmp_path, capsys, monkeypatch):
    """The default folder is ./results/profiles, not the package's shipped profiles; a file a
    run would write that is already there stops it before any measurement, untouched."""
    monkeypatch.chdir(tmp_path)
    assert bench._parse_args([]).out == Path("results") / "profiles"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "cpu-smoke-test.yaml").write_text("my own\n")
    assert bench.main(["--cpu-smoke-test", "--out", str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu-smoke-test.yaml: exists" in err
    assert sorted(p.name for p in mine.iterdir()) == ["cpu-smoke-test.yaml"]
    assert (mine / "cpu-smoke-test.yaml").read_text() == "my own\n"
