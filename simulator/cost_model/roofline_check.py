"""The roofline checked against a measured operator profile, over the profile's own grid.

    python -m simulator.cost_model.roofline_check [PROFILE] [--gpu rtx4090] [--model llama-3.1-8b]
                                                  [--plot FILE.png] [--fit]

For every measured attention point — decode batches (sequences x context), prefill chunks
(chunk x cached prefix) and mixed steps (a chunk plus decodes) — it builds the step of that
shape and times it twice: with the roofline (``RooflineCostModel``, its default efficiencies
unless given) and with the profiled model (at a grid point: the measured operators' sum).
It prints the distribution of ``roofline / profiled - 1`` per kind of step, and optionally
plots one against the other. ``--fit`` searches the roofline's compute and memory
efficiencies and per-step overhead that minimise the median absolute error on the grid,
each kind of step weighing the same (reported, not applied: one GPU's fit is not a default).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import warnings
from dataclasses import dataclass

from simulator.cost_model.base import BatchShape, causal_attention_pairs
from simulator.cost_model.catalogue import GPUS, MODELS
from simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    load_profile,
)
from simulator.cost_model.roofline import RooflineCostModel, RooflineParams


@dataclass(frozen=True)
class Point:
    kind: str  # decode | prefill | mixed
    shape: BatchShape
    profiled_s: float
    roofline_s: float

    @property
    def error(self) -> float:
        return self.roofline_s / self.profiled_s - 1


def grid_shapes(profiled: ProfiledCostModel) -> list[tuple[str, BatchShape]]:
    """One step per measured attention point (one prefill sequence; ``n`` decodes of equal context)."""
    out = []
    for pc, kp, nd, kd, _ in profiled.profile.tp[1].attention.points():
        kind = "decode" if pc == 0 else "prefill" if nd == 0 else "mixed"
        out.append((kind, BatchShape(prefill_seqs=int(pc > 0), prefill_tokens=pc,
                                     prefill_attn_pairs=causal_attention_pairs(pc, kp) if pc else 0.0,
                                     decode_seqs=nd, decode_context=nd * kd)))
    return out


def compare(profile: str = "rtx4090-llama-3.1-8b", gpu: str = "rtx4090", model: str = "llama-3.1-8b",
            params: RooflineParams | None = None) -> list[Point]:
    prof = load_profile(profile)
    m, g = MODELS[model], GPUS[gpu]
    profiled = ProfiledCostModel(prof, m, g)
    roofline = RooflineCostModel(m, g, params=params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        return [Point(kind, s, profiled.step_time(s), roofline.step_time(s)) for kind, s in grid_shapes(profiled)]


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def error_table(points: list[Point]) -> list[tuple[str, int, float, float, float, float]]:
    """Per kind (and all): count, p5, median, p95 of the signed error, and median |error|."""
    rows = []
    for kind in ("decode", "prefill", "mixed", "all"):
        e = [p.error for p in points if kind in ("all", p.kind)]
        if e:
            rows.append((kind, len(e), quantile(e, 0.05), statistics.median(e), quantile(e, 0.95),
                         statistics.median(abs(x) for x in e)))
    return rows


def fit(profile: str, gpu: str, model: str) -> tuple[RooflineParams, float]:
    """Efficiencies and step overhead minimising the median |error| on the grid, averaged over
    decode, prefill and mixed steps (a coarse search)."""
    best = None
    for ce, me, oh in itertools.product((0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), (0.6, 0.7, 0.8, 0.9, 1.0),
                                        (0.0, 2.5e-4, 5e-4, 1e-3)):
        p = RooflineParams(compute_efficiency=ce, memory_efficiency=me, step_overhead_s=oh)
        points = compare(profile, gpu, model, p)  # each kind of step weighs the same
        err = statistics.fmean(statistics.median(abs(x.error) for x in points if x.kind == k)
                               for k in ("decode", "prefill", "mixed"))
        if best is None or err < best[1]:
            best = (p, err)
    return best


def plot(points: list[Point], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for kind, colour in (("mixed", "0.75"), ("decode", "tab:blue"), ("prefill", "tab:red")):
        pts = [p for p in points if p.kind == kind]
        ax.scatter([p.profiled_s * 1e3 for p in pts], [p.roofline_s * 1e3 for p in pts], s=6, c=colour,
                   label=f"{kind} ({len(pts)})")
    lo = min(min(p.profiled_s, p.roofline_s) for p in points) * 1e3
    hi = max(max(p.profiled_s, p.roofline_s) for p in points) * 1e3
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="profiled step time (ms)", ylabel="roofline step time (ms)",
           title="roofline vs measured operators")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.cost_model.roofline_check", description=__doc__.split("\n")[0])
    p.add_argument("profile", nargs="?", default="rtx4090-llama-3.1-8b")
    p.add_argument("--gpu", default="rtx4090", choices=sorted(GPUS))
    p.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODELS))
    p.add_argument("--plot", metavar="PNG", help="scatter of roofline vs profiled step times")
    p.add_argument("--fit", action="store_true", help="also search the roofline's efficiencies (slow: ~1 min)")
    args = p.parse_args(argv)
    points = compare(args.profile, args.gpu, args.model)
    print(f"roofline / profiled - 1 on {len(points)} steps of {args.profile} ({args.model} on {args.gpu})")
    print(f"{'steps':8s} {'n':>5s} {'p5':>8s} {'median':>8s} {'p95':>8s} {'|median|':>9s}")
    for kind, n, p5, med, p95, amed in error_table(points):
        print(f"{kind:8s} {n:5d} {p5:+8.1%} {med:+8.1%} {p95:+8.1%} {amed:9.1%}")
    if args.fit:
        params, err = fit(args.profile, args.gpu, args.model)
        print(f"best fit: compute_efficiency {params.compute_efficiency}, memory_efficiency "
              f"{params.memory_efficiency}, step_overhead_s {params.step_overhead_s}: median |error| {err:.1%} "
              "(mean over decode, prefill, mixed)")
    if args.plot:
        plot(points, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
