"""The files every profile importer shares (``simulator.cost_model.import_files``): the
licence and attribution quoted into a profile's provenance, the search for them above the
imported folder, and the one-line refusals of a bad CSV cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.simulator.cost_model.import_files import (
    cell_number,
    find_up,
    first_paragraph,
    licence_summary,
    read_rows,
)


class FormatError(ValueError):
    """Stands for an importer's own error class."""


def test_the_licence_keeps_its_title_and_every_copyright_line():
    text = "MIT License\n\nCopyright (c) 2025 B.\nCopyright (c) 2024 A.\n\nPermission is hereby granted"
    assert licence_summary(text) == "MIT License, Copyright (c) 2025 B., Copyright (c) 2024 A."
    assert licence_summary("Copyright (c) 2024 A.\nPermission") == "Copyright (c) 2024 A."  # not twice
    assert licence_summary("\n\n") == ""


def test_the_source_is_the_first_paragraph_that_is_no_heading_or_table():
    text = "# Sources\n\n| file | commit |\n|---|---|\n\nAll files come from\nsomewhere:\n\n- a list"
    assert first_paragraph(text) == "All files come from somewhere"
    assert first_paragraph("# only a heading\n") == ""


def test_the_licence_is_found_up_to_the_given_number_of_folders_above(tmp_path: Path):
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (tmp_path / "LICENSE").write_text("MIT License")
    assert find_up(deep, "LICENSE", 3) == tmp_path / "LICENSE"
    assert find_up(deep, "LICENSE", 2) is None
    (deep / "LICENSE").write_text("nearer")
    assert find_up(deep, "LICENSE", 0) == deep / "LICENSE"


def test_a_bad_cell_or_a_missing_column_is_one_line_naming_file_line_and_column(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("tokens,time_us\n16,1.5\n-1,2\n8,nan\n4,x\n")
    rows = read_rows(path, ("tokens", "time_us"), FormatError)
    assert cell_number(rows[0], "tokens", path, 2, True, FormatError) == 16
    assert cell_number(rows[0], "time_us", path, 2, False, FormatError) == 1.5
    with pytest.raises(FormatError, match=r"t.csv:3: tokens: expected a value >= 0, got '-1'$"):
        cell_number(rows[1], "tokens", path, 3, True, FormatError)
    with pytest.raises(FormatError, match=r"t.csv:4: time_us: expected a value >= 0, got 'nan'$"):
        cell_number(rows[2], "time_us", path, 4, False, FormatError)
    with pytest.raises(FormatError, match=r"t.csv:5: time_us: expected a number, got 'x'$"):
        cell_number(rows[3], "time_us", path, 5, False, FormatError)
    with pytest.raises(FormatError, match=r"t.csv: missing column\(s\) layer \(has \['tokens', 'time_us'\]\)$"):
        read_rows(path, ("layer", "tokens"), FormatError)
    with pytest.raises(FormatError, match=r"u.csv: missing$"):
        read_rows(tmp_path / "u.csv", ("layer",), FormatError)
