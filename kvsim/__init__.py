"""kvsim: a discrete-event simulator of KV-cache memory management for LLM serving.

The repository keeps its top-level folders (``simulator/``, ``policies/``, ``traces/``,
``gpu_validation/``, ``configs/``); installed, they live under this one package
(``kvsim.simulator``, ...), so no installed name collides with another distribution.
In a checkout, ``kvsim/`` holds links to those folders; where links are not available
(a copy that dropped them) the repository root is searched instead.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "simulator").is_dir() and (_HERE.parent / "simulator" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # noqa: F821 (a package's module search path)
