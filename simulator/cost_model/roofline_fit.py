"""The roofline's efficiencies fitted to measured operator profiles, by least squares.

    python -m kvsim.simulator.cost_model.roofline_fit            # fit on every real shipped profile

The roofline (``simulator.cost_model.roofline``) has four free constants that a profile's
grid can pin down: the share of peak FLOP/s the GEMMs reach (``compute_efficiency``), the
share of peak bandwidth streaming kernels reach (``memory_efficiency``), a fixed per-step
cost (``step_overhead_s``) and the paged decode-attention factor at the profile's block
size (decode attention reads ``factor x`` the KV bytes' time; it is separable from the
memory efficiency because weights are read at ``1 / memory_efficiency`` and the KV at
``factor / memory_efficiency``, and decode steps vary the KV at fixed weights).

The fit minimises ``sum(w_i * (roofline_i / measured_i - 1)^2)`` over every measured
attention point of every profile (``grid_shapes``: decode batches, prefill
chunks over a cached prefix, mixed steps), the measured step being the profile's operators
summed (``ProfiledCostModel`` at a grid point). Relative error, so that a 10 ms prefill and
a 50 us decode weigh alike; ``w_i = 1 / (n_kind x kinds x profiles)`` for each profile and
kind of step (decode, prefill, mixed), so the 8,448 mixed points of the RTX 4090 grid do not
drown its 99 decode and 96 prefill ones, and each profile weighs the same. No end-to-end
latency enters.

Method: Levenberg-Marquardt on the four parameters, or three with the paged factor held
(numerical Jacobian of the real ``RooflineCostModel``, not a copy of its formulas), from the
given start (``main``: the ``hand-picked`` preset), efficiencies kept in ``(0, 1]`` and the
overhead and factor at or above 0: a parameter at its bound that the descent pushes past is
held there for the iteration (clipping its step instead let the fit stall short of the bounded
minimum, at a point that moved with the last bits of numpy's linear algebra). Deterministic. ``main`` prints the three-parameter fit to each
profile alone and to all at once (the presets) and, as a check, the four-parameter one.

Results (``ROOFLINE_PRESETS``; the README has the error tables): RTX 4090 / Llama-3.1-8B
alone 0.894 / 0.993 / 2.96 ms (``measured-rtx4090``); Vidur's A100 / Llama-3-8B alone
0.511 / 0.831 / 2.20 ms (``measured-a100``); both at once 0.759 / 1.000 (at its bound) /
3.78 ms (``measured-rtx4090-a100``); the RTX PRO 6000 Blackwell profiles (three models, TP 1
and 2, one case per degree: ``FitCase.tensor_parallel``, both sides adding the all-reduces over
the GPU's link) alone 0.583 / 0.756 / 1.03 ms (``measured-rtx-pro-6000``); all three GPUs at
once, each GPU weighing the same, 0.723 / 0.893 / 2.60 ms (``measured-rtx4090-a100-rtx-pro-6000``,
the constants of every GPU without a profile). Like with like: a profile without an LM head
(Vidur's) is compared with the roofline without it (``FitCase.lm_head``,
``RooflineParams.lm_head``); against the whole roofline the A100 fit was 0.506 / 0.830 /
1.57 ms, the missing head's 0.6 ms hidden in its overhead. A joint fit is worse than each
GPU's own (one set of efficiencies cannot be right on every GPU), so each GPU with a profile
uses its own fit by default and every other GPU the joint one (``roofline.GPU_FITS``). How
well the joint fit predicts a GPU it has not seen is measured by leaving each GPU out
(``held_out_fits``: fitted on the other GPUs, judged on the one left out); ``main`` prints
that table too. The A100
profile's KV-cache write kernel is slow (0.55 ms a layer for a 1,024-token chunk), which
the roofline does not model (the A100 fit absorbs it into a low compute efficiency).

The block-size slope of the paged factor (``paged_overhead_per_block``) is not fitted: a
profile measured at one block size cannot separate it from the base (it is kept, and the
base set so that the factor at the profile's block size is the fitted one).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np

from kvsim.simulator.cost_model.base import BatchShape, Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.operator_profile import PROFILES_DIR, is_operator_profile
from kvsim.simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    load_profile,
)
from kvsim.simulator.cost_model.roofline import (
    GPU_FITS,
    ROOFLINE_PRESETS,
    RooflineCostModel,
    RooflineParams,
    paged_kernel_factor,
)

KINDS = ("decode", "prefill", "mixed")

#: every shipped operator profile measured on a real GPU -> (catalogue GPU, catalogue model).
#: A test checks that each shipped operator profile is listed here or marked synthetic, so a
#: newly imported profile joins the fit (or fails the test) instead of being silently skipped.
REAL_PROFILES: dict[str, tuple[str, str]] = {
    "rtx4090-llama-3.1-8b": ("rtx4090", "llama-3.1-8b"),
    # Vidur's A100 profile (its "a100" device is the 80 GB part; Meta-Llama-3-8B, fp16)
    "a100-llama-3-8b": ("a100-80gb", "llama-3-8b"),
    # LLMServingSim's RTX PRO 6000 Blackwell profiles (vLLM 0.19, bf16, TP 1 and 2): two dense
    # models and one mixture-of-experts (its MoE block from moe.csv)
    "rtx-pro-6000-llama-3.1-8b": ("rtx-pro-6000", "llama-3.1-8b"),
    "rtx-pro-6000-qwen3-32b": ("rtx-pro-6000", "qwen3-32b"),
    "rtx-pro-6000-qwen3-30b-a3b-instruct-2507": ("rtx-pro-6000", "qwen3-30b-a3b-instruct-2507"),
}


@dataclass(frozen=True)
class FitCase:
    """One profile's grid at one tensor-parallel degree: steps, their measured times (s) and
    the hardware they ran on."""

    name: str
    gpu: str
    model: str
    block_size: int
    kinds: tuple[str, ...]
    shapes: tuple[BatchShape, ...]
    measured_s: tuple[float, ...]
    lm_head: bool = True  # the profile times the LM head; if not, the roofline leaves it out too
    tensor_parallel: int = 1  # the tables' degree; both sides add its all-reduces over the GPU's link

    @property
    def label(self) -> str:
        return self.name if self.tensor_parallel == 1 else f"{self.name} tp{self.tensor_parallel}"


@dataclass(frozen=True)
class FitResult:
    params: RooflineParams
    paged_factor: float  # decode-attention factor at the profile's block size (fitted)
    block_size: int
    objective: float  # weighted sum of squared relative errors
    iterations: int


def grid_shapes(profiled: ProfiledCostModel) -> list[tuple[str, BatchShape]]:
    """One step per measured attention point (one prefill sequence; ``n`` decodes of equal
    context), of the tables measured at the cost model's tensor-parallel degree."""
    out = []
    for pc, kp, nd, kd, _ in profiled.profile.tp[profiled.tp].attention.points():
        kind = "decode" if pc == 0 else "prefill" if nd == 0 else "mixed"
        out.append((kind, BatchShape(prefill_seqs=int(pc > 0), prefill_tokens=pc,
                                     prefill_attn_pairs=causal_attention_pairs(pc, kp) if pc else 0.0,
                                     decode_seqs=nd, decode_context=nd * kd)))
    return out


