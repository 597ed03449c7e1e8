"""Read request traces from CSV and JSON-lines files, one row at a time.

All formats go through one reader driven by a :class:`~traces.formats.TraceFormat`
(column names, file type, time unit). Rows are parsed with the ``csv`` / ``json``
modules line by line and yielded as :class:`~traces.request.Request` records, so
memory stays bounded however long the file is.

Conventions every loader follows:

* arrival times are seconds since the first request (the earliest timestamp);
* ``request_id`` is 0, 1, 2, ... in arrival order;
* a bad row raises :class:`~traces.errors.TraceError` naming the file, the line and
  the problem; token counts must be integers >= 1, timestamps finite and >= 0;
* unsorted timestamps: ``on_unsorted="error"`` raises at the first row that goes
  back in time; ``"sort"`` (the default) warns with :class:`~traces.errors.TraceWarning`
  and sorts. Sorting needs the whole trace in memory, so ``"sort"`` first scans the
  timestamp column alone (one extra pass that holds nothing) and buffers the rows
  only when the file really is out of order. Equal timestamps keep file order.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import warnings
from array import array
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path

import numpy as np

from kvsim.traces.errors import TraceError, TraceWarning
from kvsim.traces.fields import (
    MAX_SPAN_S,
    MAX_TOKENS,
    SPAN_TEXT,
    CellError,
    parse_hash_ids,
    parse_token_ids,
    parse_tokens,
    time_parser,
    time_unit_seconds,
)
from kvsim.traces.formats import (
    AZURE,
    MOONCAKE,
    NAMED_FORMATS,
    TOKEN_IDS,
    VIDUR,
    TraceFormat,
    detect_format,
    file_type_of,
    generic_format,
)
from kvsim.traces.request import Request

ON_UNSORTED = ("sort", "error")

# (line number, time in seconds from an arbitrary origin, prompt, output, hash ids, token ids)
_Record = tuple[int, float, int, int, "tuple[int, ...] | None", "tuple[int, ...] | None"]


def load_trace(
    path: str | Path, format: str | TraceFormat = "auto", *, on_unsorted: str = "sort"
) -> Iterator[Request]:
    """Stream the requests of a trace file.

    ``format`` is ``"auto"`` (tell from the header), a named format (``azure``,
    ``mooncake``, ``vidur``, ``token-ids``) or a :class:`TraceFormat` (see :func:`read_generic`).
    The file is found and its format decided now; rows are read as the iterator
    is consumed.
    """
    path = Path(path)
    fmt = resolve_format(path, format)
    if fmt.arrival_time is None:
        raise TraceError(
            path, None, f"a '{fmt.name}' file has no arrival times; use it as a length pool"
        )
    if on_unsorted not in ON_UNSORTED:
        raise ValueError(f"on_unsorted must be 'sort' or 'error'; got {on_unsorted!r}")
    return _requests(path, fmt, on_unsorted)


def read_azure(path: str | Path, *, on_unsorted: str = "sort") -> Iterator[Request]:
    """Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    return load_trace(path, AZURE, on_unsorted=on_unsorted)


def read_mooncake(path: str | Path, *, on_unsorted: str = "sort") -> Iterator[Request]:
    """Mooncake JSON lines (timestamp in ms, input_length, output_length, hash_ids)."""
    return load_trace(path, MOONCAKE, on_unsorted=on_unsorted)


def read_token_ids(path: str | Path, *, on_unsorted: str = "sort") -> Iterator[Request]:
    """JSON lines with the prompts' token ids (input_toks, output_toks, arrival_time_ns,
    input_tok_ids): requests carry ``token_ids``, so prefix-cache hits are exact."""
    return load_trace(path, TOKEN_IDS, on_unsorted=on_unsorted)


def read_vidur(path: str | Path, *, on_unsorted: str = "sort") -> Iterator[Request]:
    """Vidur / Splitwise CSV (arrived_at in s, num_prefill_tokens, num_decode_tokens)."""
    return load_trace(path, VIDUR, on_unsorted=on_unsorted)


