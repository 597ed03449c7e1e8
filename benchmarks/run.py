"""``make bench``: wall time, simulated tokens per wall second and peak RSS per case.

Each case runs in its own process so its peak RSS is its own (``os.wait4``).
Cases:

a. the full Azure conv trace (19,366 requests) on Llama-2-70B, TP 2, A100-80GB,
   paged blocks of 16, max_num_seqs 128, max_num_batched_tokens 4096;
b. the same with Orca-Max;
c. beam search of width 4 on 10,000 Alpaca-like requests;
d. 10,000 / 100,000 / 1,000,000 Poisson requests with ShareGPT-like lengths,
   streamed from the generator (Llama-2-7B, one A100-80GB, 5 req/s);
val. the replay ``kvsim validate`` runs on the shipped real vLLM run (300 requests with token
   ids, vllm-v1, profiled cost model), exactly as the command runs it (one step-table row per
   iteration, for its per-second curves): the target is well under a second;
moon16 / moon256. (prefix-caching speed) the whole Mooncake synthetic trace (3,993
   requests, 61M prompt tokens, 22.5M distinct) on vLLM v1's prefix cache, blocks of 16 / 256
   tokens, with a KV budget that evicts nothing (targets: <= 1 s and <= 300 MB; 16 within
   1.5x of 256);
mt10k / mt30k / mt100k. the generated multi-turn workload of
   ``configs/sglang_vs_vllm/multi_turn.yaml`` scaled to about 10k / 30k / 100k requests
   (more conversations at the same rate): the target is a flat cost per request.
sg3k / sg12k. SGLang's radix cache (page 1) on long multi-turn conversations shaped like
   Mooncake's conversation trace: 1,000 conversations of 2-22 turns over about an hour,
   12,163 requests, 148M prompt tokens (12k a prompt; ``sg3k``: the first 250 conversations);
   the engine falls behind and the queue grows, so the memory a waiting request holds counts
   (target for sg12k: peak RSS <= 1 GB).

Start-up (process start to the engine's first event) is ``benchmarks.startup``.

Each case also reports its CPU seconds (``time.process_time``): on a machine others share,
wall time counts their load too, while CPU time stays close to the single-core wall time.

Usage: ``python -m benchmarks.run [--cases a,b,...] [--no-macro]``. After the detailed
table it prints, in Markdown, the table the README's "Speed" section shows (:func:`readme_table`),
so the README's numbers are this command's output, pasted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

AZURE = {"trace": {"format": "azure", "path": "traces/data/AzureLLMInferenceTrace_conv.csv"}}


def poisson_sharegpt(n: int) -> dict:
    return {
        "model": {"name": "llama-2-7b"},
        "hardware": {"gpu": "a100-80gb"},
        "workload": {"arrivals": {"kind": "poisson", "rate": 5.0},
                     "lengths": {"kind": "preset", "name": "sharegpt-paper"}, "num_requests": n},
    }


CASES: dict[str, tuple[str, dict]] = {
    "a": ("Azure conv, Llama-2-70B TP2, paged-16", {
        "model": {"name": "llama-2-70b"}, "hardware": {"gpu": "a100-80gb", "tensor_parallel": 2},
        "workload": AZURE, "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": 4096},
    }),
    "b": ("Azure conv, Llama-2-70B TP2, orca-max", {
        "model": {"name": "llama-2-70b"}, "hardware": {"gpu": "a100-80gb", "tensor_parallel": 2},
        "workload": AZURE, "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": 4096},
        "allocator": {"kind": "contiguous", "preset": "orca-max"},
    }),
    "c": ("beam width 4, 10k Alpaca-like, OPT-13B", {
        "model": {"name": "opt-13b"}, "hardware": {"gpu": "a100-40gb", "kv_cache_gib": 12},
        "workload": {"arrivals": {"kind": "poisson", "rate": 5.0},
                     "lengths": {"kind": "preset", "name": "alpaca-paper"}, "num_requests": 10_000,
                     "beam_width": 4},
    }),
    "d10k": ("10k Poisson ShareGPT-like, Llama-2-7B", poisson_sharegpt(10_000)),
    "d100k": ("100k Poisson ShareGPT-like, Llama-2-7B", poisson_sharegpt(100_000)),
    "d1m": ("1M Poisson ShareGPT-like, Llama-2-7B", poisson_sharegpt(1_000_000)),
    "val": ("replay of a real vLLM run (kvsim validate, vllm-v1)", {}),  # config: validation_replay()
}



MOONCAKE_DISTINCT_TOKENS = 26_000_000
"""An upper bound of the token slots the whole Mooncake synthetic trace ever fills at once with
nothing evicted: 43,924 distinct 512-token hash blocks (22.5M tokens), 0.6M output tokens, and
per request at most one partly filled prompt block and one output block (3,993 x 528)."""


def mooncake_v1(block_size: int) -> dict:
    """The whole Mooncake synthetic trace on vLLM v1's prefix cache (as
    ``configs/sglang_vs_vllm/mooncake.yaml``, without its 400-request window), with enough
    blocks of ``block_size`` tokens that nothing is ever evicted."""
    return {
        "model": {"name": "llama-3-8b", "context_len_tokens": 131072},
        "hardware": {"gpu": "h100-sxm",
                     "num_gpu_blocks": -(-MOONCAKE_DISTINCT_TOKENS // block_size)},
        "workload": {"trace": {"format": "mooncake", "path": "traces/data/synthetic_trace.jsonl"}},
        "allocator": {"kind": "paged", "block_size": block_size, "prefix_caching": True},
        "scheduler": {"policy": "vllm-v1", "max_num_seqs": 256, "max_num_batched_tokens": 8192},
    }


def multi_turn_v1(conversations: int) -> dict:
    """``configs/sglang_vs_vllm/multi_turn.yaml`` with ``conversations`` conversations of 2-8
    turns (5 on average, so about 5 requests each), vLLM v1's prefix cache, blocks of 16, the
    KV budget vLLM computes for one H100 (the cache fills and evicts)."""
    return {
        "model": {"name": "llama-3-8b"},
        "hardware": {"gpu": "h100-sxm"},
        "workload": {"multi_turn": {
            "conversations": conversations, "conversation_rate": 6.0, "turns": {"min": 2, "max": 8},
            "system_prompt_tokens": 600, "user_tokens": {"min": 20, "max": 200},
            "output_tokens": {"min": 50, "max": 400}, "think_time_s": 5.0, "assumed_tpot_s": 0.02}},
        "allocator": {"kind": "paged", "block_size": 16, "prefix_caching": True},
        "scheduler": {"policy": "vllm-v1", "max_num_seqs": 256, "max_num_batched_tokens": 8192},
    }


def multi_turn_sglang(conversations: int) -> dict:
    """Long chat conversations on SGLang's radix cache (page 1), about 12 requests each of
    12k prompt tokens on average (a 4,500-token system prompt, user messages of 200-1,000 and
    answers of 100-700 tokens, 2-22 turns), starting at 0.28 a second (about an hour for 1,000),
    on one H100 (the engine falls behind: the waiting queue grows)."""
    return {
        "model": {"name": "llama-3-8b", "context_len_tokens": 131072},
        "hardware": {"gpu": "h100-sxm"},
        "cost_model": {"kind": "roofline", "efficiencies": "measured-rtx4090-a100"},
        "workload": {"multi_turn": {
            "conversations": conversations, "conversation_rate": 0.28, "turns": {"min": 2, "max": 22},
            "system_prompt_tokens": 4500, "user_tokens": {"min": 200, "max": 1000},
            "output_tokens": {"min": 100, "max": 700}, "think_time_s": 5.0, "assumed_tpot_s": 0.02}},
        "allocator": {"kind": "paged", "block_size": 1, "prefix_caching": True},
        "scheduler": {"policy": "sglang", "max_num_seqs": 256, "max_num_batched_tokens": 8192},
    }


CASES.update({
    "moon16": ("Mooncake synthetic (3,993 req), vllm-v1 prefix cache, block 16, no eviction",
               mooncake_v1(16)),
    "moon256": ("Mooncake synthetic (3,993 req), vllm-v1 prefix cache, block 256, no eviction",
                mooncake_v1(256)),
    "mt10k": ("multi-turn chat, 2,000 conversations, vllm-v1 prefix cache", multi_turn_v1(2_000)),
    "mt30k": ("multi-turn chat, 6,000 conversations, vllm-v1 prefix cache", multi_turn_v1(6_000)),
    "mt100k": ("multi-turn chat, 20,000 conversations, vllm-v1 prefix cache",
               multi_turn_v1(20_000)),
    "sg3k": ("long multi-turn chat, 250 conversations (~3k req), sglang radix cache", multi_turn_sglang(250)),
    "sg12k": ("long multi-turn chat, 1,000 conversations (~12k req, 148M prompt tokens), sglang radix cache",
              multi_turn_sglang(1_000)),
})

AS_VALIDATE_RUNS = ("val",)
"""Cases timed with the config ``kvsim validate`` builds, unchanged (no overrides below)."""


def validation_replay() -> dict:
    """The vllm-v1 replay (profiled cost model) of the shipped real run, as ``kvsim validate``
    builds it."""
    from pathlib import Path

    from kvsim.simulator.app.validate import plan_replay, read_run_folder, replay_config

    root = Path(__file__).resolve().parents[1] / "gpu_validation" / "runs" / "vllm-0.19-rtx4090-llama-3.1-8b"
    folder = read_run_folder(root)
    return replay_config(folder, plan_replay(folder), "vllm-v1").model_dump(mode="json")


# The README's "Speed" table: a row per label, several cases in one row joined by " / ".
README_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Azure conv trace (19,366 requests), Llama-2-70B TP2, paged-16", ("a",)),
    ("the same with Orca-Max", ("b",)),
    ("beam search width 4, 10,000 Alpaca-like requests", ("c",)),
    ("10,000 / 100,000 / 1,000,000 Poisson ShareGPT-like requests (5 req/s, Llama-2-7B)",
     ("d10k", "d100k", "d1m")),
    ("replay of a measured vLLM run (300 requests, `kvsim validate`, vllm-v1)", ("val",)),
)

# The prefix-caching speed table, printed after the README's "Speed" table.
PREFIX_CACHE_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Mooncake synthetic trace (3,993 requests, 61M prompt tokens), vllm-v1 prefix cache "
     "evicting nothing, block 16 / 256", ("moon16", "moon256")),
    ("multi-turn chat, about 10k / 30k / 100k requests, vllm-v1 prefix cache, block 16",
     ("mt10k", "mt30k", "mt100k")),
)

PER_REQUEST_CASES = ("d10k", "d100k", "d1m")
"""Cases whose wall time per request the README quotes (cost per request, flat as they grow)."""
PREFIX_CACHE_PER_REQUEST = ("moon16", "moon256", "mt10k", "mt30k", "mt100k")


def _seconds(wall_s: float) -> str:
    """Two significant digits, as the README prints them: 0.56 s, 5.5 s, 54 s, 130 s."""
    return f"{float(f'{wall_s:.2g}'):g} s"


def readme_table(results: dict[str, dict],
                 rows: tuple[tuple[str, tuple[str, ...]], ...] = README_ROWS,
                 per_request_cases: tuple[str, ...] = PER_REQUEST_CASES) -> str:
    """The README's Markdown table (case | wall | peak RSS) from measured cases, a row per
    ``rows`` entry; a row whose cases were not all run is left out. Below it, the wall time
    per request of ``per_request_cases`` (the README quotes it)."""
    lines = ["| case | wall | peak RSS |", "| --- | --- | --- |"]
    for label, cases in rows:
        if not all(c in results for c in cases):
            continue
        wall = " / ".join(_seconds(results[c]["wall_s"]) for c in cases)
        rss = " / ".join(f"{results[c]['peak_rss_mib']:.0f}" for c in cases) + " MiB"
        lines.append(f"| {label} | {wall} | {rss} |")
    per_request = [
        f"{c}: {results[c]['wall_s'] / results[c]['requests'] * 1e6:.0f} µs"
        for c in per_request_cases if c in results
    ]
    if per_request:
        lines.append("\nwall time per request: " + ", ".join(per_request))
    return "\n".join(lines)


def run_case(name: str, macro: bool) -> dict:
    """Run one case in this process; return its measurements."""
    from kvsim.simulator.config import validate_config
    from kvsim.simulator.engine.runner import run_experiment

    if name in AS_VALIDATE_RUNS:
        raw = validation_replay()
    else:
        raw = json.loads(json.dumps(CASES[name][1]))
        raw.setdefault("metrics", {})["step_table"] = False
        raw.setdefault("engine", {})["macro_steps"] = macro
    raw["name"] = f"bench-{name}"
    cfg = validate_config(raw, source=f"benchmark {name}")
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = run_experiment(cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    s = result.summary
    return {"case": name, "wall_s": wall, "cpu_s": cpu, "tokens": s["prefill_tokens"] + s["decode_tokens"],
            "requests": s["num_requests"], "completed": s["completed"], "rows": s["engine_rows"],
            "iterations": s["num_steps"], "evictions": s.get("prefix_cache_evictions", 0)}


def measure(name: str, macro: bool) -> dict:
    """Run a case in a child process and add its peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", name] + ([] if macro else ["--no-macro"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"benchmark {name} failed (status {status})")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="a,b,c,d10k,d100k,d1m,val,moon16,moon256,mt10k,mt30k,mt100k,sg12k",
                   help="comma-separated: " + ",".join(CASES))
    p.add_argument("--no-macro", action="store_true", help="step one iteration at a time (for comparison)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_case(args.child, not args.no_macro)))
        return 0
    from rich.console import Console
    from rich.table import Table

    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    table = Table(title=f"kvsim benchmarks ({'single steps' if args.no_macro else 'macro-steps'})")
    for col in ("case", "what", "requests", "wall s", "cpu s", "sim tokens / wall s", "wall µs / request", "peak RSS MiB",
                "engine rows", "iterations"):
        table.add_column(col, justify="right" if col not in ("case", "what") else "left")
    console = Console(width=170)
    measured: dict[str, dict] = {}
    for name in names:
        with console.status(f"running {name} ..."):
            r = measure(name, not args.no_macro)
        measured[name] = r
        table.add_row(name, CASES[name][0], f"{r['requests']:,}", f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}",
                      f"{r['tokens'] / r['wall_s']:,.0f}",
                      f"{r['wall_s'] / r['requests'] * 1e6:.0f}", f"{r['peak_rss_mib']:.0f}", f"{r['rows']:,}",
                      f"{r['iterations']:,}")
        console.print(f"{name}: {r['wall_s']:.2f} s, peak RSS {r['peak_rss_mib']:.0f} MiB")
    console.print(table)
    print("\nREADME (Speed):\n")
    print(readme_table(measured))
    if any(c in measured for _, cases in PREFIX_CACHE_ROWS for c in cases):
        print("\nPrefix caching:\n")
        print(readme_table(measured, PREFIX_CACHE_ROWS, PREFIX_CACHE_PER_REQUEST))
    return 0


if __name__ == "__main__":
    sys.exit(main())
