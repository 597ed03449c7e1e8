"""The ``kvsim`` command line.

    kvsim run CONFIG [--set KEY=VALUE ...]   simulate one experiment
    kvsim sweep SWEEP [--grid KEY=V1,V2 ...] run a grid of experiments (resumable)
    kvsim plot RESULTS                       draw a sweep's or a run's figures
    kvsim trace stats FILE | trace plot FILE inspect a trace
    kvsim reproduce vllm-paper [--quick]     regenerate the PagedAttention paper's evaluation
    kvsim calibrate [...]                    measure a GPU (needs CUDA; see gpu_validation)
    kvsim calibrate --import DIR             import a public operator profile (cost_model.kind: profiled)
    kvsim validate RUN_FOLDER                replay a measured run and compare (report + figures)

Every user error (bad config, bad trace row, a run that cannot progress) is one
line on stderr and exit status 2 — never a traceback.

Each option is defined once: an option several commands take (``--set``, the sweep
executor's ``--executor``/``--address``/``--workers``/``--no-progress``) comes from one
``_add_*`` function (tests/simulator/app/test_cli_options.py checks that they agree).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.simulator.app.display import fmt_cell, fmt_number, group_reasons

if TYPE_CHECKING:  # rich loads when a command prints: a quiet run starts without it
    from rich.table import Table

HEADLINE = (
    ("completed", "requests completed", "{:.0f}"),
    ("rejected", "requests rejected", "{:.0f}"),
    ("aborted", "requests aborted", "{:.0f}"),
    ("request_throughput", "request throughput (req/s)", "{:.3f}"),
    ("output_throughput", "output throughput (tok/s)", "{:.1f}"),
    ("mean_ttft_ms", "mean TTFT (ms)", "{:.1f}"),
    ("p99_ttft_ms", "p99 TTFT (ms)", "{:.1f}"),
    ("mean_tpot_ms", "mean TPOT (ms)", "{:.2f}"),
    ("p99_tpot_ms", "p99 TPOT (ms)", "{:.2f}"),
    ("normalized_latency_s_per_token", "normalized latency (s/token)", "{:.4f}"),
    ("mean_batched_requests", "mean batched requests", "{:.2f}"),
    ("num_preemptions", "preemptions", "{:.0f}"),
    ("kv_num_gpu_blocks", "GPU KV blocks per replica", "{:.0f}"),
    ("kv_cache_usage_perc", "KV cache usage, allocated (%)", "{:.1f}"),
    ("mem_token_states_perc", "  token states (%)", "{:.1f}"),
    ("mem_reserved_perc", "  reserved (%)", "{:.1f}"),
    ("mem_internal_frag_perc", "  internal fragmentation (%)", "{:.1f}"),
    ("mem_allocator_frag_perc", "  allocator rounding (%)", "{:.1f}"),
    ("mem_external_frag_perc", "  external fragmentation (%)", "{:.1f}"),
    ("mem_stranded_free_perc", "  free while a request waits (%)", "{:.1f}"),
    ("mem_idle_free_perc", "  free, nothing waiting (%)", "{:.1f}"),
)


def summary_table(summary: dict, title: str) -> Table:
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold", caption="summary.json keys: the label's words (mean_ttft_ms), else shown dim")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label, fmt in HEADLINE:
        v = summary.get(key)
        table.add_row(label if label_says(label, key) else f"{label} [dim]{key}[/dim]", fmt_number(v, fmt))
    return table


def label_says(label: str, key: str) -> bool:
    """Whether a row's label already names its summary.json key, so that showing the key would
    repeat it ("requests completed" says ``completed``; "mean TTFT (ms)" says ``mean_ttft_ms``):
    each word of the key begins a word of the label (``frag``: fragmentation; ``/`` reads as
    ``per``, ``%`` as ``perc``), the family prefixes ``num`` and ``mem`` aside."""
    words = re.findall(r"[a-z0-9]+", label.lower().replace("/", " per ").replace("%", " perc "))
    return all(any(w.startswith(k) for w in words) for k in key.split("_") if k not in ("num", "mem"))


def reason_lines(summary: dict) -> list[str]:
    """``205 rejected:`` and why, by kind with counts (likewise aborted), for the console."""
    out = []
    for status, key in (("rejected", "reject_reasons"), ("aborted", "abort_reasons")):
        if summary.get(status):
            out.append(f"{summary[status]} {status}:")
            out += [f"  {line}" for line in group_reasons(summary.get(key) or {})]
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from kvsim.simulator.app.results import default_run_dir, write_run
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.app.shipped_configs import find_config, shipped_names
    from kvsim.simulator.config import ConfigError, load_config
    from kvsim.simulator.engine.runner import expected_duration_s, expected_requests, run_experiment
    from kvsim.simulator.outputs import check_writable

    path = find_config(args.config)
    if not path.exists():
        raise ConfigError(f"{args.config}: no such file, nor a shipped config of that name "
                          f"(shipped: {', '.join(shipped_names())})")
    cfg, base_dir = load_config(path, args.set or [])
    if args.out:
        cfg = cfg.model_copy(update={"output_dir": args.out})
    run_dir = default_run_dir(cfg, args.run)  # a bad --run name fails here
    check_writable(run_dir)  # before simulating: a long run must not end in a write error
    with RunProgress(cfg.name, expected_requests(cfg), quiet=args.quiet,
                     total_sim_s=expected_duration_s(cfg)) as progress:
        result = run_experiment(cfg, base_dir, progress=progress)
    from rich.console import Console

    console = Console()
    run_dir = write_run(result, run_dir, plot=not args.no_plot)
    console.print(summary_table(result.summary, f"{cfg.name}  ({result.wall_s:.2f} s wall)"))
    for line in reason_lines(result.summary):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"results: {run_dir}")
    plot = run_dir / "memory_timeline.png"
    if plot.is_file():  # not drawn with --no-plot, nor without the per-step table
        console.print(f"plot:    {plot}")
    for w in result.warnings:
        print(f"{'error' if args.strict else 'warning'}: {w}", file=sys.stderr)
    return 2 if args.strict and result.warnings else 0


def _parse_find_rate(text: str) -> dict:
    """``lo=0.5,hi=16[,key=...,tolerance=...,max_normalized_latency=...]`` -> a mapping."""
    import yaml

    from kvsim.simulator.app.sweep import SweepError

    out = {}
    for part in text.split(","):
        if "=" not in part:
            raise SweepError(f"--find-rate {text}: expected KEY=VALUE pairs, e.g. lo=0.5,hi=16")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else None
        except (yaml.YAMLError, ValueError):  # (ValueError: an integer of more digits than Python reads)
            raise SweepError(f"--find-rate {k.strip()}: not a number or YAML value: {v[:20]!r}") from None
    return out


def cmd_sweep(args: argparse.Namespace) -> int:
    from kvsim.simulator.app.sweep import expand_points, load_sweep, run_sweep, validate_points

    _check_address(args)
    if args.name is not None:
        from kvsim.simulator.outputs import check_name

        try:
            check_name(args.name, "--name")
        except ValueError as e:
            raise UsageError(str(e)) from None
    spec = load_sweep(args.sweep, grid=args.grid or [], zip_axes=args.zip or [], set_=args.set or [],
                      name=args.name, output_dir=args.out,
                      find_rate=_parse_find_rate(args.find_rate) if args.find_rate else None)
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file gets whole rows
    points = expand_points(spec)
    if args.dry_run:
        validate_points(spec, points)
        for p in points:
            values = ", ".join(f"{k}={v}" for k, v in p.params.items()) or "(base config)"
            console.print(f"{p.index:4d}  {p.label}  [dim]{values}[/dim]", highlight=False)
        what = f"rate searches over {spec.find_rate.key}" if spec.find_rate else "runs"
        console.print(f"{len(points)} {what}, all valid; results would go to {spec.dir}", soft_wrap=True)
        return 0
    result = run_sweep(spec, args.executor, workers=args.workers, address=args.address,
                       retry_failed=args.retry_failed, plot_runs=args.plot_runs,
                       progress=not args.no_progress)
    if result.rates is not None:  # the runs of a search are many: show what they found
        console.print(rates_table(result.rates, f"sustainable rate ({spec.find_rate.criterion.describe()})"))
    else:
        labelled = "label" in spec.axes
        shown = list(spec.grid) if labelled else spec.param_keys  # zipped keys follow the label
        console.print(sweep_table(result.table, [k for k in shown if k != "label"], f"sweep {spec.name}",
                                  show_system=labelled))
    console.print(f"{len(result.table)} runs: {result.executed} simulated now, {result.reused} already done, "
                  f"{result.failed} failed")
    for p in result.paths:
        print(f"table:   {p}")
    if args.plot:
        from kvsim.simulator.app.plot_cli import PlotError, plot_sweep
        from kvsim.simulator.outputs import OutputError

        try:
            for p in plot_sweep(result.dir):
                print(f"plot:    {p}")
        except (PlotError, OutputError) as e:  # the sweep's own results are written all the same
            console.print(f"[yellow]no plots: {e}[/yellow]")
    if result.failed:
        print(f"error: {result.failed} runs failed; their errors are in the error column of "
              f"{result.dir / 'sweep.csv'} (rerun with --retry-failed)", file=sys.stderr)
        return 1
    return 0


SWEEP_COLUMNS = (
    ("normalized_latency_s_per_token", "norm. latency (s/tok)", "{:.4f}"),
    ("request_throughput", "req/s", "{:.3f}"),
    ("mean_batched_requests", "batched", "{:.1f}"),
    ("mem_token_states_perc", "tokens %", "{:.1f}"),
    ("mem_reserved_perc", "reserved %", "{:.1f}"),
    ("mem_internal_frag_perc", "int. frag %", "{:.1f}"),
    ("mem_external_frag_perc", "ext. frag %", "{:.1f}"),
    ("mem_stranded_free_perc", "free, waiting %", "{:.1f}"),
)


def sweep_table(table, params, title: str, max_rows: int = 40, show_system: bool = True) -> Table:
    """The first ``max_rows`` rows of a sweep: system, varied values, status, headline metrics."""
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in ("run", *(["system"] if show_system else []), *params, "status"):
        t.add_column(col.rsplit(".", 1)[-1], no_wrap=True)
    for _, label, _ in SWEEP_COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    for _, row in table.head(max_rows).iterrows():
        cells = [str(row["run"]), *([str(row["system"])] if show_system else []), *(_text(row[p]) for p in params)]
        cells.append("[green]ok[/green]" if row["status"] == "ok" else f"[red]{row['status']}[/red]")
        for key, _, fmt in SWEEP_COLUMNS:
            cells.append(fmt_number(row.get(key), fmt))
        t.add_row(*cells)
    if len(table) > max_rows:
        t.caption = f"{len(table) - max_rows} more rows in the table files"
    return t


def _text(value) -> str:
    return fmt_cell(value)


def rates_table(rates, title: str) -> Table:
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in ("system", "sustainable rate", "search", "bracket", "runs"):
        t.add_column(col, no_wrap=True)
    for _, r in rates.iterrows():
        rate = fmt_number(r["sustainable_rate"], "{:g}")
        bracket = f"[{fmt_number(r['bracket_lo'], '{:g}')}, {fmt_number(r['bracket_hi'], '{:g}')}]" \
            if r["bracket_lo"] == r["bracket_lo"] and r["bracket_hi"] == r["bracket_hi"] else "-"
        t.add_row(str(r["system"]), rate, str(r["search_status"]), bracket, str(r["evaluations"]))
    hints = {"above_hi": "above_hi: the highest rate tried (after widening) met the bound: a lower "
                         "bound, raise hi",
             "below_lo": "below_lo: the lowest rate tried (after widening) missed the bound, lower lo"}
    found = [h for k, h in hints.items() if (rates["search_status"] == k).any()]
    if found:
        t.caption = "; ".join(found)
    return t


def cmd_reproduce(args: argparse.Namespace) -> int:
    from kvsim.simulator.app.reproduce import EXPERIMENTS, reproduce, verdict_counts

    _check_address(args)
    only = tuple(x.strip() for x in (args.only or "").split(",") if x.strip())
    unknown = [x for x in only if x not in {e.key for e in EXPERIMENTS}]
    if unknown:
        raise UsageError(f"--only {', '.join(unknown)}: unknown experiment; choose from "
                         f"{', '.join(e.key for e in EXPERIMENTS)}")
    from rich.console import Console

    console = Console()
    if args.dry_run:
        from kvsim.simulator.app.reproduce import run_experiments

        run_experiments(Path(args.out), args.quick, only=only, log=console.print, dry_run=True)
        console.print("all sections valid; nothing run")
        return 0
    report = reproduce(Path(args.out), quick=args.quick, executor=args.executor, workers=args.workers,
                       address=args.address, only=only, progress=not args.no_progress, log=console.print)
    console.print(f"report:  {report.path}")
    console.print(verdict_counts(report.verdicts))
    if report.figures:
        console.print(f"figures: {report.path.parent / 'figures'}")
    for key, why in report.failed.items():  # a section that failed fails the command
        print(f"error: section {key} failed: {why}", file=sys.stderr)
    return 1 if report.failed else 0


class UsageError(Exception):
    """Options that do not go together, or a value the command does not know; one line."""


def _check_address(args: argparse.Namespace) -> None:
    if args.address and args.executor != "ray":
        raise UsageError(f"--address {args.address}: a cluster address is for --executor ray; the "
                         f"{args.executor} executor runs on this machine")


def cmd_validate(args: argparse.Namespace) -> int:
    from kvsim.simulator.app.validate import validate_run
    from kvsim.simulator.app.validate_report import readme_snippet, write_validation
    from kvsim.simulator.outputs import check_writable

    folder = Path(args.folder)
    out = Path(args.out) if args.out else None
    if out is not None:
        check_writable(out)  # before simulating
    given = {"block_size": args.block_size, "max_model_len": args.max_model_len, "data_parallel": args.data_parallel,
             "tensor_parallel": args.tensor_parallel, "max_num_seqs": args.max_num_seqs,
             "max_num_batched_tokens": args.max_num_batched_tokens, "num_gpu_blocks": args.num_gpu_blocks,
             "prefix_caching": None if args.prefix_caching is None else args.prefix_caching == "on",
             "expert_parallel": args.expert_parallel}
    v = validate_run(folder, workload=args.workload, cost_model=args.cost_model, profile=args.profile,
                     gpu=args.gpu, model=args.model, overrides=args.set or [], given=given)
    out = out or Path("results") / "validate" / v.folder.name
    write_validation(v, out, plot=not args.no_plot)
    if args.readme_snippet:
        print(readme_snippet(v), end="")
        return 0
    print((out / "report.md").read_text(), end="")  # Markdown as written: no terminal wrapping
    print("replay wall time: " + ", ".join(f"{r.label} {r.wall_s:.2f} s" for r in v.replays))
    print(f"report:  {out / 'report.md'}")
    return 0


def _positive_int(text: str) -> int:
    """An option's value that must be a whole number >= 1 (argparse prints the error on one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def cmd_calibrate(args: argparse.Namespace) -> int:
    return run_calibration_bench(args.rest)


