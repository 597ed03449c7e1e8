"""Sweeps: many runs of one base config over a grid of overrides, resumable, one table.

A sweep file (YAML)::

    name: block-size                  # results go to <output_dir>/<name>/
    base: ../quickstart.yaml          # the base experiment, relative to this file
    # base_config: {model: ..., workload: ...}   # ...or the base experiment inline
    output_dir: results               # default: the base config's output_dir
    set:                              # overrides applied to every run (dotted keys)
      workload.window.duration_s: 120
    grid:                             # cartesian product over these axes
      allocator.block_size: [1, 2, 4, 8, 16, 32, 64, 128, 256]
    zip:                              # varied together (equal lengths): one more axis
      label: [vLLM, Orca-Max]         # `label` names the system in tables and plots
      allocator.kind: [paged, contiguous]
      allocator.preset: [null, orca-max]
    find_rate:                        # optional: a sustainable-rate search per grid point
      key: workload.arrivals.rate     # default; workload.rate_scale for a trace workload
      lo: 0.5                         # requests/s (or multiplier), must be sustainable
      hi: 16                          # must not be
      rel_tolerance: 0.02             # default: bracket width <= 2% of the rate found
      tolerance: null                 # or/and an absolute bracket width (requests/s)
      max_widenings: 4                # default; lo / 4 or hi * 4 per widening when the
                                      # answer lies outside [lo, hi]
      max_normalized_latency: 0.1     # s/token (default 0.1); and/or:
      max_p99_ttft_ms: null           # p99 TTFT bound (ms)
      max_p99_tpot_ms: null           # p99 TPOT bound (ms)

Each grid point is the base config with ``set``, then its axis values, applied by the same
machinery as ``kvsim run --set`` (a value may be a whole mapping, which replaces that
section). ``label`` is not a config key: it names the point's *system*; without it the
system is named by the varied values (``block_size=16, kind=paged``). The points are the
cartesian product of the ``grid`` axes (in file order, the last varying fastest) and the
``zip`` rows (innermost). Every point's config is validated before any run starts; an
invalid one is reported with the sweep file's line of the offending value.

Any experiment config can also be swept from the command line alone: ``kvsim sweep
CONFIG.yaml --grid allocator.block_size=1,2,4`` (a file without ``base``/``base_config``
is taken as the base itself).

Results, under ``<output_dir>/<name>/``:

* ``.kvsim-run``: the marker of a kvsim folder (:mod:`simulator.outputs`). A sweep writes only
  into a folder it created or one holding the marker: a folder of the user's of that name is
  refused before anything runs.
* ``runs/<config hash>/``: one folder per distinct config (see :mod:`simulator.app.results`),
  written atomically as the run completes; a failed run holds ``error.txt`` instead of
  ``summary.json``. Starting a sweep again skips every config that has ``summary.json``
  (and, unless ``retry_failed``, every recorded failure): nothing done is repeated, and two
  grid points that resolve to the same config run once.
* ``sweep.parquet`` and ``sweep.csv``: one row per run, in run order (grid order; for rate
  searches, by point then rate), whatever the executor: ``run``, ``run_id``, ``system``,
  ``status`` (ok / failed / pending), ``error``, each varied parameter (dotted key), then
  every summary metric (wall-clock time stays in each run's ``run_info.json``).
* ``rates.parquet`` and ``rates.csv`` (rate searches): a row per point: ``sustainable_rate``,
  ``search_status`` (ok, below_lo, above_hi, failed, pending), the final bracket, how many
  times the range was widened and the number of rates evaluated. A sweep without a search
  removes the ``rates.*`` an earlier search into the same folder left.
* ``sweep.json``: the sweep's axes and settings (what ``kvsim plot`` reads).

A config swept from the command line (no sweep file) goes to
``<config name>-sweep-<what was swept>-<hash of the axes>`` (e.g.
``quickstart-sweep-grid-block_size-1a2b3c4d``), so a ``--grid``, a ``--zip`` and a
``--find-rate`` of one config each keep their own table.

Concurrent sweeps into one folder share the work: a run is simulated only by the sweep
holding its lock (:mod:`simulator.app.run_lock`); the others wait for its folder and reuse it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from kvsim.simulator.app.executors import (
    Executor,
    RunFn,
    RunJob,
    RunOutcome,
    execute_run,
    make_executor,
)
from kvsim.simulator.app.rate_search import (
    DEFAULT_MAX_WIDENINGS,
    RateBisection,
    RateSearchSpec,
    SustainabilityCriterion,
)
from kvsim.simulator.app.results import config_hash, write_run
from kvsim.simulator.app.run_lock import RunLock
from kvsim.simulator.config import (
    ConfigError,
    ExperimentConfig,
    parse_override,
    read_yaml,
    validate_config,
)
from kvsim.simulator.outputs import atomic_dir, atomic_write, check_name, claim_folder

SWEEP_KEYS = (
    "name",
    "description",
    "base",
    "base_config",
    "output_dir",
    "set",
    "grid",
    "zip",
    "find_rate",
)
FIND_RATE_KEYS = (
    "key",
    "lo",
    "hi",
    "tolerance",
    "rel_tolerance",
    "max_widenings",
    "max_normalized_latency",
    "max_p99_ttft_ms",
    "max_p99_tpot_ms",
)
LABEL = "label"  # the axis that names systems; not a config key
RATE_KEY_GENERATED = "workload.arrivals.rate"
RATE_KEY_TRACE = "workload.rate_scale"
FOREIGN_POLL_S = 0.2  # s between checks on runs another sweep into the same folder holds


class SweepError(ValueError):
    """A sweep-file problem or an invalid grid point, formatted for the user."""


# --- the sweep file ------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep: a base config (raw dict) and the overrides to vary.

    ``where`` maps ``("set", key)`` and ``("grid" | "zip", key, value index)`` to where the
    value was written - ``file:line``, ``--grid KEY`` - so errors point at what a user wrote.
    """

    name: str
    source: str  # the sweep file, or the base config file when swept from the command line
    base: dict  # raw base config
    base_source: str  # where the base config's own keys are (for error messages)
    base_lines: dict  # key path -> line in base_source
    base_dir: Path  # folder relative paths in the base config start from
    output_dir: str
    set: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, tuple] = field(default_factory=dict)
    zip: dict[str, tuple] = field(default_factory=dict)
    find_rate: RateSearchSpec | None = None
    where: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @property
    def axes(self) -> list[str]:
        return list(self.grid) + list(self.zip)

    @property
    def param_keys(self) -> list[str]:
        """Varied config keys: the axes (without ``label``), then the searched rate."""
        keys = [k for k in self.axes if k != LABEL]
        return keys + ([self.find_rate.key] if self.find_rate else [])