def read_generic(
    path: str | Path,
    *,
    arrival_time: str,
    prompt_tokens: str,
    output_tokens: str,
    hash_ids: str | None = None,
    time_unit: str = "s",
    file_type: str | None = None,
    hash_block_tokens: int = 512,
    on_unsorted: str = "sort",
) -> Iterator[Request]:
    """Any CSV or JSON-lines trace whose column names and time unit are given.

    ``file_type`` defaults from the extension (.jsonl/.json/.ndjson: JSON lines).
    ``time_unit`` is one of s, ms, us, ns, datetime.
    """
    path = Path(path)
    fmt = generic_format(
        arrival_time=arrival_time,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        hash_ids=hash_ids,
        time_unit=time_unit,
        file_type=file_type or file_type_of(path),
        hash_block_tokens=hash_block_tokens,
    )
    return load_trace(path, fmt, on_unsorted=on_unsorted)


def read_lengths(path: str | Path, format: str | TraceFormat = "auto") -> Iterator[tuple[int, int]]:
    """Stream (prompt_tokens, output_tokens) pairs of any trace or lengths file,
    ignoring its timestamps."""
    path = Path(path)
    fmt = dataclasses.replace(resolve_format(path, format), arrival_time=None, hash_ids=None,
                              token_ids=None)
    return ((prompt, output) for _, _, prompt, output, _, _ in _records(path, fmt))