def case_from_profile(name: str, gpu: str, model: str, tensor_parallel: int = 1) -> FitCase:
    """The grid of a shipped (or path-named) operator profile at ``tensor_parallel`` (its
    tables of that degree), timed by its operators."""
    prof = load_profile(name)
    profiled = ProfiledCostModel(prof, Deployment(MODELS[model], GPUS[gpu], tensor_parallel))
    pairs = grid_shapes(profiled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        measured = tuple(profiled.step_time(s) for _, s in pairs)
    return FitCase(prof.name, gpu, model, profiled.block_size, tuple(k for k, _ in pairs),
                   tuple(s for _, s in pairs), measured, prof.times_lm_head, tensor_parallel)


def real_profile_cases() -> list[FitCase]:
    """Every shipped operator profile measured on a GPU (``REAL_PROFILES``), one case per
    tensor-parallel degree it measured."""
    shipped = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if is_operator_profile(p))
    return [case_from_profile(n, *REAL_PROFILES[n], tp)
            for n in shipped if n in REAL_PROFILES for tp in sorted(load_profile(n).tp)]


def with_factor(params: RooflineParams, factor: float, block_size: int) -> RooflineParams:
    """``params`` with the paged base set so the factor at ``block_size`` is ``factor``."""
    return replace(params, paged_overhead_base=factor - 1.0 - params.paged_overhead_per_block / block_size)


def predict(case: FitCase, params: RooflineParams) -> np.ndarray:
    """The roofline's step times (s) on the case's grid (without the LM head where the profile
    has none: like with like)."""
    params = replace(params, lm_head=params.lm_head and case.lm_head)
    roofline = RooflineCostModel(MODELS[case.model], GPUS[case.gpu], case.tensor_parallel,
                                 block_size=case.block_size, params=params)
    return np.array([roofline.step_time(s) for s in case.shapes])


def relative_errors(case: FitCase, params: RooflineParams) -> np.ndarray:
    """``roofline / measured - 1`` at every grid point."""
    return predict(case, params) / np.array(case.measured_s) - 1.0