MAX_POINTS = 100_000
"""Most runs one sweep may expand to: at a second each on 16 cores, nearly two hours; a grid
beyond it (a product of long axes) is a mistake, and listing it alone would take minutes."""


def parse_axis(text: str, flag: str = "--grid") -> tuple[str, tuple]:
    """``KEY=V1,V2,...`` (or ``KEY=[V1, V2]``) -> (KEY, values parsed as YAML)."""
    keys, value = parse_override(text)
    if isinstance(value, list):
        values = value
    else:
        raw = text.split("=", 1)[1]
        try:
            values = [yaml.safe_load(v) if v.strip() else None for v in raw.split(",")]
        except yaml.YAMLError as e:
            raise SweepError(f"{flag} {text}: a value is not valid YAML ({e})") from None
        except ValueError:  # (an integer of more digits than Python converts)
            raise SweepError(f"{flag} {'.'.join(keys)}: a value is a number of more than "
                             f"{sys.get_int_max_str_digits()} digits") from None
    if not values:
        raise SweepError(f"{flag} {text}: no values")
    return ".".join(keys), tuple(values)


def _yaml_text(value: Any) -> str:
    """A value as the YAML text ``--set`` parses back to the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def _read_yaml(path: Path, what: str) -> tuple[Any, dict]:
    return read_yaml(path, what, SweepError)


def _mapping(value: Any, where: str, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(
            f"{where}: {key}: must be a mapping of dotted keys (got {type(value).__name__})"
        )
    return value


def _parse_find_rate(raw: dict, where, base: dict, set_keys: Iterable[str]) -> RateSearchSpec:
    unknown = [k for k in raw if k not in FIND_RATE_KEYS]
    if unknown:
        raise SweepError(
            f"{where(('find_rate', unknown[0]))}: find_rate.{unknown[0]}: unknown key; "
            f"allowed: {', '.join(FIND_RATE_KEYS)}"
        )
    for k in ("lo", "hi"):
        if k not in raw:
            raise SweepError(f"{where(('find_rate',))}: find_rate.{k}: required (a rate > 0)")
    workload = base.get("workload") if isinstance(base.get("workload"), dict) else {}
    is_trace = "trace" in workload or any(k.startswith("workload.trace") for k in set_keys)
    key = raw.get("key") or (RATE_KEY_TRACE if is_trace else RATE_KEY_GENERATED)
    bounds = {
        k: raw.get(k) for k in ("max_normalized_latency", "max_p99_ttft_ms", "max_p99_tpot_ms")
    }
    if "max_normalized_latency" not in raw:
        bounds.pop("max_normalized_latency")  # keep the default
    try:
        spec = RateSearchSpec(
            key,
            raw["lo"],
            raw["hi"],
            raw.get("tolerance"),
            SustainabilityCriterion(**bounds),
            raw.get("rel_tolerance"),
            raw.get("max_widenings", DEFAULT_MAX_WIDENINGS),
        )
        spec.bisection()  # validates lo, hi, tolerance
    except (TypeError, ValueError) as e:
        raise SweepError(f"{where(('find_rate',))}: find_rate: {e}") from None
    return spec


def load_sweep(
    path: str | Path,
    *,
    grid: Sequence[str] = (),
    zip_axes: Sequence[str] = (),
    set_: Sequence[str] = (),
    name: str | None = None,
    output_dir: str | None = None,
    find_rate: dict | None = None,
) -> SweepSpec:
    """Read a sweep file (or an experiment config to sweep from the command line).

    ``grid``/``zip_axes``: ``KEY=V1,V2`` texts added to (or replacing) the file's axes;
    ``set_``: ``KEY=VALUE`` texts added to its ``set``; ``find_rate``: keys replacing the
    file's ``find_rate`` ones.
    """
    path = Path(path)
    raw, lines = _read_yaml(path, "sweep")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: the top level must be a mapping (base, grid, zip, ...)")
    where_map: dict = {}

    def where(key_path: tuple) -> str:
        for n in range(len(key_path), 0, -1):
            if key_path[:n] in where_map:
                return where_map[key_path[:n]]
            if key_path[:n] in lines:
                return f"{path}:{lines[key_path[:n]]}"
        return str(path)

    is_sweep_file = "base" in raw or "base_config" in raw
    if is_sweep_file:
        unknown = [k for k in raw if k not in SWEEP_KEYS]
        if unknown:
            raise SweepError(
                f"{where((unknown[0],))}: {unknown[0]}: unknown key; "
                f"allowed: {', '.join(SWEEP_KEYS)}"
            )
        if "base" in raw and "base_config" in raw:
            raise SweepError(
                f"{where(('base_config',))}: give base (a path) or base_config (a mapping), "
                "not both"
            )
        if "base" in raw:
            if not isinstance(raw["base"], str):
                raise SweepError(f"{where(('base',))}: base: must be a path to an experiment YAML")
            base_path = path.parent / raw["base"]
            base, base_lines = _read_yaml(base_path, "base config")
            base_source, base_dir = str(base_path), base_path.parent
        else:
            base = raw["base_config"]
            base_source, base_dir = str(path), path.parent
            base_lines = {
                k[1:]: v for k, v in lines.items() if k[:1] == ("base_config",) and len(k) > 1
            }
        if base is None:
            base = {}
        if not isinstance(base, dict):
            raise SweepError(f"{base_source}: the base config must be a mapping of sections")
        set_raw = _mapping(raw.get("set"), where(("set",)), "set")
        grid_raw = _mapping(raw.get("grid"), where(("grid",)), "grid")
        zip_raw = _mapping(raw.get("zip"), where(("zip",)), "zip")
        rate_raw = _mapping(raw.get("find_rate"), where(("find_rate",)), "find_rate")
        has_rate = raw.get("find_rate") is not None
        sweep_name = raw.get("name") or base.get("name") or path.stem
    else:  # an experiment config: sweep it with command-line axes
        if any(k in raw for k in ("grid", "zip", "set", "find_rate")):
            raise SweepError(f"{path}: a sweep file needs base: PATH (or base_config: {{...}})")
        base, base_lines, base_source, base_dir = raw, lines, str(path), path.parent
        set_raw, grid_raw, zip_raw, rate_raw, has_rate = {}, {}, {}, {}, False
        sweep_name = (raw.get("name") or path.stem) + "-sweep"

    set_values: dict[str, Any] = {}
    for key, value in set_raw.items():
        set_values[str(key)] = value
        where_map[("set", str(key))] = where(("set", key))
    for text in set_:
        keys, value = parse_override(text)
        key = ".".join(keys)
        set_values[key] = value
        where_map[("set", key)] = "--set"

    axes: dict[str, dict[str, tuple]] = {"grid": {}, "zip": {}}
    for section, raw_axes, cli in (("grid", grid_raw, grid), ("zip", zip_raw, zip_axes)):
        for key, values in raw_axes.items():
            key = str(key)
            if not isinstance(values, list) or not values:
                raise SweepError(
                    f"{where((section, key))}: {section}.{key}: must be a non-empty list of values"
                )
            axes[section][key] = tuple(values)
            for i in range(len(values)):
                where_map[(section, key, i)] = where((section, key, i))
        for text in cli:
            key, values = parse_axis(text, f"--{section}")
            axes[section][key] = values
            for i in range(len(values)):
                where_map[(section, key, i)] = f"--{section} {key}"
    grid_axes, zipped = axes["grid"], axes["zip"]
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in zipped.items())
        raise SweepError(
            f"{where(('zip',))}: zip: every axis needs the same number of values ({sizes})"
        )
    for key, values in grid_axes.items():  # (a zip may repeat a value: its rows differ elsewhere)
        texts = [_yaml_text(v) for v in values]
        again = next((i for i, t in enumerate(texts) if t in texts[:i]), None)
        if again is not None:
            raise SweepError(f"{where_map[('grid', key, again)]}: grid.{key}: value {texts[again]} is given twice "
                             "(every run would be done twice); give each value once")
    points = math.prod(len(v) for v in grid_axes.values()) * (next(iter(lengths)) if lengths else 1)
    if points > MAX_POINTS:
        sizes = " x ".join(str(len(v)) for v in (*grid_axes.values(), *list(zipped.values())[:1]))
        raise SweepError(f"{where(('grid',))}: the grid has {sizes} = {points:,} points, more than a sweep may "
                         f"run (at most {MAX_POINTS:,}): fewer values per axis, or zip axes that vary together")
    both = set(grid_axes) & set(zipped)
    if both:
        raise SweepError(
            f"{where(('zip', min(both)))}: {min(both)}: in both grid and zip; keep one"
        )
    for key in set_values:
        if key in grid_axes or key in zipped:
            raise SweepError(
                f"{where(('set', key))}: {key}: both set for every run and varied; keep one"
            )
    if LABEL in set_values:
        raise SweepError(f"{where(('set', LABEL))}: label: names systems; put it in grid or zip")

    rate_spec = None
    if has_rate or find_rate:
        merged = {**rate_raw, **(find_rate or {})}
        rate_spec = _parse_find_rate(merged, where, base, set_values)
        if rate_spec.key in grid_axes or rate_spec.key in zipped or rate_spec.key in set_values:
            raise SweepError(
                f"{where(('find_rate',))}: find_rate searches {rate_spec.key}; "
                "remove it from set, grid and zip"
            )
    if not is_sweep_file:  # one config, many kinds of sweep: a folder per kind of sweep
        sweep_name = _command_line_sweep_name(
            str(raw.get("name") or path.stem), set_values, grid_axes, zipped, rate_spec
        )
    try:  # the sweep's name is a folder: refuse an unsafe one once, where it was written
        check_name(str(name or sweep_name), "sweep name")
    except ValueError as e:
        raise SweepError(f"{where(('name',)) if not name else '--name'}: {e}") from None
    out = (
        output_dir
        or (raw.get("output_dir") if is_sweep_file else None)
        or base.get("output_dir")
        or "results"
    )
    return SweepSpec(
        name=str(name or sweep_name),
        source=str(path),
        base=base,
        base_source=base_source,
        base_lines=base_lines,
        base_dir=base_dir,
        output_dir=str(out),
        set=set_values,
        grid=grid_axes,
        zip=zipped,
        find_rate=rate_spec,
        where=where_map,
    )


def _command_line_sweep_name(
    base: str, set_values: dict, grid: dict, zipped: dict, rate: RateSearchSpec | None
) -> str:
    """``<config>-sweep-<what was swept>-<hash of the axes>`` for a config swept from the
    command line: a ``--grid``, a ``--zip`` and a ``--find-rate`` of one config (or two grids
    with different values) each get their own folder and table, instead of replacing the
    previous sweep's ``sweep.csv`` and leaving its ``rates.csv`` behind. The same command
    gives the same folder, so a sweep started again still resumes."""
    kinds = []
    for kind, axes in (("grid", grid), ("zip", zipped)):
        if axes:
            kinds.append(kind + "-" + "-".join(k.rsplit(".", 1)[-1] for k in axes))
    if rate is not None:
        kinds.append("rate")
    what = {
        "set": set_values,
        "grid": {k: list(v) for k, v in grid.items()},
        "zip": {k: list(v) for k, v in zipped.items()},
        "find_rate": rate.as_dict() if rate else None,
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join([base, "sweep", *kinds]))
    return f"{slug[:110]}-{digest[:8]}"


# --- grid points ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One grid point: its position, its axis values and the system it names."""

    index: int
    params: dict  # axis key -> value (``label`` included when given)
    label: str
    positions: dict = field(default_factory=dict)  # axis key -> index of its value on the axis


