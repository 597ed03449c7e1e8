"""The roofline checked against a measured operator profile, over the profile's own grid.

    python -m kvsim.simulator.cost_model.roofline_check [PROFILE] [--gpu rtx4090] [--model llama-3.1-8b]
                                                  [--efficiencies NAME] [--plot FILE.png] [--fit]

For every measured attention point — decode batches (sequences x context), prefill chunks
(chunk x cached prefix) and mixed steps (a chunk plus decodes) — it builds the step of that
shape and times it twice: with the roofline (``RooflineCostModel``, the GPU's default fit or
a named preset of ``ROOFLINE_PRESETS``; without the LM head if the profile has none) and with the profiled model (at a grid point: the
measured operators' sum). It prints the distribution of ``roofline / profiled - 1`` per kind
of step, and optionally plots one against the other. ``--fit`` also fits the roofline's
constants to this profile by least squares (``simulator.cost_model.roofline_fit``, which
fits every shipped real profile at once for the defaults) and prints the errors after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from dataclasses import dataclass, replace

from kvsim.simulator.cost_model.base import BatchShape, Deployment
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    load_profile,
)
from kvsim.simulator.cost_model.roofline import (
    RooflineCostModel,
    RooflineParams,
    default_efficiencies,
    roofline_preset,
)
from kvsim.simulator.cost_model.roofline_fit import (
    case_from_profile,
    fit_roofline,
    grid_shapes,
    markdown_table,
    quantile,
)


@dataclass(frozen=True)
class Point:
    kind: str  # decode | prefill | mixed
    shape: BatchShape
    profiled_s: float
    roofline_s: float

    @property
    def error(self) -> float:
        return self.roofline_s / self.profiled_s - 1


def compare(profile: str = "rtx4090-llama-3.1-8b", gpu: str = "rtx4090", model: str = "llama-3.1-8b",
            params: RooflineParams | None = None) -> list[Point]:
    """Each grid step timed by the profile and by the roofline (``params``, else the GPU's
    default fit, ``default_efficiencies``), which leaves out the LM head if the profile did."""
    prof = load_profile(profile)
    m, g = MODELS[model], GPUS[gpu]
    profiled = ProfiledCostModel(prof, Deployment(m, g))
    params = params or RooflineParams(**roofline_preset(default_efficiencies(gpu)))
    roofline = RooflineCostModel(m, g, params=replace(params, lm_head=params.lm_head and prof.times_lm_head))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        return [Point(kind, s, profiled.step_time(s), roofline.step_time(s)) for kind, s in grid_shapes(profiled)]


def error_table(points: list[Point]) -> list[tuple[str, int, float, float, float, float, float]]:
    """Per kind (and all): count, p5, median, p95 of the signed error, and median and p95 of
    |error|."""
    rows = []
    for kind in ("decode", "prefill", "mixed", "all"):
        e = [p.error for p in points if kind in ("all", p.kind)]
        if e:
            a = [abs(x) for x in e]
            rows.append((kind, len(e), quantile(e, 0.05), statistics.median(e), quantile(e, 0.95),
                         statistics.median(a), quantile(a, 0.95)))
    return rows


def plot(panels: dict[str, list[Point]], path: str) -> None:
    """One log-log scatter of roofline vs profiled step times per set of constants, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5), squeeze=False)
    every = [p for points in panels.values() for p in points]
    lo = min(min(p.profiled_s, p.roofline_s) for p in every) * 1e3
    hi = max(max(p.profiled_s, p.roofline_s) for p in every) * 1e3
    for ax, (title, points) in zip(axes[0], panels.items()):
        for kind, colour in (("mixed", "0.75"), ("decode", "tab:blue"), ("prefill", "tab:red")):
            pts = [p for p in points if p.kind == kind]
            ax.scatter([p.profiled_s * 1e3 for p in pts], [p.roofline_s * 1e3 for p in pts], s=6, c=colour,
                       label=f"{kind} ({len(pts)})")
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="profiled step time (ms)", ylabel="roofline step time (ms)",
               title=f"roofline ({title}) vs measured")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvsim.simulator.cost_model.roofline_check", description=__doc__.split("\n")[0])
    p.add_argument("profile", nargs="?", default="rtx4090-llama-3.1-8b")
    p.add_argument("--gpu", default="rtx4090", choices=sorted(GPUS))
    p.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODELS))
    p.add_argument("--efficiencies", metavar="NAME", help="a named preset of roofline constants "
                   "(simulator.cost_model.roofline.ROOFLINE_PRESETS) instead of the GPU's default fit")
    p.add_argument("--plot", metavar="PNG", help="scatter of roofline vs profiled step times (beside the "
                   "hand-picked constants')")
    p.add_argument("--fit", action="store_true", help="also fit the roofline's constants to this profile")
    args = p.parse_args(argv)
    name = args.efficiencies or default_efficiencies(args.gpu)
    label = args.efficiencies or f"{name}, default"
    try:
        params = RooflineParams(**roofline_preset(name))
    except ValueError as e:
        p.error(str(e))
    points = compare(args.profile, args.gpu, args.model, params)
    print(f"roofline / profiled - 1 on {len(points)} steps of {args.profile} ({args.model} on {args.gpu}, "
          f"{label} constants)")
    print(f"{'steps':8s} {'n':>5s} {'p5':>8s} {'median':>8s} {'p95':>8s} {'|median|':>9s} {'|p95|':>7s}")
    for kind, n, p5, med, p95, amed, ap95 in error_table(points):
        print(f"{kind:8s} {n:5d} {p5:+8.1%} {med:+8.1%} {p95:+8.1%} {amed:9.1%} {ap95:7.1%}")
    if args.fit:
        case = case_from_profile(args.profile, args.gpu, args.model)
        result = fit_roofline([case], params)
        q = result.params
        print(f"least-squares fit: compute_efficiency {q.compute_efficiency:.4f}, memory_efficiency "
              f"{q.memory_efficiency:.4f}, step_overhead_s {q.step_overhead_s:.3e}, paged factor at block "
              f"{result.block_size} {result.paged_factor:.4f}")
        print(markdown_table(case, params, q))
    if args.plot:
        panels = {label: points}
        if args.efficiencies != "hand-picked":  # and the constants before the fit, for comparison
            hand = RooflineParams(**roofline_preset("hand-picked"))
            panels = {"hand-picked": compare(args.profile, args.gpu, args.model, hand), **panels}
        plot(panels, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