def run_calibration_bench(args: list[str]) -> int:
    """``kvsim calibrate``: the GPU benchmark runs as its own program, ``python -m
    gpu_validation.bench``, because the simulator never imports ``gpu_validation`` (DESIGN.md
    "Layout and layering"). Its output streams through; its error lines are passed on."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "kvsim.gpu_validation.bench", *args], stderr=subprocess.PIPE,
                          text=True)
    sys.stderr.write(done.stderr)
    return done.returncode


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (as every other kvsim error), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _add_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE`` (repeatable): one config key overridden, parsed by
    ``simulator.config`` as the YAML value would be. The same option for run, sweep and
    validate; ``help`` says which configs it reaches."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help=help)


def _worker_count(text: str) -> int:
    """``--workers``: 1 to 4096 processes (refused before anything runs or is written)."""
    value = _positive_int(text[:40])
    if value > 4096:
        raise argparse.ArgumentTypeError(f"expected at most 4096 processes, got {value}")
    return value


def _add_dry_run_option(parser: argparse.ArgumentParser) -> None:
    """``--dry-run`` (sweep, reproduce): every run the command would make, resolved and checked
    as it would be run (for reproduce: each section's sweeps as --quick or the full run build
    them), and listed; nothing is run or written."""
    parser.add_argument("--dry-run", action="store_true", help="validate and list the runs; run nothing")


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    """Where the runs of a sweep go (``kvsim sweep`` and ``kvsim reproduce`` share the executor,
    so they share its options): the executor, a Ray address, the worker count, progress bars.
    ``_check_address`` checks the one combination argparse cannot."""
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local process pool (default) or Ray")
    parser.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    parser.add_argument("--workers", type=_worker_count, help="processes (local) or CPUs of a local Ray; default: one "
                        "per core; 1 runs in this process")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress (a bar on a terminal, else a line every few seconds)")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kvsim", description="Simulate KV-cache memory management for LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="simulate one experiment (a YAML config)")
    run.add_argument("config", help="experiment YAML, or a shipped config by name, e.g. quickstart")
    _add_set_option(run, "override a key, e.g. allocator.block_size=32")
    run.add_argument("--run", help="name of the run folder (default: hash of the resolved config)")
    run.add_argument("--out", help="results folder (default: the config's output_dir, 'results')")
    run.add_argument("--no-plot", action="store_true", help="do not draw the memory timeline")
    run.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, else a line every few seconds)")
    run.add_argument("--strict", action="store_true",
                     help="a degenerate run (no request completed, an empty workload) exits 2, not 0")
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser(
        "sweep", help="run a grid of experiments (a sweep file, or a config and --grid axes)",
        description="Run every grid point of a sweep not already done (resumable: finished runs are "
        "skipped by config hash) on a local process pool or Ray; write one table (Parquet and CSV) with "
        "a row per run. See simulator/app/sweep.py for the sweep file format.")
    sw.add_argument("sweep", help="sweep YAML (base + grid/zip/set/find_rate), or an experiment YAML to "
                    "sweep with --grid")
    sw.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                    help="a cartesian axis, e.g. allocator.block_size=1,2,4,8,16")
    sw.add_argument("--zip", action="append", metavar="KEY=V1,V2,...",
                    help="an axis varied together with the other --zip axes (equal lengths)")
    _add_set_option(sw, "override a key in every run")
    sw.add_argument("--find-rate", metavar="lo=L,hi=H[,...]",
                    help="search each grid point's sustainable rate between L and H (widened if the answer "
                    "lies outside); optional keys: key, rel_tolerance (default 0.02 of the rate), tolerance "
                    "(absolute), max_widenings, max_normalized_latency (s/token), max_p99_ttft_ms, "
                    "max_p99_tpot_ms")
    sw.add_argument("--name", help="sweep name (results go to OUT/NAME)")
    sw.add_argument("--out", help="results folder (default: the sweep's output_dir, 'results')")
    _add_executor_options(sw)
    sw.add_argument("--retry-failed", action="store_true", help="run again the configs that failed before")
    sw.add_argument("--plot-runs", action="store_true", help="draw each run's memory timeline")
    sw.add_argument("--plot", action="store_true", help="draw the sweep's figures when done (kvsim plot)")
    _add_dry_run_option(sw)
    sw.set_defaults(func=cmd_sweep)

    from kvsim.simulator.app.plot_cli import add_plot_command

    add_plot_command(sub)

    from kvsim.simulator.app.trace_cli import add_trace_commands

    add_trace_commands(sub)

    rep = sub.add_parser("reproduce", help="regenerate a paper's evaluation (figures + report)",
                         description="Run the paper's experiments (configs/vllm_paper/) through the sweep "
                         "executor, draw each figure and write report.md beside the paper's claims.")
    rep.add_argument("paper", choices=("vllm-paper",), help="which paper")
    rep.add_argument("--quick", action="store_true", help="reduced workloads: a few minutes on 2 cores")
    rep.add_argument("--only", help="comma-separated experiments, e.g. fig2,fig13")
    _add_dry_run_option(rep)
    rep.add_argument("--out", default="results/vllm-paper", help="results folder (default: results/vllm-paper)")
    _add_executor_options(rep)
    rep.set_defaults(func=cmd_reproduce)

    va = sub.add_parser("validate", help="replay a measured serving run and compare (report + figures)",
                        description="Replay a real engine's run (meta.json, requests.jsonl, timeseries.csv and "
                        "the workload with token ids) with the settings it records, under vllm-v1 and vllm-v0, "
                        "and write a measured-vs-simulated report. Nothing is fitted to the measurement. A "
                        "setting the run does not record comes from an option below, the operator profile "
                        "(GPU, block size), the model (context window) or vLLM's default; the report lists "
                        "each, and an error names every one still missing.")
    va.add_argument("folder", help="run folder, e.g. gpu_validation/runs/vllm-0.19-rtx4090-llama-3.1-8b")
    va.add_argument("--workload", help="the workload file (default: meta.json's dataset_path in the folder's "
                    "workload/)")
    va.add_argument("--out", help="report folder (default: results/validate/<run name>)")
    va.add_argument("--cost-model", choices=("profiled", "roofline"), default="profiled",
                    help="step times from an operator profile (default) or the roofline")
    va.add_argument("--profile", help="operator profile NAME or PATH (default: the one for the run's GPU and "
                    "model, shipped or imported into results/profiles)")
    va.add_argument("--gpu", help="catalogue GPU (default: from meta.json's device name, else the profile's)")
    va.add_argument("--model", help="catalogue model (default: from meta.json's model, or its recorded shape)")
    for flag, what in (("--block-size", "KV block size in tokens (default: meta.json's, else the profile's)"),
                       ("--max-model-len", "context window in tokens (default: meta.json's, else the model's)"),
                       ("--data-parallel", "engines, each with its own KV pool (default: meta.json's, else 1)"),
                       ("--tensor-parallel", "GPUs per engine (default: meta.json's, else 1)"),
                       ("--max-num-seqs", "the engine's max_num_seqs (default: meta.json's)"),
                       ("--max-num-batched-tokens", "the engine's token budget per step (default: meta.json's)"),
                       ("--num-gpu-blocks", "KV blocks per engine as vLLM logged them (default: meta.json's, "
                        "else computed)")):
        va.add_argument(flag, type=_positive_int, metavar="N", help=f"{what}; wins over meta.json")
    va.add_argument("--expert-parallel", action="store_true", default=None,
                    help="the run split a MoE model's experts whole over its GPUs (default: meta.json's "
                    "enable_expert_parallel, else off)")
    va.add_argument("--prefix-caching", choices=("on", "off"),
                    help="prefix caching (default: meta.json's, else vLLM's default, on)")
    _add_set_option(va, "override a key of every replay")
    va.add_argument("--no-plot", action="store_true", help="no figures")
    va.add_argument("--readme-snippet", action="store_true",
                    help="print the README's 'How close to a real engine' section")
    va.set_defaults(func=cmd_validate)

    cal = sub.add_parser("calibrate", help="measure kernels on a GPU and write a cost-model profile")
    cal.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for python -m kvsim.gpu_validation.bench")
    cal.set_defaults(func=cmd_calibrate)
    return p


# The errors that are the user's (one line, exit 2), by the module that defines each.
USER_ERRORS = (
    ("kvsim.simulator.config", "ConfigError"), ("kvsim.traces.errors", "TraceError"),
    ("kvsim.simulator.engine.simulation", "SimulationStalled"), ("kvsim.simulator.app.sweep", "SweepError"),
    ("kvsim.simulator.app.plot_cli", "PlotError"), ("kvsim.simulator.outputs", "OutputError"),
    ("kvsim.simulator.cost_model.calibration_profile", "ProfileError"),
    ("kvsim.simulator.cost_model.operator_profile", "OperatorProfileError"),
    ("kvsim.simulator.app.measured_run", "ValidateError"),
)


def _user_errors() -> tuple[type[Exception], ...]:
    """:data:`USER_ERRORS` of the modules loaded so far, and :class:`UsageError`. A class whose
    module was never imported cannot have been raised, so nothing is imported for this: a run
    does not load the sweep, plot and validate modules (pandas) to start, nor while handling
    an error (a Ctrl-C)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in USER_ERRORS)
    return (UsageError, *(cls for cls in found if cls is not None))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["calibrate"] and "--import" in argv[1:]:  # a public profile bundle -> a profile
            from kvsim.simulator.cost_model.profile_import import main as import_main

            return import_main(argv[1:])
        if argv[:1] == ["calibrate"]:  # every later argument belongs to the benchmark, options included
            return run_calibration_bench(argv[1:])
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help (0) or a usage error (2, already printed on one line)
            return e.code if isinstance(e.code, int) else 2
        return args.func(args)
    except _user_errors() as e:  # (evaluated only when an exception propagates)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"error: {e.filename}: file not found" if e.filename else f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a disk that is full, a folder that is not writable, ...
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory: the run is too large for this machine (fewer requests, a shorter "
              "workload.window, or metrics.step_table: false)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