def _short(key: str, keys: Sequence[str]) -> str:
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def _fmt(value: Any) -> str:
    return "null" if value is None else str(value)


def system_label(params: dict, name: str) -> str:
    """``label`` if given, else the varied values (``block_size=16, kind=paged``)."""
    if LABEL in params:
        return _fmt(params[LABEL])
    keys = list(params)
    return ", ".join(f"{_short(k, keys)}={_fmt(v)}" for k, v in params.items()) or name


def expand_points(spec: SweepSpec) -> list[SweepPoint]:
    """The cartesian product of the grid axes with the zip rows (innermost), in order."""
    grid_keys = list(spec.grid)
    zip_keys = list(spec.zip)
    zip_len = len(next(iter(spec.zip.values()))) if zip_keys else 1
    grid_ranges = [range(len(spec.grid[k])) for k in grid_keys]
    points = []
    for i, (grid_at, row) in enumerate(
        itertools.product(itertools.product(*grid_ranges), range(zip_len))
    ):
        positions = dict(zip(grid_keys, grid_at)) | {k: row for k in zip_keys}
        params = {k: spec.grid[k][j] for k, j in zip(grid_keys, grid_at)}
        params |= {k: spec.zip[k][row] for k in zip_keys}
        points.append(SweepPoint(i, params, system_label(params, spec.name), positions))
    return points


