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

Safety: names (``--run``, the experiment's ``name``) are plain slugs, so a run folder is
always two levels below ``output_dir``; and the only thing kvsim ever deletes is a run
folder it made itself (it holds the marker), and only once its replacement is complete.
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

from kvsim.simulator.config import ExperimentConfig, check_name
from kvsim.simulator.runner import RunResult

MARKER = ".kvsim-run"
"""File in every run folder kvsim writes: the proof that kvsim may replace the folder."""
MARKER_TEXT = "written by kvsim; kvsim replaces this folder when the same run is written again\n"


class OutputError(Exception):
    """The results folder cannot be written (or would overwrite something not kvsim's); one line."""


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


def is_kvsim_run(path: Path) -> bool:
    """True for a real folder (not a link) holding kvsim's marker file."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def check_replaceable(run_dir: Path) -> None:
    """Raise OutputError unless ``run_dir`` is absent or a run folder kvsim made."""
    run_dir = Path(run_dir)
    if (run_dir.exists() or run_dir.is_symlink()) and not is_kvsim_run(run_dir):
        raise OutputError(f"{run_dir}: exists and was not written by kvsim (it has no {MARKER} marker; kvsim "
                          "replaces only run folders it marked; runs from before kvsim marked them have none): remove it "
                          "yourself, or choose another --run name or output folder")


def check_writable(run_dir: Path) -> None:
    """Before simulating: make ``run_dir``'s parent and prove a file can be created there, and
    that ``run_dir`` may be replaced, so a long run never ends in a write error."""
    run_dir = Path(run_dir)
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir.parent):
            pass
    except OSError as e:
        where = e.filename or run_dir.parent
        raise OutputError(f"{where}: cannot write results here ({e.strerror or e})") from None
    check_replaceable(run_dir)


@contextmanager
def atomic_dir(run_dir: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``run_dir``; on success it replaces ``run_dir``, on
    failure it is removed: readers see the old folder or the new, never half.

    The new folder gets the marker file. An old ``run_dir`` is replaced only if it holds the
    marker (else OutputError, and nothing is touched), and only after the new one is complete:
    it is renamed aside, the new one renamed in, then the old one removed.
    """
    run_dir = Path(run_dir)
    check_writable(run_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", dir=run_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; results are for everyone who can read the folder
    try:
        yield tmp
        (tmp / MARKER).write_text(MARKER_TEXT)
        check_replaceable(run_dir)  # again: something may have appeared while we simulated
        holder = None  # a private folder the old run waits in until the new one is in place
        if is_kvsim_run(run_dir):
            holder = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.old.", dir=run_dir.parent))
            os.replace(run_dir, holder / "run")
        try:
            os.replace(tmp, run_dir)
        except BaseException:
            if holder is not None:  # put the old run back
                os.replace(holder / "run", run_dir)
                holder.rmdir()
            raise
        if holder is not None:
            shutil.rmtree(holder, ignore_errors=True)  # the old run (marked: ours) and its holder
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # made by mkdtemp above: ours
        raise


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
            from kvsim.simulator.plots import plot_memory_timeline

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
