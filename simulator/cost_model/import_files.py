"""The files every operator-profile importer reads and writes, whatever the format
(``profile_import``: LLMServingSim's bundle; ``vidur_import``: Vidur's CSVs).

- Measured tables are CSV files with a header: ``read_rows`` refuses a missing file or
  column, ``cell_number`` a cell that is not a finite number >= 0, each in one line naming
  the file, the line and the column (the caller's own error class, so a user learns which
  format was being read).
- Public profiles come with a ``LICENSE`` and a ``SOURCES.md`` (found in the folder or the
  nearest folder above it): the profile's provenance quotes the licence's title and copyright lines and the
  sources' first paragraph, and both files are copied next to the written profile as
  ``<name>.LICENSE`` and ``<name>.SOURCES.md``.

Plain Python (no numpy, torch, simpy or pydantic), like the importers.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from kvsim.simulator.cost_model.operator_profile import OperatorProfile, write_operator_profile
from kvsim.simulator.outputs import OutputError, check_file, check_name, write_file


def read_rows(path: Path, columns: tuple[str, ...],
              error: type[ValueError]) -> list[dict[str, str]]:
    """The rows of CSV file ``path`` (column -> text); raises ``error`` when the file or one of
    ``columns`` is missing."""
    return list(iter_rows(path, columns, error))


def iter_rows(path: Path, columns: tuple[str, ...], error: type[ValueError]) -> Iterator[dict[str, str]]:
    """``read_rows`` one row at a time, so a large table (Vidur's) is never held whole; the
    file and its columns are checked when the first row is asked for."""
    if not path.is_file():
        raise error(f"{path}: missing")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise error(f"{path}: missing column(s) {', '.join(missing)} (has {reader.fieldnames})")
        yield from reader


def cell_number(row: dict[str, str], col: str, path: Path, line: int, integer: bool,
                error: type[ValueError]) -> float:
    """Column ``col`` of ``row`` (line ``line`` of ``path``) as an int (``integer``) or a float;
    raises ``error`` unless it is a finite number >= 0."""
    text = row[col]
    try:
        v = int(text) if integer else float(text)
    except (TypeError, ValueError):
        raise error(f"{path}:{line}: {col}: expected {'an integer' if integer else 'a number'}, "
                    f"got {text!r}") from None
    if v < 0 or not math.isfinite(v):
        raise error(f"{path}:{line}: {col}: expected a value >= 0, got {text!r}")
    return v


def find_up(start: Path, name: str, levels: int) -> Path | None:
    """File ``name`` in ``start`` or in one of the ``levels`` folders above it (nearest first)."""
    for d in [start, *list(start.parents)[:levels]]:
        if (d / name).is_file():
            return d / name
    return None


def find_up_to_root(start: Path, name: str) -> Path | None:
    """File ``name`` in ``start`` or the nearest folder above it that has one, up to the
    repository ``start`` is in (the first folder holding ``.git``) or, outside a repository,
    the filesystem's root: a bundle copied deep into a repository finds the licence at its top."""
    for d in [start, *start.resolve().parents]:
        if (d / name).is_file():
            return d / name
        if (d / ".git").exists():
            return None
    return None


def first_paragraph(text: str) -> str:
    """The first paragraph of Markdown ``text`` that is neither a heading nor a table, on one
    line, without a trailing colon (it introduces a list in a SOURCES.md)."""
    for block in re.split(r"\n\s*\n", text):
        lines = [x.strip() for x in block.strip().splitlines() if not x.startswith("#")]
        if lines and not lines[0].startswith("|"):
            return " ".join(lines).rstrip(":")
    return ""


def licence_summary(text: str) -> str:
    """A licence's title (its first line) and each of its copyright lines, comma-separated."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if not lines:
        return ""
    return ", ".join([lines[0], *[x for x in lines[1:] if x.lower().startswith("copyright")]])


DEFAULT_OUT_DIR = Path("results") / "profiles"
"""Where ``kvsim calibrate --import`` writes by default: beside the other results, in the
working directory (the shipped ``gpu_validation/profiles`` is written only when asked)."""


def write_with_sources(profile: OperatorProfile, out_dir: str | Path, licence_file: Path | None,
                       sources_file: Path | None) -> Path:
    """Writes ``<out_dir>/<name>.yaml`` and copies the licence and the attribution beside it
    (those found); returns the profile's path.

    By :mod:`simulator.outputs`'s rule for loose files: the name must be a plain slug, and
    each file replaces only one kvsim wrote there (unchanged since); else OutputError, checked
    for all three before any is written."""
    out_dir = Path(out_dir)
    try:
        check_name(profile.name, "profile name")
    except ValueError as e:
        raise OutputError(str(e)) from None
    path = out_dir / f"{profile.name}.yaml"
    copies = {out_dir / f"{profile.name}.LICENSE": licence_file,
              out_dir / f"{profile.name}.SOURCES.md": sources_file}
    copies = {target: source for target, source in copies.items() if source is not None}
    for target in (path, *copies):
        check_file(target)
    out_dir.mkdir(parents=True, exist_ok=True)
    with write_file(path) as tmp:
        write_operator_profile(profile, tmp)
    for target, source in copies.items():
        with write_file(target) as tmp:
            shutil.copyfile(source, tmp)
    return path