def resolve_config(
    spec: SweepSpec, point: SweepPoint, rate: float | None = None
) -> ExperimentConfig:
    """The point's config: base, ``set``, axis values (and the searched rate), validated."""
    return resolve_raw(spec, point, rate)[0]


def resolve_raw(
    spec: SweepSpec, point: SweepPoint, rate: float | None = None
) -> tuple[ExperimentConfig, dict]:
    """The point's validated config and the raw mapping it was validated from.

    Workers get the raw mapping: validating it again gives the same config, whereas a
    config dumped with every default filled in is not always accepted back as input.
    """
    texts, origin = [], {}
    for key, value in spec.set.items():
        texts.append(f"{key}={_yaml_text(value)}")
        origin[key] = spec.where.get(("set", key), spec.source)
    for key, value in point.params.items():
        if key == LABEL:
            continue
        section = "grid" if key in spec.grid else "zip"
        texts.append(f"{key}={_yaml_text(value)}")
        origin[key] = spec.where.get((section, key, point.positions.get(key, 0)), spec.source)
    if rate is not None and spec.find_rate is not None:
        texts.append(f"{spec.find_rate.key}={_yaml_text(rate)}")
        origin[spec.find_rate.key] = f"find_rate ({spec.find_rate.key}={rate:g})"
    raw = copy.deepcopy(spec.base)
    raw["name"], raw["output_dir"] = spec.name, spec.output_dir
    try:
        cfg = validate_config(raw, source=spec.base_source, lines=spec.base_lines, overrides=texts)
    except ConfigError as e:
        raise SweepError(
            f"run {point.index} [{point.label}]: {_relocate(str(e), origin)}"
        ) from None
    return cfg, raw  # validate_config applied the overrides to `raw`


