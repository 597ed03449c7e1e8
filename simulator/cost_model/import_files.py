"""The files every operator-profile importer reads and writes, whatever the format
(``profile_import``: LLMServingSim's bundle; ``vidur_import``: Vidur's CSVs).

- Measured tables are CSV files with a header: ``read_rows`` refuses a missing file or
  column, ``cell_number`` a cell that is not a finite number >= 0, each in one line naming
  the file, the line and the column (the caller's own error class, so a user learns which
  format was being read).
- Public profiles come with a ``LICENSE`` and a ``SOURCES.md`` (found in the folder or a few
  above it): the profile's provenance quotes the licence's title and copyright lines and the
  sources' first paragraph, and both files are copied next to the written profile as
  ``<name>.LICENSE`` and ``<name>.SOURCES.md``.

Plain Python (no numpy, torch, simpy or pydantic), like the importers.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
from pathlib import Path

from kvsim.simulator.cost_model.operator_profile import OperatorProfile, write_operator_profile


def read_rows(path: Path, columns: tuple[str, ...],
              error: type[ValueError]) -> list[dict[str, str]]:
    """The rows of CSV file ``path`` (column -> text); raises ``error`` when the file or one of
    ``columns`` is missing."""
    if not path.is_file():
        raise error(f"{path}: missing")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise error(f"{path}: missing column(s) {', '.join(missing)} (has {reader.fieldnames})")
        return list(reader)


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


def write_with_sources(profile: OperatorProfile, out_dir: str | Path, licence_file: Path | None,
                       sources_file: Path | None) -> Path:
    """Writes ``<out_dir>/<name>.yaml`` and copies the licence and the attribution beside it
    (those found); returns the profile's path."""
    out_dir = Path(out_dir)
    path = write_operator_profile(profile, out_dir / f"{profile.name}.yaml")
    if licence_file is not None:
        shutil.copyfile(licence_file, out_dir / f"{profile.name}.LICENSE")
    if sources_file is not None:
        shutil.copyfile(sources_file, out_dir / f"{profile.name}.SOURCES.md")
    return path
