"""KV bytes per request of the catalogue's hybrid models: exact by layer kind vs counted as
full attention, the over-count a simulator makes that treats every layer as full attention.

    python -m kvsim.simulator.cost_model.hybrid_table [--tokens 1024,8192,32768,131072]

One row per model: its layers by kind, then for each request length the exact bytes
(``ModelSpec.request_kv_bytes``), the bytes counted as full attention
(``ModelSpec.naive_request_kv_bytes``, what kvsim's paged allocator charges today) and their
ratio. Bytes are the whole model's (all KV heads, every GPU of a replica), in MiB; a length
beyond the model's context window shows "-".
"""

from __future__ import annotations

import argparse
import sys

from kvsim.simulator.cost_model.catalogue import MODELS
from kvsim.simulator.cost_model.layers import counts

HYBRID_MODELS = ("gpt-oss-20b", "gpt-oss-120b", "gemma-3-12b", "gemma-3-27b", "llama-4-scout",
                 "qwen3-next-80b-a3b", "nemotron-h-8b", "jamba-1.5-mini", "deepseek-v3")
TOKENS = (1024, 8192, 32768, 131072)
MiB = 2**20


def layer_summary(name: str) -> str:
    """The model's layers by kind, e.g. ``12 full + 12 window 128``."""
    m = MODELS[name]
    spans = {type(k).__name__: getattr(k, "window", getattr(k, "chunk", None)) for k in m.layer_kinds}
    parts = []
    for code, n in counts(m.layer_kinds).items():
        span = spans["SlidingWindow"] if code == "window" else spans["ChunkedLocal"] if code == "chunked" else None
        parts.append(f"{n} {code}" + (f" {span}" if span else ""))
    return " + ".join(parts)


def table(models: tuple[str, ...] = HYBRID_MODELS, tokens: tuple[int, ...] = TOKENS) -> str:
    """The markdown table (the README's "Hybrid models: what each layer stores")."""
    head = "| model | layers | " + " | ".join(f"{t:,} tokens: exact / as full (x)" for t in tokens) + " |"
    rows = [head, "|---|---|" + "---:|" * len(tokens)]
    for name in models:
        m = MODELS[name]
        cells = []
        for t in tokens:
            if t > m.max_seq_len:
                cells.append("-")
                continue
            exact, naive = m.request_kv_bytes(t), m.naive_request_kv_bytes(t)
            cells.append(f"{exact / MiB:,.1f} / {naive / MiB:,.1f} MiB ({naive / exact:.2f}x)")
        rows.append(f"| `{name}` | {layer_summary(name)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsim.simulator.cost_model.hybrid_table",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)),
                        help="request lengths in tokens, comma-separated (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        parser.error(f"--tokens: {args.tokens!r} is not a comma-separated list of whole numbers")
    if any(t < 1 for t in tokens):
        parser.error("--tokens: each length is at least 1 token")
    print(table(tokens=tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