def _relocate(message: str, origin: dict[str, str]) -> str:
    """Replace ``--set`` in a config error by where the sweep wrote the value."""
    out = []
    for line in message.splitlines():
        if line.startswith("--set"):
            rest = line.removeprefix("--set").lstrip(": ")
            key = rest.split(":", 1)[0].split("=", 1)[0].strip()
            best = max(
                (k for k in origin if key == k or key.startswith(k + ".")), key=len, default=None
            )
            if best is not None:
                line = f"{origin[best]}: {rest}"
        out.append(line)
    return "\n".join(out)


def validate_points(spec: SweepSpec, points: Sequence[SweepPoint], max_errors: int = 5) -> None:
    """Resolve every point (at both ends of a rate search); raise one error listing the bad ones."""
    errors = []
    rates = (spec.find_rate.lo, spec.find_rate.hi) if spec.find_rate else (None,)
    for point in points:
        for rate in rates:
            try:
                resolve_config(spec, point, rate)
            except SweepError as e:
                errors.append(str(e))
                break
    if errors:
        more = (
            f"\n(and {len(errors) - max_errors} more invalid runs)"
            if len(errors) > max_errors
            else ""
        )
        raise SweepError(
            f"{spec.source}: {len(errors)} of {len(points)} runs are invalid; nothing was run:\n"
            + "\n".join(errors[:max_errors])
            + more
        )


# --- run folders ---------------------------------------------------------------------------


def run_status(run_dir: Path) -> str | None:
    """``ok`` (summary.json), ``failed`` (error.txt) or None (not run, or interrupted)."""
    if (run_dir / "summary.json").is_file():
        return "ok"
    if (run_dir / "error.txt").is_file():
        return "failed"
    return None


def write_failure(run_dir: Path, error: str, details: str | None, config: dict) -> Path:
    """Record a failed run atomically: ``error.txt`` (the one-line error first) and its config.

    Never replaces a successful run's folder.
    """
    run_dir = Path(run_dir)
    if run_status(run_dir) == "ok":
        return run_dir
    with atomic_dir(run_dir) as tmp:
        text = error + ("\n\n" + details if details and details.strip() != error else "") + "\n"
        (tmp / "error.txt").write_text(text)
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


def read_error(run_dir: Path) -> str:
    return (run_dir / "error.txt").read_text().split("\n", 1)[0]


# --- the table -----------------------------------------------------------------------------


