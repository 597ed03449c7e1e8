"""``kvsim trace stats FILE`` and ``kvsim trace plot FILE``: look at a trace before
simulating it.

:func:`add_trace_commands` registers both on the CLI's argparse subparsers; each
sets ``func`` to a handler taking the parsed arguments and returning the exit
status (0 ok, 2 bad input, reported on one line on stderr). ``trace plot`` writes its PNG by
:mod:`simulator.outputs`'s rule for a loose file: a file already there is replaced only if
kvsim wrote it (and it is unchanged since), else the command fails and touches nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.simulator.outputs import write_file
from kvsim.simulator.workload import resolve_data_path
from kvsim.traces import LENGTHS, Request, TraceError, detect_format, load_trace, read_lengths
from kvsim.traces.fields import TIME_UNITS
from kvsim.traces.formats import NAMED_FORMATS, TraceFormat, file_type_of, generic_format
from kvsim.traces.plots import plot_trace
from kvsim.traces.stats import trace_stats

if TYPE_CHECKING:
    from rich.table import Table

FORMATS = ("auto", *NAMED_FORMATS, "generic")


def add_trace_commands(subparsers) -> None:
    """Register ``trace stats`` and ``trace plot`` on an argparse subparsers object."""
    trace = subparsers.add_parser("trace", help="statistics and plots of a request trace")
    commands = trace.add_subparsers(dest="trace_command", metavar="{stats,plot}", required=True)
    stats = commands.add_parser(
        "stats",
        help="count, rate, burstiness, lengths, prefix-cache hit ratio",
        description="Print a trace's count, time span, mean rate, inter-arrival CV, "
        "prompt and output length mean/median/p99 and, with hash ids, the ideal "
        "prefix-block hit ratio (unbounded cache).",
    )
    _add_file_arguments(stats)
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.set_defaults(func=run_trace_stats)
    plot = commands.add_parser("plot", help="arrivals over time and length histograms (PNG)")
    _add_file_arguments(plot)
    plot.add_argument(
        "-o",
        "--output",
        type=Path,
        help="PNG to write (default: FILE's name with .png, here); a file there that kvsim "
        "did not write is never replaced",
    )
    plot.set_defaults(func=run_trace_plot)


def _add_file_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trace file (CSV or JSON lines); shipped names work too")
    parser.add_argument(
        "--format", choices=FORMATS, default="auto", help="file format (default: from header)"
    )
    parser.add_argument(
        "--on-unsorted",
        choices=("sort", "error"),
        default="sort",
        help="unsorted timestamps: sort with a warning (default) or fail",
    )
    parser.add_argument(
        "--columns",
        metavar="TIME,PROMPT,OUTPUT[,HASH_IDS]",
        help="generic format: the column (CSV) or key (JSON) names",
    )
    parser.add_argument(
        "--time-unit", choices=TIME_UNITS, default="s", help="generic format: timestamp unit"
    )


def read_requests(args: argparse.Namespace) -> tuple[Path, Iterator[Request]]:
    """The file the arguments name and its requests; a lengths-only file gives
    requests that all arrive at t = 0."""
    path = resolve_data_path(args.file, key="FILE")
    fmt = _format(path, args)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt in ("lengths", LENGTHS):
        pairs = read_lengths(path, LENGTHS)
        return path, (Request(i, 0.0, p, o) for i, (p, o) in enumerate(pairs))
    return path, load_trace(path, fmt, on_unsorted=args.on_unsorted)


def _format(path: Path, args: argparse.Namespace) -> str | TraceFormat:
    if args.format != "generic":
        if args.columns:
            raise ValueError("--columns is for --format generic")
        return args.format
    names = (args.columns or "").split(",")
    if len(names) not in (3, 4) or not all(n.strip() for n in names):
        raise ValueError("--format generic needs --columns TIME,PROMPT,OUTPUT[,HASH_IDS]")
    return generic_format(
        arrival_time=names[0].strip(),
        prompt_tokens=names[1].strip(),
        output_tokens=names[2].strip(),
        hash_ids=names[3].strip() if len(names) == 4 else None,
        time_unit=args.time_unit,
        file_type=file_type_of(path),
    )


def run_trace_stats(args: argparse.Namespace) -> int:
    """``kvsim trace stats``: a table (or JSON) of :func:`traces.stats.trace_stats`."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path, requests = read_requests(args)
            stats = trace_stats(requests)
    except (TraceError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        from rich.console import Console

        Console().print(stats_table(stats, title=str(path)))
    return 0


def run_trace_plot(args: argparse.Namespace) -> int:
    """``kvsim trace plot``: arrivals over time and length histograms, as a PNG."""
    out = args.output
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path, requests = read_requests(args)
            out = plot_output_path(args.output, path)
            with write_file(out) as tmp:  # a file of the user's there is refused (simulator.outputs)
                plot_trace(requests, tmp, title=path.name)
    except (TraceError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. the output folder is not writable
        print(f"error: {e.filename or out}: {e.strerror or e}", file=sys.stderr)
        return 2
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if not out.is_file():  # never claim a file that is not there
        print(f"error: {out}: the plot was not written", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def plot_output_path(output: Path | None, trace: Path) -> Path:
    """The file ``trace plot`` writes: ``-o`` as given (a name without an extension gets
    ``.png``, as matplotlib would add silently), or the trace's name with ``.png``, here."""
    if output is None:
        return Path(trace.name).with_suffix(".png")
    return output if output.suffix else output.with_name(output.name + ".png")


_ROWS = (
    ("requests", "count", "", "{:,}"),
    ("time span", "time_span_s", "s", "{:,.1f}"),
    ("mean rate", "mean_rate_per_s", "requests/s", "{:.3f}"),
    ("inter-arrival CV", "interarrival_cv", "(1 = Poisson)", "{:.3f}"),
    ("prompt mean", "prompt_mean", "tokens", "{:,.2f}"),
    ("prompt median", "prompt_median", "tokens", "{:,.0f}"),
    ("prompt p99", "prompt_p99", "tokens", "{:,.0f}"),
    ("prompt max", "prompt_max", "tokens", "{:,}"),
    ("output mean", "output_mean", "tokens", "{:,.2f}"),
    ("output median", "output_median", "tokens", "{:,.0f}"),
    ("output p99", "output_p99", "tokens", "{:,.0f}"),
    ("output max", "output_max", "tokens", "{:,}"),
    ("prefix blocks (hash ids)", "hash_blocks", "blocks", "{:,}"),
    ("ideal prefix-block hit ratio", "ideal_prefix_hit_ratio", "(unbounded cache)", "{:.3f}"),
)


def stats_table(stats: dict, title: str = "") -> Table:
    """A rich table of :func:`trace_stats` output; undefined values show as n/a."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("statistic")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for label, key, unit, fmt in _ROWS:
        value = stats.get(key)
        table.add_row(label, "n/a" if value is None else fmt.format(value), unit)
    return table


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m kvsim.simulator.app.trace_cli trace stats FILE``."""
    parser = argparse.ArgumentParser(prog="kvsim")
    add_trace_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
