"""The experiment configs kvsim ships (``configs/``), found by name from any directory.

In a checkout they are the repository's ``configs/`` folder; installed from a wheel they
are package data beside the code (``kvsim/configs``). Either way they sit one level above
this package, so ``kvsim run quickstart`` works from an empty directory.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def find_config(arg: str | Path) -> Path:
    """The YAML a ``config`` argument names: a file that exists, else a shipped config.

    ``quickstart``, ``quickstart.yaml``, ``configs/quickstart.yaml`` and
    ``vllm_paper/fig2_sharegpt_small`` all name shipped files; a path that names
    nothing is returned unchanged, so the loader reports it as missing.
    """
    path = Path(arg)
    if path.is_file():
        return path
    for candidate in (CONFIG_DIR / path, CONFIG_DIR / path.with_suffix(".yaml"), CONFIG_DIR.parent / path):
        if candidate.is_file():
            return candidate
    return path


def shipped_names() -> list[str]:
    """Names of the shipped experiment configs, e.g. ``quickstart``, ``vllm_paper/...``."""
    return sorted(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in CONFIG_DIR.rglob("*.yaml"))