def _cell(value: Any) -> Any:
    """A parameter as a table cell: scalars as they are, lists and mappings as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def _uniform_columns(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """Parquet needs one type per column: mixed parameter columns become text."""
    for c in columns:
        kinds = {
            type(v) for v in df[c] if v is not None and not (isinstance(v, float) and math.isnan(v))
        }
        if len(kinds) > 1 and not kinds <= {int, float}:
            df[c] = [None if v is None else _fmt(v) for v in df[c]]
    return df


def _write_atomic(df: pd.DataFrame, path: Path) -> None:
    with atomic_write(path) as tmp:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)


@dataclass(frozen=True)
class TableRow:
    """One row of the sweep table: a grid point, the rate run (searches) and its config hash."""

    point: SweepPoint
    rate: float | None
    run_id: str


def build_table(spec: SweepSpec, rows: Sequence[TableRow]) -> pd.DataFrame:
    """One row per run, read back from the run folders (the source of truth)."""
    param_keys = spec.param_keys
    records, metric_keys = [], {}
    for i, row in enumerate(rows):
        run_dir = spec.dir / "runs" / row.run_id
        status = run_status(run_dir) or "pending"
        rec = {
            "run": i,
            "run_id": row.run_id,
            "system": row.point.label,
            "status": status,
            "error": read_error(run_dir) if status == "failed" else None,
        }
        for key in param_keys:
            rec[key] = _cell(
                row.rate
                if spec.find_rate and key == spec.find_rate.key
                else row.point.params.get(key)
            )
        if status == "ok":
            summary = json.loads((run_dir / "summary.json").read_text())
            for k, v in summary.items():
                metric_keys.setdefault(k, None)
                rec[k] = float("nan") if v is None else _cell(v)
        records.append(rec)
    columns = ["run", "run_id", "system", "status", "error", *param_keys, *metric_keys]
    df = pd.DataFrame.from_records(records, columns=columns)
    df["error"] = df["error"].astype(object)
    return _uniform_columns(df, [*param_keys, *metric_keys])


def write_tables(spec: SweepSpec, table: pd.DataFrame, rates: pd.DataFrame | None) -> list[Path]:
    """Write ``sweep.*`` (and ``rates.*`` for a rate search); a ``rates.*`` left by an earlier
    search into the same folder is removed, so every table there describes this sweep."""
    claim_folder(spec.dir)
    paths = []
    for stem, df in (("sweep", table), ("rates", rates)):
        if df is None:
            for ext in ("parquet", "csv"):
                (spec.dir / f"{stem}.{ext}").unlink(missing_ok=True)
            continue
        for ext in ("parquet", "csv"):
            path = spec.dir / f"{stem}.{ext}"
            _write_atomic(df, path)
            paths.append(path)
    return paths


def write_metadata(spec: SweepSpec) -> Path:
    """``sweep.json``: what was varied and how (``kvsim plot`` reads it)."""
    meta = {
        "name": spec.name,
        "source": spec.source,
        "base": spec.base_source,
        "set": spec.set,
        "grid": {k: list(v) for k, v in spec.grid.items()},
        "zip": {k: list(v) for k, v in spec.zip.items()},
        "params": spec.param_keys,
        "find_rate": spec.find_rate.as_dict() if spec.find_rate else None,
    }
    path = claim_folder(spec.dir) / "sweep.json"
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(meta, indent=2, default=str))
    return path


# --- running -------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """What a sweep did: its folder, its tables, and how many runs ran, were reused, failed."""

    dir: Path
    table: pd.DataFrame
    rates: pd.DataFrame | None
    executed: int  # runs simulated by this invocation
    reused: int  # rows answered from run folders already there
    failed: int  # rows whose run failed (now or before)
    paths: list[Path]


class _Progress:
    """A rich progress bar with ETA on a terminal; else (a log, CI) a plain line on stderr as
    runs complete, at most every :data:`PROGRESS_LINE_S` seconds, and a last one at ETA 0 if
    any was printed; nothing when not ``enabled`` (``--no-progress``, tests)."""

    def __init__(self, enabled: bool, name: str):
        self.bar = None
        self.lines = False
        self.name = name
        self.printed = 0
        self.state = (0, 0, 0)  # total, done, failed
        self.started = self.last = time.monotonic()
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            console = Console(stderr=True)
            if console.is_terminal:
                self.bar = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("runs, [red]{task.fields[failed]} failed[/red]"),
                    TimeElapsedColumn(),
                    TextColumn("ETA"),
                    TimeRemainingColumn(),
                    console=console,
                )
                self.task = self.bar.add_task(name, total=None, failed=0)
            else:
                self.lines = True
        self.failed = 0

    def __enter__(self):
        self.started = self.last = time.monotonic()
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.bar:
            self.bar.stop()
        elif self.printed and exc_type is None:
            self._line(done_now=True)

    def update(self, total: int, done: int, failed: int) -> None:
        if self.bar:
            self.bar.update(self.task, total=total, completed=done, failed=failed)
        elif self.lines:
            self.state = (total, done, failed)
            if time.monotonic() - self.last >= PROGRESS_LINE_S:
                self._line()

    def _line(self, done_now: bool = False) -> None:
        from kvsim.simulator.app.run_progress import clock

        total, done, failed = self.state
        self.last = time.monotonic()
        elapsed = self.last - self.started
        eta = 0 if done_now or done >= total else math.ceil(elapsed * (total - done) / done) if done else None
        print(f"{self.name}: {done}/{total} runs, {failed} failed, {clock(elapsed)} elapsed, ETA "
              f"{'-:--:--' if eta is None else clock(eta)}", file=sys.stderr, flush=True)
        self.printed += 1


PROGRESS_LINE_S = 5.0
"""Without a terminal, a sweep's progress line comes at most this often (as runs complete)."""