def load_length_pool(
    path: str | Path, format: str | TraceFormat = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """All (prompt, output) lengths of a file as two int64 arrays, for sampling.

    A pool is sampled at random, so unlike a trace it is held in memory
    (16 bytes a row).
    """
    prompts, outputs = array("q"), array("q")
    for prompt, output in read_lengths(path, format):
        prompts.append(prompt)
        outputs.append(output)
    return np.frombuffer(prompts, dtype=np.int64), np.frombuffer(outputs, dtype=np.int64)


def resolve_format(path: Path, format: str | TraceFormat) -> TraceFormat:
    """The :class:`TraceFormat` named by ``format`` (``auto`` reads the header)."""
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    if isinstance(format, TraceFormat):
        return format
    if format == "auto":
        return detect_format(path)
    if format in NAMED_FORMATS:
        return NAMED_FORMATS[format]
    raise ValueError(
        f"trace format must be 'auto', one of {', '.join(NAMED_FORMATS)} or a TraceFormat "
        f"(a generic format needs its column names); got {format!r}"
    )


# --- reading -------------------------------------------------------------------------------


def _requests(path: Path, fmt: TraceFormat, on_unsorted: str) -> Iterator[Request]:
    """Records in arrival order as Requests, numbered and rebased to the first arrival."""
    records: Iterator[_Record] | list[_Record] = _records(path, fmt)
    if on_unsorted == "sort":
        disorder = _first_disorder(path, fmt)
        if disorder is not None:
            line, earlier_line = disorder
            warnings.warn(
                TraceWarning(
                    f"{path}:{line}: timestamps are not sorted (this row arrives before the "
                    f"row on line {earlier_line}); sorting the whole trace in memory"
                ),
                stacklevel=2,
            )
            records = sorted(records, key=itemgetter(1))
    block = fmt.hash_block_tokens
    origin = None
    previous, previous_line = -math.inf, 0
    for request_id, (line, time, prompt, output, ids, tokens) in enumerate(records):
        if time < previous:
            raise TraceError(
                path,
                line,
                f"timestamps are not sorted: this row arrives {previous - time:.6g} s before "
                f"the row on line {previous_line} (on_unsorted='sort' sorts them)",
            )
        if origin is None:
            origin = time
        if time - origin > MAX_SPAN_S:
            raise TraceError(path, line, f"this row arrives {time - origin:.3g} s after the first one; a trace may span "
                             f"at most {SPAN_TEXT}: is the time unit right?")
        previous, previous_line = time, line
        if ids is None and tokens is None:
            yield Request(request_id, time - origin, prompt, output)
        elif tokens is None:
            yield Request(
                request_id, time - origin, prompt, output, hash_ids=ids, hash_block_tokens=block
            )
        else:
            yield Request(
                request_id, time - origin, prompt, output, hash_ids=ids, hash_block_tokens=block,
                token_ids=tokens,
            )


def _first_disorder(path: Path, fmt: TraceFormat) -> tuple[int, int] | None:
    """(line, earlier line) of the first row whose timestamp goes backwards, reading
    only the time column; None if sorted. A row that cannot be read ends the scan:
    the full parse reports it."""
    parse_time = time_parser(fmt.time_unit, fmt.arrival_time)
    previous, previous_line = -math.inf, 0
    try:
        for line, time in _times(path, fmt, parse_time):
            if time < previous:
                return line, previous_line
            previous, previous_line = time, line
    except (CellError, TraceError, csv.Error):
        return None
    return None


def _times(path: Path, fmt: TraceFormat, parse_time) -> Iterator[tuple[int, float]]:
    """(line, time) of every row, the other columns unread."""
    if fmt.file_type == "jsonl":
        return ((line, parse_time(cells[0])) for line, cells in _jsonl_cells(path, fmt.columns))
    return _csv_times(path, fmt, parse_time)


def _csv_times(path: Path, fmt: TraceFormat, parse_time) -> Iterator[tuple[int, float]]:
    # Plain str.split is ~2x faster than csv.reader; it is exact until a quote
    # character appears, from where csv.reader takes over.
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        reader, index, width = _csv_header(path, f, fmt.columns)
        column = index[0]
        for line_no, text in enumerate(f, reader.line_num + 1):
            if '"' in text:
                quoted = csv.reader(itertools.chain([text], f))
                for row in quoted:
                    if len(row) == width:
                        yield line_no - 1 + quoted.line_num, parse_time(row[column])
                    elif not _is_blank(row):
                        return
                return
            cells = text.split(",")
            if len(cells) == width:
                yield line_no, parse_time(cells[column])
            elif text.strip():
                return


def _records(path: Path, fmt: TraceFormat) -> Iterator[_Record]:
    """Validated rows in file order: (line, time, prompt, output, hash ids)."""
    if fmt.file_type == "jsonl":
        return _jsonl_records(path, fmt)
    return _csv_records(path, fmt)


def _csv_records(path: Path, fmt: TraceFormat) -> Iterator[_Record]:
    """CSV rows; the common case (plain numbers) costs one int()/float() a cell,
    anything else is re-checked cell by cell by :func:`_checked` for its message."""
    timed = fmt.arrival_time is not None
    hashed = fmt.hash_ids is not None or fmt.token_ids is not None  # a list cell: the slow path
    numeric_scale = None if fmt.time_unit == "datetime" else time_unit_seconds(fmt.time_unit)
    parse_time = time_parser(fmt.time_unit, fmt.arrival_time) if timed else None
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        reader, index, width = _csv_header(path, f, fmt.columns)
        pi, oi = index[timed], index[timed + 1]
        ti = index[0] if timed else None
        rows = 0
        try:
            for row in reader:
                if len(row) != width:
                    if _is_blank(row):
                        continue
                    raise TraceError(
                        path,
                        reader.line_num,
                        f"row has {len(row)} fields but the header has {width}",
                    )
                rows += 1
                try:
                    prompt, output = int(row[pi]), int(row[oi])
                    if not timed:
                        time = 0.0
                    elif numeric_scale is not None:
                        time = float(row[ti]) * numeric_scale
                    else:
                        time = parse_time(row[ti])
                    fast = 1 <= prompt <= MAX_TOKENS and 1 <= output <= MAX_TOKENS and 0.0 <= time < math.inf
                except (ValueError, CellError):
                    fast = False
                if fast and not hashed:
                    yield reader.line_num, time, prompt, output, None, None
                else:
                    cells = tuple(row[i] for i in index)
                    checked = _checked(path, reader.line_num, fmt, cells, parse_time)
                    yield (reader.line_num, *checked)
        except csv.Error as e:
            raise TraceError(path, reader.line_num, f"malformed CSV: {e}") from None
        if rows == 0:
            raise TraceError(path, reader.line_num, "no rows after the header")


def _jsonl_records(path: Path, fmt: TraceFormat) -> Iterator[_Record]:
    parse_time = time_parser(fmt.time_unit, fmt.arrival_time) if fmt.arrival_time else None
    for line, cells in _jsonl_cells(path, fmt.columns):
        yield (line, *_checked(path, line, fmt, cells, parse_time))


def _checked(path: Path, line: int, fmt: TraceFormat, cells: tuple, parse_time):
    """(time, prompt, output, hash ids, token ids) of one row, every cell validated; the cells
    are in the order of ``fmt.columns``. ``parse_time`` is the file's one time
    parser (a wall-clock parser measures from the file's first date)."""
    timed = parse_time is not None
    try:
        time = parse_time(cells[0]) if timed else 0.0
        prompt = parse_tokens(cells[timed], fmt.prompt_tokens)
        output = parse_tokens(cells[timed + 1], fmt.output_tokens)
        ids = None
        if fmt.hash_ids is not None:
            ids = parse_hash_ids(cells[timed + 2], fmt.hash_ids)
            blocks = -(-prompt // fmt.hash_block_tokens)
            if len(ids) > blocks:
                raise CellError(
                    f"column '{fmt.hash_ids}' has {len(ids)} ids but {prompt} prompt tokens "
                    f"fill only {blocks} blocks of {fmt.hash_block_tokens} tokens"
                )
        tokens = None
        if fmt.token_ids is not None:
            tokens = parse_token_ids(cells[-1], fmt.token_ids)
            if len(tokens) != prompt:
                raise CellError(
                    f"column '{fmt.token_ids}' has {len(tokens)} token ids but column "
                    f"'{fmt.prompt_tokens}' says the prompt has {prompt} tokens"
                )
    except CellError as e:
        raise TraceError(path, line, e.problem) from None
    return time, prompt, output, ids, tokens


def _csv_header(path: Path, f, columns: tuple[str, ...]):
    """A csv reader positioned after the header, the column indices of ``columns``
    and the header's width. An empty file or a missing column is an error."""
    reader = csv.reader(f)
    try:
        for header in reader:
            if not _is_blank(header):
                break
        else:
            raise TraceError(path, None, f"file is empty (expected columns {_names(columns)})")
    except csv.Error as e:
        raise TraceError(path, reader.line_num, f"malformed CSV: {e}") from None
    names = [cell.strip() for cell in header]
    missing = [c for c in columns if c not in names]
    if missing:
        raise TraceError(
            path,
            reader.line_num,
            f"missing column {_names(missing)}: expected {_names(columns)}, found {_names(names)}",
        )
    return reader, [names.index(c) for c in columns], len(names)


def _is_blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


def _jsonl_cells(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, tuple]]:
    """(line number, the object's values for ``columns``) of every JSON line."""
    pick = itemgetter(*columns)
    rows = 0
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line_no, text in enumerate(f, 1):
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError) as e:
                if not text.strip():
                    continue  # blank line
                raise TraceError(path, line_no, f"not valid JSON: {e}") from None
            if type(obj) is not dict:
                raise TraceError(path, line_no, f"expected a JSON object, got {type(obj).__name__}")
            try:
                cells = pick(obj)
            except KeyError:
                missing = [c for c in columns if c not in obj]
                raise TraceError(
                    path,
                    line_no,
                    f"missing key {_names(missing)}: expected {_names(columns)}, "
                    f"found {_names(obj)}",
                ) from None
            rows += 1
            yield line_no, cells
    if rows == 0:
        raise TraceError(
            path, None, f"file is empty (expected JSON objects with {_names(columns)})"
        )


def _names(names) -> str:
    shown = [str(n) for n in names]
    text = ", ".join(f"'{n}'" for n in shown[:12])
    return text + (f" and {len(shown) - 12} more" if len(shown) > 12 else "")
