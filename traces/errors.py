"""Errors and warnings for bad trace input: always name the file and line."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file or row that cannot be read; the message names where and why.

    ``line`` is the 1-based line number in the file, or ``None`` when the problem
    concerns the whole file (e.g. it is empty).
    """

    def __init__(self, path: object, line: int | None, problem: str):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class TraceWarning(UserWarning):
    """Something in a trace was repaired rather than rejected (e.g. unsorted rows sorted)."""
