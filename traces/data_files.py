"""Find the real traces that ship with kvsim (``traces/data/``).

The folder sits inside the ``traces`` package, so it is found the same way in a
source checkout and in an installed copy.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"


def shipped_files() -> list[str]:
    """Names of the trace files in ``traces/data/`` (the attribution file excluded)."""
    return sorted(p.name for p in DATA_DIR.iterdir() if p.is_file() and p.suffix != ".md")


def data_path(name: str) -> Path:
    """Path of the shipped data file ``name`` (a bare file name, e.g.
    ``"AzureLLMInferenceTrace_conv.csv"``, or ``"traces/data/<name>"``).

    Raises FileNotFoundError listing the files that do ship.
    """
    candidate = DATA_DIR / Path(name).name
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(
        f"no shipped trace named {name!r} in {DATA_DIR}; shipped: {', '.join(shipped_files())}"
    )
