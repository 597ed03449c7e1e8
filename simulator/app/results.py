"""Where a run's outputs go: ``<output_dir>/<name>/<run>/``.

- ``config.yaml``: the resolved config (every default filled in);
- ``summary.json``: the summary metrics (only simulated quantities: equal configs give
  byte-identical files);
- ``run_info.json``: how this run was made (wall-clock seconds): the one file that differs
  between two runs of the same config;
- ``requests.parquet``, ``steps.parquet``: per-request and per-step tables;
- ``memory_timeline.png``: the memory classes over time (unless disabled, or when
  ``metrics.step_table`` is off: then only the totals of the steps are kept);
- ``.kvsim-run``: the marker saying kvsim made this folder.

The run folder's default name is a hash of the resolved config, so the same
config always lands in the same place and a sweep can skip runs already done.
Files are written to a temporary folder and renamed into place: a run folder is
either complete or absent.

Safety (:mod:`simulator.outputs`, the rule every writer follows): names (``--run``, the
experiment's ``name``) are plain slugs, so a run folder is always two levels below
``output_dir``; and the only thing kvsim ever deletes is a run folder it made itself (it
holds the marker), and only once its replacement is complete.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import yaml

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.engine.runner import RunResult
from kvsim.simulator.outputs import MARKER as MARKER  # the run folder's marker, named here too
from kvsim.simulator.outputs import OutputError, atomic_dir, check_name


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


RUN_INFO = "run_info.json"
"""How a run was made (wall-clock seconds); kept apart so results files stay reproducible."""


def write_run(result: RunResult, run_dir: Path, plot: bool = True) -> Path:
    """Write a run's outputs atomically into ``run_dir``; return it."""
    with atomic_dir(run_dir) as tmp:
        (tmp / "config.yaml").write_text(yaml.safe_dump(config_dict(result.config), sort_keys=False))
        (tmp / "summary.json").write_text(json.dumps(_jsonable(result.summary), indent=2))
        (tmp / RUN_INFO).write_text(json.dumps({"wall_s": result.wall_s}, indent=2))
        result.requests.to_parquet(tmp / "requests.parquet", index=False)
        if result.config.metrics.step_table:
            result.steps.to_parquet(tmp / "steps.parquet", index=False)
        if plot and len(result.steps):  # the timeline needs the per-step table
            from kvsim.simulator.app.plots import plot_memory_timeline

            plot_memory_timeline(result.steps, result.summary["kv_capacity_slots"], tmp / "memory_timeline.png",
                                 title=result.config.name)
    return Path(run_dir)


def default_run_dir(cfg: ExperimentConfig, run: str | None = None) -> Path:
    """``output_dir/name/run`` (run: default the config hash); a bad ``run`` is an OutputError."""
    if run is not None:
        try:
            check_name(run, "--run")
        except ValueError as e:
            raise OutputError(str(e)) from None
    return Path(cfg.output_dir) / cfg.name / (run or config_hash(cfg))


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())