def run_sweep(
    spec: SweepSpec,
    executor: str | Executor = "local",
    *,
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    plot_runs: bool = False,
    progress: bool = False,
    run_fn: RunFn = execute_run,
) -> SweepResult:
    """Run every point of ``spec`` not already done; write the tables; return them.

    ``executor``: ``local`` (process pool of ``workers``, default one per core;
    ``workers=1`` runs in this process), ``ray`` (``address`` or a local Ray of ``workers``
    CPUs), or an :class:`~simulator.app.executors.Executor` (not closed here). It is started
    only if some run is left to do. ``run_fn`` is what a worker calls with each
    :class:`~simulator.app.executors.RunJob` (for tests). On ``KeyboardInterrupt`` the queued
    runs are dropped and the tables are written with the rest ``pending``.
    """
    points = expand_points(spec)
    validate_points(spec, points)
    write_metadata(spec)
    runs_dir = spec.dir / "runs"
    base_dir = str(Path(spec.base_dir).resolve())
    criterion = spec.find_rate.criterion if spec.find_rate else None
    searches = {p.index: spec.find_rate.bisection() for p in points} if spec.find_rate else {}
    search_failed: dict[int, str] = {}

    rows: dict[tuple[int, float | None], TableRow] = {}
    finished: dict[str, tuple[bool, dict | None]] = {}  # run_id -> (ok, summary), this invocation
    waiting: dict[str, list[tuple[SweepPoint, float | None]]] = {}
    events: deque = deque()  # (point, rate, ok, summary) ready to hand to a search
    counts = {"executed": 0, "reused": 0, "submitted": 0, "failed": 0}
    raws: dict[str, dict] = {}  # run_id -> raw config, for submitting it later
    held: dict[str, RunLock] = {}  # runs this sweep simulates now (their locks)
    foreign: dict[str, RunLock] = {}  # runs another sweep into this folder holds
    owned = isinstance(executor, str)
    ex: Executor | None = None if owned else executor

    def stored(run_id: str) -> tuple[bool, dict | None] | None:
        if run_id in finished:
            return finished[run_id]
        run_dir = runs_dir / run_id
        status = run_status(run_dir)
        if status == "ok":
            return True, json.loads((run_dir / "summary.json").read_text())
        if status == "failed" and not retry_failed:
            return False, None
        return None

    def submit(run_id: str, raw: dict) -> None:
        nonlocal ex
        if ex is None:
            try:
                ex = make_executor(executor, run_fn, workers=workers, address=address)
            except (ImportError, ValueError, ConnectionError) as e:
                raise SweepError(f"executor {executor}: {e}") from None
        ex.submit(RunJob(run_id, raw, base_dir, str(runs_dir / run_id), plot_runs))
        counts["submitted"] += 1

    def claim(run_id: str) -> bool:
        """Take the run's lock, or leave the run to the sweep that holds it (see
        :mod:`simulator.app.run_lock`); False when it turned out to be done meanwhile."""
        lock = RunLock(runs_dir, run_id)
        if not lock.try_acquire():
            foreign[run_id] = lock
            return True
        known = stored(run_id)  # finished by another sweep before we took the lock?
        if known is not None:
            lock.release()
            settle(run_id, *known, reused=True)
            return False
        held[run_id] = lock
        submit(run_id, raws[run_id])
        return True

    def settle(run_id: str, ok: bool, summary: dict | None, reused: bool = False) -> None:
        counts["reused"] += reused
        finished[run_id] = (ok, summary)
        for point, rate in waiting.pop(run_id, []):
            events.append((point, rate, ok, summary))

    def poll_foreign() -> None:
        """Runs another sweep holds: done -> reuse; lock free but no result -> run them."""
        for run_id in list(foreign):
            if not foreign[run_id].try_acquire():
                continue
            lock = foreign.pop(run_id)
            known = stored(run_id)
            if known is not None:
                lock.release()
                settle(run_id, *known, reused=True)
            else:  # the other sweep stopped (killed?) before finishing it
                held[run_id] = lock
                submit(run_id, raws[run_id])

    def request(point: SweepPoint, rate: float | None) -> None:
        cfg, raw = resolve_raw(spec, point, rate)
        run_id = config_hash(cfg)
        rows[(point.index, rate)] = TableRow(point, rate, run_id)
        known = stored(run_id)
        if known is not None:
            if run_id not in finished:
                counts["reused"] += 1
            events.append((point, rate, *known))
        elif run_id in waiting:
            waiting[run_id].append((point, rate))
        else:
            waiting[run_id] = [(point, rate)]
            raws[run_id] = raw
            claim(run_id)

    def deliver(point: SweepPoint, rate: float | None, ok: bool, summary: dict | None) -> None:
        search = searches.get(point.index)
        if search is None or point.index in search_failed:
            return
        if not ok:
            search_failed[point.index] = f"the run at rate {rate:g} failed"
            return
        search.record(rate, criterion.sustainable(summary))
        for r in search.wanted():
            if (point.index, r) not in rows:
                request(point, r)

    def expected_total() -> int:
        left = sum(s.remaining_estimate() for i, s in searches.items() if i not in search_failed)
        return counts["submitted"] + len(foreign) + left

    try:
        with _Progress(progress, f"sweep {spec.name}") as bar:
            for point in points:
                if point.index in searches:
                    for r in searches[point.index].wanted():
                        request(point, r)
                else:
                    request(point, None)
            while True:
                while events:
                    deliver(*events.popleft())
                poll_foreign()
                if events:
                    continue
                bar.update(expected_total(), counts["executed"], counts["failed"])
                if ex is None or ex.pending() == 0:
                    if not foreign:
                        break
                    time.sleep(FOREIGN_POLL_S)  # only runs another sweep holds are left
                    continue
                job, outcome = ex.next_done()
                _record(job, outcome)
                held.pop(job.run_id).release()
                counts["executed"] += 1
                counts["failed"] += not outcome.ok
                settle(job.run_id, outcome.ok, outcome.summary)
    except BaseException:
        if owned and ex is not None:
            ex.close(cancel=True)
            ex = None
        _finish(spec, points, rows, searches, search_failed)
        raise
    finally:
        if owned and ex is not None:
            ex.close()
        for lock in [*held.values(), *foreign.values()]:
            lock.release()
    table, rates, paths = _finish(spec, points, rows, searches, search_failed)
    failed = int((table["status"] == "failed").sum())
    return SweepResult(spec.dir, table, rates, counts["executed"], counts["reused"], failed, paths)