def _weights(case: FitCase, cases: list[FitCase]) -> np.ndarray:
    """Each GPU weighs the same, each case of a GPU (a model, a TP degree) the same within
    it, and each kind of step the same within a case."""
    counts = {k: case.kinds.count(k) for k in set(case.kinds)}
    gpus = {c.gpu for c in cases}
    share = 1.0 / (len(gpus) * sum(c.gpu == case.gpu for c in cases))
    return np.array([share / (counts[k] * len(counts)) for k in case.kinds])


def fit_roofline(cases: list[FitCase], start: RooflineParams | None = None, *, fit_paged_factor: bool = True,
                 max_iterations: int = 100) -> FitResult:
    """Least-squares fit of (compute efficiency, memory efficiency, step overhead, paged
    factor) to the cases' grids in relative error (see the module docstring). With
    ``fit_paged_factor=False`` the factor stays ``start``'s (three parameters)."""
    if not cases:
        raise ValueError("roofline fit: no measured profiles to fit")
    blocks = {c.block_size for c in cases}
    if len(blocks) != 1:
        raise ValueError(f"roofline fit: profiles measured at block sizes {sorted(blocks)}; one at a time")
    block = blocks.pop()
    base = start or RooflineParams()
    sqrt_w = np.sqrt(np.concatenate([_weights(c, cases) for c in cases]))
    lower = np.array([1e-3, 1e-3, 0.0, 0.0])
    upper = np.array([1.0, 1.0, math.inf, math.inf])

    def params_of(x: np.ndarray) -> RooflineParams:
        p = replace(base, compute_efficiency=float(x[0]), memory_efficiency=float(x[1]),
                    step_overhead_s=float(x[2]) * 1e-3)
        return with_factor(p, float(x[3]), block)

    def residuals(x: np.ndarray) -> np.ndarray:
        return sqrt_w * np.concatenate([relative_errors(c, params_of(x)) for c in cases])

    # x: efficiencies, overhead in ms (all of order 1, so one damping scale fits all)
    x = np.array([base.compute_efficiency, base.memory_efficiency, base.step_overhead_s * 1e3,
                  paged_kernel_factor(block, base)])
    free = [0, 1, 2, 3] if fit_paged_factor else [0, 1, 2]
    r = residuals(x)
    cost, damping, it = float(r @ r), 1e-3, 0
    for it in range(1, max_iterations + 1):  # noqa: B007 (reported)
        jac = np.empty((len(r), len(free)))
        for col, j in enumerate(free):
            h = 1e-6 * max(1.0, abs(x[j]))
            step = x.copy()
            step[j] = step[j] + h if step[j] + h <= upper[j] else step[j] - h
            jac[:, col] = (residuals(step) - r) / (step[j] - x[j])
        jtj, jtr = jac.T @ jac, jac.T @ r
        # a parameter held at a bound that the descent pushes past stays there this iteration
        # (clipping its step instead can stall the fit short of the bounded minimum)
        move = [col for col, j in enumerate(free)
                if not ((x[j] >= upper[j] and jtr[col] < 0) or (x[j] <= lower[j] and jtr[col] > 0))]
        if not move:  # every parameter held at a bound: a constrained minimum
            break
        jtj, jtr = jtj[np.ix_(move, move)], jtr[move]
        improved = False
        while damping < 1e12:
            delta = np.zeros(len(x))
            delta[[free[col] for col in move]] = np.linalg.solve(
                jtj + damping * np.diag(np.diag(jtj) + 1e-12), -jtr)
            trial = np.clip(x + delta, lower, upper)
            rt = residuals(trial)
            ct = float(rt @ rt)
            if ct < cost:
                improved = True
                shrink = (cost - ct) / cost
                x, r, cost, damping = trial, rt, ct, max(damping / 10, 1e-12)
                break
            damping *= 10
        if not improved or shrink < 1e-12:
            break
    return FitResult(params_of(x), float(x[3]), block, cost, it)


@dataclass(frozen=True)
class ErrorRow:
    kind: str
    n: int
    median: float  # of |error|
    p90: float
    p95: float
    max: float
    signed_median: float


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by nearest rank on the sorted values (no interpolation)."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def error_rows(case: FitCase, params: RooflineParams) -> list[ErrorRow]:
    """Distribution of ``|roofline / measured - 1|`` per kind of step, and over all."""
    err = relative_errors(case, params)
    rows = []
    for kind in (*KINDS, "all"):
        e = [float(x) for x, k in zip(err, case.kinds) if kind in ("all", k)]
        if e:
            a = [abs(x) for x in e]
            rows.append(ErrorRow(kind, len(e), statistics.median(a), quantile(a, 0.9), quantile(a, 0.95),
                                 max(a), statistics.median(e)))
    return rows


