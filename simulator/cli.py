"""The ``kvsim`` command line.

    kvsim run CONFIG [--set KEY=VALUE ...]   simulate one experiment
    kvsim trace stats FILE | trace plot FILE inspect a trace
    kvsim calibrate [...]                    measure a GPU (needs CUDA; see gpu_validation)

Every user error (bad config, bad trace row, a run that cannot progress) is one
line on stderr and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
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
    ("kv_cache_usage_perc", "KV cache allocated (%)", "{:.1f}"),
    ("mem_token_states_perc", "  token states (%)", "{:.1f}"),
    ("mem_reserved_perc", "  reserved (%)", "{:.1f}"),
    ("mem_internal_frag_perc", "  internal fragmentation (%)", "{:.1f}"),
    ("mem_external_frag_perc", "  external fragmentation (%)", "{:.1f}"),
    ("mem_stranded_free_perc", "  free while a request waits (%)", "{:.1f}"),
    ("mem_idle_free_perc", "  free, nothing waiting (%)", "{:.1f}"),
)


def summary_table(summary: dict, title: str) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label, fmt in HEADLINE:
        v = summary.get(key)
        table.add_row(f"{label} [dim]{key}[/dim]", "-" if v is None or v != v else fmt.format(v))
    return table


def cmd_run(args: argparse.Namespace) -> int:
    from simulator.config import load_config
    from simulator.results import default_run_dir, write_run
    from simulator.runner import run_experiment

    cfg, base_dir = load_config(args.config, args.set or [])
    if args.out:
        cfg = cfg.model_copy(update={"output_dir": args.out})
    console = Console()
    with console.status(f"simulating {cfg.name} ..."):
        result = run_experiment(cfg, base_dir)
    run_dir = write_run(result, default_run_dir(cfg, args.run), plot=not args.no_plot)
    console.print(summary_table(result.summary, f"{cfg.name}  ({result.wall_s:.2f} s wall)"))
    console.print(f"results: {run_dir}")
    if not args.no_plot:
        console.print(f"plot:    {run_dir / 'memory_timeline.png'}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from gpu_validation.bench import main as bench_main

    return bench_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvsim", description="Simulate KV-cache memory management for LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="simulate one experiment (a YAML config)")
    run.add_argument("config", help="experiment YAML, e.g. configs/quickstart.yaml")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. allocator.block_size=32")
    run.add_argument("--run", help="name of the run folder (default: hash of the resolved config)")
    run.add_argument("--out", help="results folder (default: the config's output_dir, 'results')")
    run.add_argument("--no-plot", action="store_true", help="do not draw the memory timeline")
    run.set_defaults(func=cmd_run)

    try:
        from simulator.trace_cli import add_trace_commands
    except ImportError:  # pragma: no cover - trace commands are optional at import time
        add_trace_commands = None
    if add_trace_commands is not None:
        add_trace_commands(sub)

    cal = sub.add_parser("calibrate", help="measure kernels on a GPU and write a cost-model profile")
    cal.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for python -m gpu_validation.bench")
    cal.set_defaults(func=cmd_calibrate)
    return p


def main(argv: list[str] | None = None) -> int:
    from simulator.config import ConfigError
    from simulator.engine import SimulationStalled
    from traces import TraceError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, TraceError, SimulationStalled) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"error: {e.filename}: file not found" if e.filename else f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
