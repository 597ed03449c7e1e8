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
        # args hold the constructor's arguments, so the error can be re-created (SimPy re-raises
        # a process's exception as type(e)(*e.args)) and pickled (sweep workers).
        super().__init__(self.path, line, problem)

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.problem}"


class TraceWarning(UserWarning):
    """Something in a trace was repaired rather than rejected (e.g. unsorted rows sorted)."""