def markdown_table(case: FitCase, before: RooflineParams, after: RooflineParams) -> str:
    """Before/after |relative error| table (README format)."""
    lines = ["| steps | n | median before | after | p90 before | after | p95 before | after "
             "| max before | after |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b, a in zip(error_rows(case, before), error_rows(case, after)):
        lines.append(f"| {b.kind} | {b.n} | {b.median:.1%} | {a.median:.1%} | {b.p90:.1%} | {a.p90:.1%} "
                     f"| {b.p95:.1%} | {a.p95:.1%} | {b.max:.1%} | {a.max:.1%} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class HeldOut:
    """The roofline fitted without one GPU's profiles, judged on them (leave one GPU out):
    how a GPU that no profile measured would be predicted."""

    gpu: str
    fitted_on: tuple[str, ...]  # the labels of the other GPUs' cases
    params: RooflineParams
    cases: tuple[FitCase, ...]  # the held-out GPU's cases


def held_out_fits(cases: list[FitCase], start: RooflineParams) -> list[HeldOut]:
    """For each GPU among ``cases`` (in name order), the three-parameter fit to the other
    GPUs' cases; empty with fewer than two GPUs."""
    gpus = sorted({c.gpu for c in cases})
    if len(gpus) < 2:
        return []
    out = []
    for gpu in gpus:
        train = [c for c in cases if c.gpu != gpu]
        params = fit_roofline(train, start, fit_paged_factor=False).params
        out.append(HeldOut(gpu, tuple(c.label for c in train), params,
                           tuple(c for c in cases if c.gpu == gpu)))
    return out


def held_out_table(held: list[HeldOut], own: dict[str, RooflineParams]) -> str:
    """README format: per held-out case and kind of step, the median |roofline / measured - 1|
    fitted without its GPU, then with only its GPU (``own``: GPU -> params)."""
    lines = ["| GPU left out | case | decode | prefill | mixed | all steps |", "|---|---|---:|---:|---:|---:|"]
    for h in held:
        for case in h.cases:
            out = {r.kind: r for r in error_rows(case, h.params)}
            mine = {r.kind: r for r in error_rows(case, own[h.gpu])}
            cells = [f"{out[k].median:.1%} / {mine[k].median:.1%}" if k in out else "-"
                     for k in (*KINDS, "all")]
            lines.append(f"| {h.gpu} | {case.label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvsim.simulator.cost_model.roofline_fit",
                                description=__doc__.split("\n")[0])
    p.parse_args(argv)
    cases = real_profile_cases()
    before = RooflineParams(**ROOFLINE_PRESETS["hand-picked"])

    def show(label: str, fitted: list[FitCase]) -> RooflineParams:
        result = fit_roofline(fitted, before, fit_paged_factor=False)  # the presets, rounded
        free = fit_roofline(fitted, before)  # is the paged factor worth changing?
        q = result.params
        print(f"{label}: fitted on {', '.join(c.label for c in fitted)} ({sum(len(c.shapes) for c in fitted)} "
              f"steps, {result.iterations} iterations, objective {result.objective:.5g})")
        print(f"  compute_efficiency {q.compute_efficiency:.4f}, memory_efficiency {q.memory_efficiency:.4f}, "
              f"step_overhead_s {q.step_overhead_s:.4e} (paged factor at block {result.block_size} kept at "
              f"{result.paged_factor:.4f}; fitted free {free.paged_factor:.4f}, objective {free.objective:.5g})")
        return q

    gpus = sorted({c.gpu for c in cases})
    own = {g: show(g, [c for c in cases if c.gpu == g]) for g in gpus}
    joint = show("all profiles", cases) if len(gpus) > 1 else None
    for c in cases:
        print(f"\n{c.label}: |roofline / measured - 1|, hand-picked (before) -> its GPU's fit (after)")
        print(markdown_table(c, before, own[c.gpu]))
        if joint is not None:
            print(f"\n{c.label}: hand-picked (before) -> the fit to all profiles (after)")
            print(markdown_table(c, before, joint))
    held = held_out_fits(cases, before)
    if held:
        print("\nLeave one GPU out: median |roofline / measured - 1| fitted without the GPU / with only it")
        for h in held:
            q = h.params
            print(f"  without {h.gpu}: compute_efficiency {q.compute_efficiency:.4f}, memory_efficiency "
                  f"{q.memory_efficiency:.4f}, step_overhead_s {q.step_overhead_s:.4e}")
        shipped = {g: RooflineParams(**ROOFLINE_PRESETS[GPU_FITS[g]]) if g in GPU_FITS else own[g] for g in gpus}
        print(held_out_table(held, shipped))  # "own": the GPU's default (the rounded preset)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
