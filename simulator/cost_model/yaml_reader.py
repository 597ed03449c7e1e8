"""Typed values out of a parsed YAML profile, each error naming ``file: key.path``.

Shared by both profile formats (``operator_profile`` and ``calibration_profile``, both in
this package), so a malformed file reads the same one-line way in either. Plain
Python: ``gpu_validation`` writes calibration profiles on a GPU machine without simpy or pydantic.
"""

from __future__ import annotations

from typing import Any


class YamlReader:
    """Base of the profile readers: subclasses set ``error`` and add their own value kinds."""

    error: type[Exception] = ValueError

    def __init__(self, source: str):
        self.source = source  # the file's path, printed first in every error

    def fail(self, key: str, what: str) -> Exception:
        return self.error(f"{self.source}: {key}: {what}")

    def mapping(self, d: Any, key: str) -> dict:
        if not isinstance(d, dict):
            raise self.fail(key, f"expected a mapping, got {type(d).__name__}")
        return d

    def get(self, d: dict, name: str, key: str) -> Any:
        if name not in d:
            raise self.fail(f"{key}.{name}" if key else name, "missing")
        return d[name]
