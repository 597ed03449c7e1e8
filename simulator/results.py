"""Where a run's outputs go: ``<output_dir>/<name>/<run>/``.

- ``config.yaml``: the resolved config (every default filled in);
- ``summary.json``: the summary metrics;
- ``requests.parquet``, ``steps.parquet``: per-request and per-step tables;
- ``memory_timeline.png``: the memory classes over time (unless disabled, or when
  ``metrics.step_table`` is off: then only the totals of the steps are kept).

The run folder's default name is a hash of the resolved config, so the same
config always lands in the same place and a sweep can skip runs already done.
Files are written to a temporary folder and renamed into place: a run folder is
either complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from simulator.config import ExperimentConfig
from simulator.runner import RunResult


def config_dict(cfg: ExperimentConfig) -> dict:
    return cfg.model_dump(mode="json")


def config_hash(cfg: ExperimentConfig) -> str:
    """12 hex digits identifying a resolved config (name and output_dir excluded)."""
    d = config_dict(cfg)
    d.pop("name", None)
    d.pop("output_dir", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _jsonable(summary: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


@contextmanager
def atomic_dir(run_dir: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``run_dir``; on success it replaces ``run_dir`` in
    one rename, on failure it is removed: readers see the old folder or the new, never half."""
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", dir=run_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; results are for everyone who can read the folder
    try:
        yield tmp
        if run_dir.exists():
            shutil.rmtree(run_dir)
        os.replace(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_run(result: RunResult, run_dir: Path, plot: bool = True) -> Path:
    """Write a run's outputs atomically into ``run_dir``; return it."""
    with atomic_dir(run_dir) as tmp:
        (tmp / "config.yaml").write_text(yaml.safe_dump(config_dict(result.config), sort_keys=False))
        summary = _jsonable(result.summary) | {"wall_s": result.wall_s}
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
        result.requests.to_parquet(tmp / "requests.parquet", index=False)
        if result.config.metrics.step_table:
            result.steps.to_parquet(tmp / "steps.parquet", index=False)
        if plot and len(result.steps):  # the timeline needs the per-step table
            from simulator.plots import plot_memory_timeline

            plot_memory_timeline(result.steps, result.summary["kv_capacity_slots"], tmp / "memory_timeline.png",
                                 title=result.config.name)
    return Path(run_dir)


def default_run_dir(cfg: ExperimentConfig, run: str | None = None) -> Path:
    return Path(cfg.output_dir) / cfg.name / (run or config_hash(cfg))


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())
