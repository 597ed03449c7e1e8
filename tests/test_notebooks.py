"""The notebooks run end to end at reduced size, and are stored without outputs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_quickstart.ipynb", "02_allocators.ipynb"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def _execute(name: str, out: Path, monkeypatch) -> str:
    """Run a notebook at reduced size; return all its text output."""
    monkeypatch.setenv("KVSIM_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("KVSIM_NOTEBOOK_OUT", str(out))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    texts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.output_type != "error", o
            texts.append(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
    return "\n".join(texts)


def test_quickstart_runs_and_draws_the_memory_timeline(tmp_path, monkeypatch):
    text = _execute("01_quickstart.ipynb", tmp_path, monkeypatch)
    assert "the seven classes add up to 100.0% of the cache" in text
    assert (tmp_path / "quickstart_timeline.png").read_bytes().startswith(b"\x89PNG")
    assert "block size (tokens)" in text


def test_allocators_notebook_compares_systems(tmp_path, monkeypatch):
    text = _execute("02_allocators.ipynb", tmp_path, monkeypatch)
    assert "12 runs (12 simulated now, 0 reused), 0 failed" in text
    for figure in (
        "allocators/plots/memory_breakdown.png",
        "allocators/plots/batched_requests.png",
        "sustainable-rate/plots/latency_vs_rate.png",
    ):
        assert (tmp_path / figure).read_bytes().startswith(b"\x89PNG")
    assert all(s in text for s in ("vLLM", "Orca (Oracle)", "Orca (Pow2)", "Orca (Max)"))
