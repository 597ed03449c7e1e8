"""What the columns of a trace file are called, and how to tell a file's format.

Every loader is the one generic reader (:mod:`traces.loaders`) driven by a
:class:`TraceFormat`; the named formats below are just the column names of the
public traces kvsim knows.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from kvsim.traces.errors import TraceError
from kvsim.traces.fields import TIME_UNITS


@dataclass(frozen=True)
class TraceFormat:
    """Column names, file type and time unit of one kind of trace file.

    ``arrival_time`` is ``None`` for a lengths-only file (a pool of prompt/output
    lengths with no timestamps, such as the ShareGPT statistics file).
    ``hash_block_tokens`` is the number of prompt tokens one hash id covers.
    ``token_ids`` names a column holding the prompt's token ids (a list per row, as
    long as the prompt), when the file records them.
    """

    name: str
    file_type: str  # "csv" or "jsonl"
    arrival_time: str | None
    prompt_tokens: str
    output_tokens: str
    hash_ids: str | None = None
    time_unit: str = "s"
    hash_block_tokens: int = 512
    token_ids: str | None = None

    def __post_init__(self) -> None:
        if self.file_type not in ("csv", "jsonl"):
            raise ValueError(f"file_type must be 'csv' or 'jsonl'; got {self.file_type!r}")
        if self.time_unit not in TIME_UNITS:
            raise ValueError(
                f"time_unit must be one of {', '.join(TIME_UNITS)}; got {self.time_unit!r}"
            )
        if self.hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1; got {self.hash_block_tokens}")

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a file of this format must have."""
        names = (self.arrival_time, self.prompt_tokens, self.output_tokens, self.hash_ids, self.token_ids)
        return tuple(name for name in names if name is not None)


AZURE = TraceFormat(
    "azure", "csv", "TIMESTAMP", "ContextTokens", "GeneratedTokens", time_unit="datetime"
)
"""Azure LLM inference trace 2023: wall-clock TIMESTAMP, ContextTokens, GeneratedTokens."""

MOONCAKE = TraceFormat(
    "mooncake", "jsonl", "timestamp", "input_length", "output_length", "hash_ids", "ms", 512
)
"""Mooncake FAST'25: JSON lines, timestamp in ms, one hash id per 512-token prompt block."""

VIDUR = TraceFormat("vidur", "csv", "arrived_at", "num_prefill_tokens", "num_decode_tokens")
"""Vidur / Splitwise request CSV: arrived_at in seconds."""

LENGTHS = TraceFormat("lengths", "csv", None, "num_prefill_tokens", "num_decode_tokens")
"""A pool of lengths with no arrival times (e.g. the ShareGPT statistics file)."""

TOKEN_IDS = TraceFormat(
    "token-ids", "jsonl", "arrival_time_ns", "input_toks", "output_toks", time_unit="ns",
    token_ids="input_tok_ids",
)
"""JSON lines with the prompt's token ids (the workload format of LLMServingSim's vLLM benchmark,
e.g. ../shared/validation/*/workload/): ``input_toks``, ``output_toks``, ``arrival_time_ns``
(offset from the start, ns) and ``input_tok_ids`` (``input_toks`` ids)."""

NAMED_FORMATS = {f.name: f for f in (AZURE, MOONCAKE, VIDUR, LENGTHS, TOKEN_IDS)}


def generic_format(
    *,
    arrival_time: str | None,
    prompt_tokens: str,
    output_tokens: str,
    file_type: str,
    hash_ids: str | None = None,
    time_unit: str = "s",
    hash_block_tokens: int = 512,
) -> TraceFormat:
    """A user-described CSV or JSON-lines trace."""
    return TraceFormat(
        "generic",
        file_type,
        arrival_time,
        prompt_tokens,
        output_tokens,
        hash_ids,
        time_unit,
        hash_block_tokens,
    )


def file_type_of(path: Path) -> str:
    """``jsonl`` for .jsonl/.json/.ndjson files, else ``csv``."""
    return "jsonl" if path.suffix.lower() in (".jsonl", ".json", ".ndjson") else "csv"


def detect_format(path: str | Path) -> TraceFormat:
    """The named format whose columns the file's header (CSV) or first object
    (JSON lines) contains; Azure, then Vidur, then a lengths-only pool."""
    path = Path(path)
    line_no, first = _first_line(path)
    if first.lstrip().startswith("{"):
        try:
            keys = list(json.loads(first))
        except ValueError as e:
            raise TraceError(path, line_no, f"not valid JSON: {e}") from None
        candidates = [MOONCAKE, TOKEN_IDS]
    else:
        keys = [name.strip() for name in next(csv.reader([first]), [])]
        candidates = [AZURE, VIDUR, LENGTHS]
    for fmt in candidates:
        if set(fmt.columns) <= set(keys):
            return fmt
    known = "; ".join(f"{f.name}: {', '.join(f.columns)}" for f in NAMED_FORMATS.values())
    raise TraceError(
        path,
        line_no,
        f"cannot tell the trace format from its columns ({', '.join(keys) or 'none'}); "
        f"known formats: {known}; otherwise describe the columns as a generic format",
    )


def _first_line(path: Path) -> tuple[int, str]:
    """The first non-blank line and its number; an empty file is an error."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                return line_no, line
    raise TraceError(path, None, "file is empty")