def _record(job: RunJob, outcome: RunOutcome) -> None:
    """Write what a worker did not: a failure, or the tables a remote worker sent back."""
    if outcome.ok and outcome.result is not None:
        write_run(outcome.result, Path(job.run_dir), plot=job.plot)
    elif not outcome.ok:
        write_failure(Path(job.run_dir), outcome.error or "failed", outcome.details, job.config)


def _finish(spec, points, rows, searches, search_failed):
    ordered = sorted(
        rows.values(), key=lambda r: (r.point.index, -1.0 if r.rate is None else r.rate)
    )
    table = build_table(spec, ordered)
    rates = rate_table(spec, points, searches, search_failed) if spec.find_rate else None
    paths = write_tables(spec, table, rates)
    return table, rates, paths


def rate_table(
    spec: SweepSpec,
    points: Sequence[SweepPoint],
    searches: dict[int, RateBisection],
    search_failed: dict[int, str],
) -> pd.DataFrame:
    """One row per grid point: the sustainable rate its search found."""
    records = []
    for p in points:
        s = searches[p.index]
        rec = {"run": p.index, "system": p.label}
        rec |= {k: _cell(p.params.get(k)) for k in spec.param_keys if k != spec.find_rate.key}
        if p.index in search_failed:
            status, rate, bracket, error = "failed", None, (None, None), search_failed[p.index]
        elif s.done:
            res = s.result()
            status, rate, bracket, error = res.status, res.rate, res.bracket, None
        else:
            status, rate, bracket, error = "pending", None, (None, None), None
        rec |= {
            "search_status": status,
            "sustainable_rate": rate,
            "bracket_lo": bracket[0],
            "bracket_hi": bracket[1],
            "widened": s.widened,
            "evaluations": len(s.points),
            "error": error,
            "criterion": spec.find_rate.criterion.describe(),
        }
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    for c in ("sustainable_rate", "bracket_lo", "bracket_hi"):
        df[c] = df[c].astype(float)
    df["error"] = df["error"].astype(object)
    return _uniform_columns(df, [k for k in spec.param_keys if k in df])


__all__ = [
    "LABEL",
    "SweepError",
    "SweepPoint",
    "SweepResult",
    "SweepSpec",
    "TableRow",
    "build_table",
    "expand_points",
    "load_sweep",
    "parse_axis",
    "resolve_config",
    "run_status",
    "run_sweep",
    "system_label",
    "validate_points",
    "write_failure",
]
