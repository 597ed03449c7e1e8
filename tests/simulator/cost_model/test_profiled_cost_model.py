"""Profiled cost model on the shipped RTX 4090 / Llama-3.1-8B operator profile.

Expected values are read from the profile's raw YAML (microseconds, as measured) and
assembled here by hand, not through the model's helpers.
"""

import bisect
import dataclasses
import itertools
import math
import random
import statistics
import warnings
from collections import defaultdict

import numpy as np
import pytest
import yaml
from run_configs import sharegpt_config

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.config import ConfigError, validate_config
from kvsim.simulator.cost_model import GPUS, MODELS, BatchShape
from kvsim.simulator.cost_model.base import Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.operator_profile import (
    PROFILES_DIR,
    AttentionGrid,
    OperatorProfileError,
)
from kvsim.simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    bracket,
    chunk_tile,
    chunk_weight,
    held_out_chunk_errors,
    lerp,
    load_profile,
)
from kvsim.simulator.engine.memory_classes import CLASSES
from kvsim.simulator.engine.metrics import summarize
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.traces import Request

NAME = "rtx4090-llama-3.1-8b"
RAW = yaml.safe_load((PROFILES_DIR / f"{NAME}.yaml").read_text())["tp"][1]
LAYERS = 32  # Llama-3.1-8B decoder layers
PER_LAYER = {"layernorm": 2, "qkv_proj": 1, "rotary_emb": 1, "o_proj": 1, "gate_up_proj": 1,
             "act_fn": 1, "down_proj": 1}
PER_STEP = ("embedding", "final_layernorm")


def us(table, key, x):
    """Seconds of ``table[key]`` at x (tokens or sequences), linear between measured points."""
    t = RAW[table][key]
    axis = "tokens" if table == "dense" else "sequences"
    return float(np.interp(x, t[axis], t["time_us"])) * 1e-6


def attention_us(pc, kp, nd, kd):
    a = RAW["attention"]
    i, j = a["prefill_chunk"].index(pc), a["kv_prefill"].index(kp)
    k, m = a["n_decode"].index(nd), a["kv_decode"].index(kd)
    nj, nk, nm = len(a["kv_prefill"]), len(a["n_decode"]), len(a["kv_decode"])
    return a["time_us"][((i * nj + j) * nk + k) * nm + m] * 1e-6


def by_hand(tokens, seqs, attention_s):
    dense = sum(LAYERS * c * us("dense", op, tokens) for op, c in PER_LAYER.items())
    dense += sum(us("dense", op, tokens) for op in PER_STEP)
    per_seq = us("per_sequence", "lm_head", seqs) + us("per_sequence", "sampler", seqs)
    return dense + per_seq + LAYERS * attention_s


@pytest.fixture(scope="module")
def profile():
    return load_profile(NAME)


def model(profile, tp=1, gpu="rtx4090", **kw):
    return ProfiledCostModel(profile, Deployment(MODELS["llama-3.1-8b"], GPUS[gpu], tp), **kw)


# --- grid points: decode-only, prefill-only, mixed ------------------------------------------
@pytest.mark.parametrize("n,kd", [(1, 16), (8, 1024), (32, 512), (256, 16384)])
def test_decode_step_at_a_grid_point(profile, n, kd):
    got = model(profile).step_time(BatchShape(decode_seqs=n, decode_context=n * kd))
    assert got == pytest.approx(by_hand(n, n, attention_us(0, 0, n, kd)), rel=1e-12)


@pytest.mark.parametrize("pc,kp", [(16, 0), (512, 0), (2048, 0), (256, 4096)])
def test_prefill_step_over_a_cached_prefix(profile, pc, kp):
    shape = BatchShape(prefill_seqs=1, prefill_tokens=pc, prefill_attn_pairs=causal_attention_pairs(pc, kp))
    assert model(profile).step_time(shape) == pytest.approx(by_hand(pc, 1, attention_us(pc, kp, 0, 0)), rel=1e-12)


@pytest.mark.parametrize("pc,kp,nd,kd", [(512, 1024, 32, 2048), (16, 0, 1, 16), (1024, 0, 64, 512)])
def test_mixed_step_chunk_and_decodes(profile, pc, kp, nd, kd):
    shape = BatchShape(prefill_seqs=1, prefill_tokens=pc, prefill_attn_pairs=causal_attention_pairs(pc, kp),
                       decode_seqs=nd, decode_context=nd * kd)
    expected = by_hand(pc + nd, 1 + nd, attention_us(pc, kp, nd, kd))
    assert model(profile).step_time(shape) == pytest.approx(expected, rel=1e-12)


def test_between_grid_points_is_linear(profile):
    # Halfway between contexts 1024 and 2048 at 8 sequences: the mean of the two attentions.
    m = model(profile)
    got = m.step_time(BatchShape(decode_seqs=8, decode_context=8 * 1536))
    mid = (attention_us(0, 0, 8, 1024) + attention_us(0, 0, 8, 2048)) / 2
    assert got == pytest.approx(by_hand(8, 8, mid), rel=1e-12)
    # 24 decoding sequences (between 16 and 32): attention and the dense tables both interpolate
    t16, t32 = attention_us(0, 0, 16, 512), attention_us(0, 0, 32, 512)
    got = m.attention_time(BatchShape(decode_seqs=24, decode_context=24 * 512))
    assert got == pytest.approx(LAYERS * (t16 + t32) / 2, rel=1e-12)


def test_several_prefills_pay_one_launch(profile):
    m = model(profile)
    one = BatchShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=causal_attention_pairs(512))
    four = BatchShape(prefill_seqs=4, prefill_tokens=2048, prefill_attn_pairs=4 * causal_attention_pairs(512))
    launch = min(attention_us(pc, kp, 0, 0) for pc in RAW["attention"]["prefill_chunk"] if pc
                 for kp in RAW["attention"]["kv_prefill"])
    a = attention_us(512, 0, 0, 0)
    assert m.attention_time(four) == pytest.approx(LAYERS * (a + 3 * (a - launch)), rel=1e-12)
    assert m.attention_time(one) < m.attention_time(four) < 4 * m.attention_time(one)


# --- held-out grid points ------------------------------------------------------------------
def _leave_one_out(points):
    """Interpolate each interior point from the others (the model's own ``lerp``)."""
    out = []
    for i in range(1, len(points) - 1):
        rest = points[:i] + points[i + 1:]
        x, y = points[i]
        out.append((x, y, lerp([p[0] for p in rest], [p[1] for p in rest], x)[0]))
    return out


def _quantiles(errors):
    errors = sorted(errors)
    return statistics.median(errors), errors[int(0.95 * (len(errors) - 1))]


def without(profile, axis, value):
    """``profile`` with every attention point measured at one value of one axis left out."""
    g = profile.tp[1].attention
    axes = [g.prefill_chunk, g.kv_prefill, g.n_decode, g.kv_decode]
    keep = [i for i, v in enumerate(axes[axis]) if v != value]
    ranges = [keep if a == axis else range(len(values)) for a, values in enumerate(axes)]
    axes[axis] = tuple(axes[axis][i] for i in keep)
    grid = AttentionGrid(*axes, tuple(g.at(*ix) for ix in itertools.product(*ranges)))
    return dataclasses.replace(profile, tp={1: dataclasses.replace(profile.tp[1], attention=grid)})


def grid_shape(pc, kp, nd, kd):
    return BatchShape(prefill_seqs=int(pc > 0), prefill_tokens=pc,
                      prefill_attn_pairs=causal_attention_pairs(pc, kp) if pc else 0.0,
                      decode_seqs=nd, decode_context=nd * kd)


def held_out_values(values, axis):
    """The values of one attention axis that are left out in turn: the interior ones, less
    the smallest positive chunk, decode count and context (0 chunks / 0 decodes mean "none",
    and below the smallest measured value the model clamps instead of interpolating)."""
    return [v for v in values[1:-1] if not (axis != 1 and v == min(x for x in values if x > 0))]


def held_out_points(points, axis, value):
    """The measured points at ``value`` of ``axis`` that a model without them is asked for
    (not the cached prefix of decode-only points, nor the context of prefill-only ones)."""
    return [pt for pt in points if pt[axis] == value and not (axis == 1 and pt[0] == 0)
            and not (axis == 3 and pt[2] == 0)]


def line_ends(points, axis):
    """The largest measured value of ``axis`` on each line along it (keyed by the other three
    coordinates). A held-out point at its line's end is extrapolated, not interpolated, by a
    model without it: mixed steps were timed up to 128 decodes only, so without the 128
    slice a mixed step at 128 decodes is extrapolated from 32 and 64."""
    ends = {}
    for pt in points:
        rest = pt[:axis] + pt[axis + 1:4]
        ends[rest] = max(ends.get(rest, 0), pt[axis])
    return ends


def held_out_errors(profile, tile=None, max_kv_tokens=math.inf, interpolated_only=False):
    """Relative errors of held-out grid points, per table: the table's own time, and the
    step time of a step at that point (what the simulator uses).

    Dense and per-sequence tables: each interior point interpolated from the others.
    Attention: each interior value of each axis left out of the profile (all points measured
    at it), and the model built on the rest times the steps at those points, with the chunk
    axis's tile ``tile`` (None: re-chosen on each reduced grid). Only attention points whose
    KV (cached prefix + chunk + decodes x context, tokens) is at most ``max_kv_tokens``, and
    with ``interpolated_only`` only those the reduced model interpolates (``line_ends``).
    """
    warnings.simplefilter("ignore", ProfileExtrapolationWarning)  # callers catch_warnings
    m = model(profile)
    table, step = defaultdict(list), defaultdict(list)
    tp1 = profile.tp[1]
    for t in tp1.dense.values():
        table["dense"] += [abs(p / y - 1) for _, y, p in _leave_one_out(list(zip(t.x, t.seconds)))]
    for x, y, p in _leave_one_out(list(zip(*m._dense))):  # all dense operators of a step, summed
        shape = BatchShape(prefill_seqs=1, prefill_tokens=x, prefill_attn_pairs=causal_attention_pairs(x))
        step["dense"].append(abs(p - y) / m.step_time(shape))
    for t in tp1.per_sequence.values():
        table["per_sequence"] += [abs(p / y - 1) for _, y, p in _leave_one_out(list(zip(t.x, t.seconds)))]
    for x, y, p in _leave_one_out(list(zip(*m._per_seq))):
        step["per_sequence"].append(abs(p - y) / m.step_time(BatchShape(decode_seqs=x, decode_context=512 * x)))
    g = tp1.attention
    points = g.points()
    axes = [g.prefill_chunk, g.kv_prefill, g.n_decode, g.kv_decode]
    for axis, values in enumerate(axes):
        ends = line_ends(points, axis)
        for value in held_out_values(values, axis):
            held = model(without(profile, axis, value), chunk_tile=tile)
            for pc, kp, nd, kd, t in held_out_points(points, axis, value):
                if pc + kp + nd * kd > max_kv_tokens:
                    continue
                if interpolated_only and value == ends[(pc, kp, nd, kd)[:axis] + (pc, kp, nd, kd)[axis + 1:]]:
                    continue
                kind = "decode" if pc == 0 else "prefill" if nd == 0 else "mixed"
                shape = grid_shape(pc, kp, nd, kd)
                table[f"attention {kind}"].append(abs(held.attention_time(shape) / (LAYERS * t) - 1))
                step[f"attention {kind}"].append(abs(held.step_time(shape) / m.step_time(shape) - 1))
    return {k: _quantiles(v) for k, v in table.items()}, {k: _quantiles(v) for k, v in step.items()}


#: The most KV tokens an RTX 4090 could hold for Llama-3.1-8B with no weights at all (24 GiB /
#: 128 KiB per token = 196,608): grid points above it cannot occur in a simulation of this GPU.
RTX4090_KV_TOKENS = GPUS["rtx4090"].memory_bytes // MODELS["llama-3.1-8b"].kv_bytes_per_token


@pytest.fixture(scope="module")
def held_out(profile):
    with warnings.catch_warnings():
        return held_out_errors(profile, chunk_tile(profile.tp[1].attention), RTX4090_KV_TOKENS)


def test_held_out_grid_points_are_reproduced(held_out):
    """The profiled model's target on the profile's own grid, held out (a doubling grid: 4x gaps,
    harsher than the 2x gaps of real lookups): within 5% median and 15% p95 for every table's
    own times and for the step times the simulator uses, over the grid points whose KV fits
    the GPU's memory (``RTX4090_KV_TOKENS``; all of the decode- and prefill-only points but
    20 of 158 decode ones, 24,624 of 27,680 mixed ones).

    Measured: attention median 2.1% (decode), 0.8% (prefill), 0.6% (mixed); p95 14.1%, 11.7%,
    12.5%; dense 0.6% / 8.4%, per-sequence 0.5% / 3.7%; step times median <= 0.3%, p95 <= 5.5%.
    Over the whole grid mixed attention's p95 is 17.6% (``test_held_out_over_the_whole_grid``).

    The chunk axis's tile is the one chosen on the whole profile (256 rows), left-out points
    included: with the 256-token chunks left out, the rest cannot tell 256 from 512 (held-out
    p95 11.0% vs 10.8%) and re-choosing it there gives prefill attention a p95 of 32%.
    """
    table, step = held_out
    assert set(step) == set(table) == {"dense", "per_sequence", "attention decode", "attention prefill",
                                       "attention mixed"}
    for name, (median, p95) in step.items():
        assert median <= 0.05 and p95 <= 0.15, ("step", name, median, p95)
    for name, (median, p95) in table.items():
        assert median <= 0.05 and p95 <= 0.15, (name, median, p95)
    assert table["attention prefill"][1] <= 0.12 and step["attention mixed"][1] <= 0.08


@pytest.fixture(scope="module")
def held_out_whole(profile):
    """Held-out errors over the whole grid: every point, then only the interpolated ones."""
    tile = chunk_tile(profile.tp[1].attention)
    with warnings.catch_warnings():
        return held_out_errors(profile, tile), held_out_errors(profile, tile, interpolated_only=True)


def test_held_out_over_the_whole_grid(held_out_whole):
    """The profiled model's target over the whole grid, KV the GPU could not hold included: met by the
    dense, per-sequence, decode and prefill tables and by every step time, not by mixed
    attention's own times (median 0.7%, p95 17.6%; 15.2% without the 1,056 points a held-out
    model extrapolates to). Mixed steps switch kernel regime between grid points: at 2K+
    tokens of context 128 decoding sequences beside a chunk cost a median 3.6x what 64 do
    (up to 3.9x), and beside a 16-token chunk 1 and 2 decodes cost the same at short
    contexts, 1 to 4 at long ones; a doubling grid with a slice left out (4x gaps) sees
    neither switch. The schemes tried instead of linear do worse
    (``test_interpolation_schemes_on_the_whole_grid``).
    """
    (table, step), (table_in, _) = held_out_whole
    for name, (median, p95) in step.items():
        assert median <= 0.05 and p95 <= 0.15, ("step", name, median, p95)
    for name, (median, p95) in table.items():
        if name != "attention mixed":
            assert median <= 0.05 and p95 <= 0.15, (name, median, p95)
    median, p95 = table["attention mixed"]
    assert median <= 0.01 and 0.15 < p95 <= 0.18  # the miss, stated in profiled.py and the README
    assert table_in["attention mixed"][1] <= 0.155 and table_in["attention decode"] == table["attention decode"]
    assert step["attention mixed"][1] <= 0.075  # what the simulator uses: attention plus the rest


# --- interpolation schemes compared on the whole grid ------------------------------------------
def _grid_lines(points):
    """Per axis, each measured line along it: the other three coordinates -> [(value, s)]."""
    lines = [defaultdict(list) for _ in range(4)]
    for *key, t in sorted(points):
        for axis in range(4):
            lines[axis][tuple(key[:axis] + key[axis + 1:])].append((key[axis], t))
    return lines


def _monotone_cubic(xs, ys, x):
    """Fritsch-Carlson monotone cubic through the points (linear outside them)."""
    if not xs[0] < x < xs[-1] or len(xs) < 3:
        return lerp(xs, ys, x)[0]
    h = [b - a for a, b in zip(xs, xs[1:])]
    d = [(y1 - y0) / dx for y0, y1, dx in zip(ys, ys[1:], h)]
    m = [d[0]] + [0.0 if d[i - 1] * d[i] <= 0 else
                  (3 * h[i - 1] + 3 * h[i]) / ((2 * h[i] + h[i - 1]) / d[i - 1] + (h[i] + 2 * h[i - 1]) / d[i])
                  for i in range(1, len(xs) - 1)] + [d[-1]]
    i = bisect.bisect_right(xs, x) - 1
    u = (x - xs[i]) / h[i]
    return ((2 * u**3 - 3 * u**2 + 1) * ys[i] + (u**3 - 2 * u**2 + u) * h[i] * m[i]
            + (3 * u**2 - 2 * u**3) * ys[i + 1] + (u**3 - u**2) * h[i] * m[i + 1])


def _in_coordinate(xs, ys, x, coord, log_time=False):
    """Linear in ``coord(x)`` (and in log time): between the bracketing points only; beyond
    the last point the model's own secant rule."""
    i0, i1, w, side = bracket(xs, x)
    if side or not w:
        return lerp(xs, ys, x)[0]
    w = (coord(x) - coord(xs[i0])) / (coord(xs[i1]) - coord(xs[i0]))
    if log_time:
        return math.exp(math.log(ys[i0]) + w * (math.log(ys[i1]) - math.log(ys[i0])))
    return ys[i0] + w * (ys[i1] - ys[i0])


def scheme_errors(points, tile, along=None):
    """Held-out errors (``held_out_errors``'s points, attention tables, whole grid) of one-axis
    interpolation schemes, without building models: each left-out point from its own line.
    ``along``: ``(axis, predict(key, xs, ys, lines))`` replacing the model's rule on that axis
    (linear in the value; in the kernel's work on the chunk axis)."""
    lines = _grid_lines(points)
    errors = defaultdict(list)
    axes = [sorted({pt[a] for pt in points}) for a in range(4)]
    for axis, values in enumerate(axes):
        for value in held_out_values(values, axis):
            for *key, t in held_out_points(points, axis, value):
                line = [(x, y) for x, y in lines[axis][tuple(key[:axis] + key[axis + 1:])]
                        if x != value and (x > 0 or axis == 1)]
                xs, ys = [x for x, _ in line], [y for _, y in line]
                if along is not None and along[0] == axis:
                    got = along[1](key, xs, ys, lines)
                elif axis == 0:
                    i0, i1, w, side = bracket(xs, value)
                    if w and not side:
                        w = chunk_weight(xs[i0], xs[i1], value, key[1], key[2], tile)
                    got = ys[i0] + w * (ys[i1] - ys[i0])
                else:
                    got = lerp(xs, ys, value)[0]
                kind = "decode" if key[0] == 0 else "prefill" if key[2] == 0 else "mixed"
                errors[kind].append(abs(got / t - 1))
    return {k: _quantiles(v) for k, v in errors.items()}


def _constant_kv_along_decodes(key, xs, ys, lines):
    """Between decode counts at the same KV read (decodes x context): the neighbours' times
    at context x n / n_i (each linear along its context line)."""
    pc, kp, n, kd = key
    i0, i1, w, side = bracket(xs, n)
    if side or not w:
        return lerp(xs, ys, n)[0]
    at = []
    for ni in (xs[i0], xs[i1]):
        kds = [(x, y) for x, y in lines[3][(pc, kp, ni)] if x > 0]
        at.append(lerp([x for x, _ in kds], [y for _, y in kds], kd * n / ni)[0])
    return at[0] + w * (at[1] - at[0])


def _time_per_kv_along_context(key, xs, ys, lines):
    """Time per token of KV read (decodes x context + the chunk's query-key pairs) linear in
    log context."""
    pc, kp, n, kd = key

    def kv(x):
        return n * x + pc * (kp + pc / 2)
    return kv(kd) * _in_coordinate(xs, [y / kv(x) for x, y in zip(xs, ys)], kd, math.log)


SCHEMES = {  # along which axis, how (the interpolation chosen by held-out error)
    "decodes: log-x": (2, lambda k, xs, ys, _: _in_coordinate(xs, ys, k[2], math.log)),
    "decodes: log-log": (2, lambda k, xs, ys, _: _in_coordinate(xs, ys, k[2], math.log, True)),
    "decodes: monotone cubic": (2, lambda k, xs, ys, _: _monotone_cubic(xs, ys, k[2])),
    "decodes: at constant KV read": (2, _constant_kv_along_decodes),
    "context: log-log": (3, lambda k, xs, ys, _: _in_coordinate(xs, ys, k[3], math.log, True)),
    "context: time per KV token, log context": (3, _time_per_kv_along_context),
}


def test_interpolation_schemes_on_the_whole_grid(profile, held_out_whole):
    """The interpolation, chosen by held-out error over the whole grid: the model's rule
    (linear, in the kernel's work along the chunk) against schemes along the decode count and
    the context, the axes where mixed attention's errors are (``test_held_out_over_the_whole_
    grid``). Each does worse on the worst table's p95 (the model: 17.6%, mixed)."""
    grid = profile.tp[1].attention
    points, tile = grid.points(), chunk_tile(grid)
    base = scheme_errors(points, tile)
    table = held_out_whole[0][0]
    for kind in ("decode", "prefill", "mixed"):  # the harness reproduces the model's numbers
        assert base[kind] == pytest.approx(table[f"attention {kind}"], rel=1e-9), kind
    worst = max(p95 for _, p95 in base.values())
    for name, along in SCHEMES.items():
        other = scheme_errors(points, tile, along)
        assert max(p95 for _, p95 in other.values()) > worst + 0.005, (name, other)


def test_chunk_interpolation_in_kernel_work_beats_tokens(profile):
    """The chunk axis's scheme, chosen by held-out error: weights in the kernel's work with
    tiles of 256 query rows against plain linear in tokens (the previous scheme)."""
    grid = profile.tp[1].attention
    assert chunk_tile(grid) == 256
    tiled, linear = sorted(held_out_chunk_errors(grid, 256)), sorted(held_out_chunk_errors(grid, math.inf))
    p95 = int(0.95 * (len(tiled) - 1))
    assert tiled[p95] < 0.11 < 0.19 < linear[p95]
    assert statistics.median(tiled) < statistics.median(linear)
    # one row past a tile pays another pass over the prefix: 257 tokens over 16K cost
    # nearly what 512 do; 255 nearly what 256 do
    m = model(profile)
    t = {c: m.attention_time(grid_shape(c, 16384, 0, 0)) / LAYERS for c in (255, 257)}
    assert t[255] == pytest.approx(attention_us(256, 16384, 0, 0), rel=0.01)
    assert t[257] == pytest.approx(attention_us(512, 16384, 0, 0), rel=0.02)


def test_linear_beats_nearest_on_held_out_attention(profile):
    # The interpolation choice, checked: nearest-point lookup does far worse on the same points.
    grid = {pt[:4]: pt[4] for pt in profile.tp[1].attention.points()}
    lin, near = [], []
    for nd in (1, 8, 64):
        line = sorted((kd, t) for (pc, kp, n, kd), t in grid.items() if pc == 0 and n == nd)
        for i in range(1, len(line) - 1):
            (x0, y0), (x, y), (x1, y1) = line[i - 1], line[i], line[i + 1]
            lin.append(abs(y0 + (y1 - y0) * (x - x0) / (x1 - x0) - y) / y)
            near.append(abs((y0 if x - x0 <= x1 - x else y1) - y) / y)
    assert statistics.median(lin) * 5 < statistics.median(near)


def test_the_tile_is_recovered_from_a_kernel_of_known_tile():
    """Synthetic prefill grids of a kernel with tiles of 64 rows: the held-out choice finds 64.
    Timed exactly as the interpolation's coordinate (passes x (prefix + chunk / 2)), held-out
    points come back exactly; with a separate compute term (pairs) still far better than
    linear in tokens."""
    chunks, prefixes = (0, 16, 32, 64, 128, 256, 512, 1024), (0, 64, 1024, 8192)

    def grid(us):
        seconds = tuple(None if pc == 0 else us(pc, kp) * 1e-6 for pc in chunks for kp in prefixes)
        return AttentionGrid(chunks, prefixes, (0,), (0,), seconds)

    exact = grid(lambda pc, kp: 10.0 + 0.03 * math.ceil(pc / 64) * (kp + pc / 2))
    assert chunk_tile(exact) == 64
    assert max(held_out_chunk_errors(exact, 64)) < 1e-12 < 0.1 < max(held_out_chunk_errors(exact, math.inf))
    both = grid(lambda pc, kp: 10.0 + 0.03 * math.ceil(pc / 64) * kp + 1e-4 * pc * (kp + pc / 2))
    assert chunk_tile(both) == 64
    assert max(held_out_chunk_errors(both, 64)) < 0.1 < max(held_out_chunk_errors(both, math.inf))


# --- outside the grid ----------------------------------------------------------------------
def test_long_prefill_is_timed_as_consecutive_chunks(profile):
    m = model(profile)
    shape = BatchShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=causal_attention_pairs(4096))
    with pytest.warns(ProfileExtrapolationWarning, match="above the measured grid"):
        got = m.attention_time(shape)
    assert got == pytest.approx(LAYERS * (attention_us(2048, 0, 0, 0) + attention_us(2048, 2048, 0, 0)), rel=1e-12)
    assert m.out_of_grid["prefill_chunk>"] >= 1
    # the dense operators extrapolate along the secant from 1024 to 2048 tokens
    d = m.dense_time(4096) - m.dense_time(2048)
    assert d == pytest.approx(2 * (m.dense_time(2048) - m.dense_time(1024)), rel=1e-12)
    assert m.out_of_grid["tokens>"] == 1


def test_below_the_grid_is_clamped_and_counted_once_per_lookup(profile):
    m = model(profile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = m.step_time(BatchShape(decode_seqs=4, decode_context=4 * 3))
        b = m.step_time(BatchShape(decode_seqs=4, decode_context=4 * 16))
        m.step_time(BatchShape(decode_seqs=4, decode_context=4 * 5))
    assert a == b  # launch-bound: 3 tokens of context cost what 16 do
    assert m.out_of_grid["kv_decode<"] == 2
    assert sum(issubclass(w.category, ProfileExtrapolationWarning) for w in caught) == 1  # warned once


# --- runs of decode steps ------------------------------------------------------------------
def test_decode_segments_reproduce_step_times(profile):
    m = model(profile)
    rng = random.Random(3)
    for _ in range(200):
        n = rng.choice([1, 3, 8, 24, 100, 256, 300])
        ctx = n * rng.randint(1, 20000) + rng.randint(0, n - 1)
        a, b, span = m.decode_segment(n, ctx)
        assert span >= 1
        for i in {0, span // 2, span - 1} if span < 10**6 else {0, 7, 500}:
            c = ctx + n * i
            assert a + b * c == pytest.approx(m.step_time(BatchShape(decode_seqs=n, decode_context=c)), rel=1e-12)
        if span < 10**6:  # the next step starts a new segment with another slope
            c = ctx + n * span
            a2, b2, _ = m.decode_segment(n, c)
            assert a2 + b2 * c == pytest.approx(m.step_time(BatchShape(decode_seqs=n, decode_context=c)), rel=1e-12)
            assert b2 != b


def trace(count, rate, seed):
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        out.append(Request(i, t, rng.randint(10, 3000), rng.randint(1, 700)))
    return out


def simulate(profile, requests, macro):
    sim = Simulation(requests, lambda: PagedAllocator(2400, 16), lambda: model(profile),
                     SchedulerSettings(max_seq_len=8192, max_num_batched_tokens=8192), macro_steps=macro)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        sim.run()
    df, steps = sim.request_rows.frame(), sim.steps.frame()
    return df, steps, summarize(df, steps, sim.replicas[0].scheduler.itl, 2400 * 16)


@pytest.mark.parametrize("seed", [1, 2])
def test_macro_steps_equal_single_steps(profile, seed):
    """Runs of decode steps cross the profile's context breaks (16, 32, ..., 16384 tokens
    per sequence) and still give the step-by-step results."""
    reqs = trace(150, 4.0, seed)
    one, steps_one, s_one = simulate(profile, reqs, macro=False)
    many, steps_many, s_many = simulate(profile, reqs, macro=True)
    assert len(steps_many) < len(steps_one) / 3  # runs were merged
    assert steps_many["iterations"].sum() == len(steps_one)
    assert (steps_one["prefill_tokens"] > 0).any() and (steps_one["decode_tokens"] > 0).any()
    for col in ("status", "preemptions", "generated_tokens", "recomputed_tokens"):
        assert one[col].tolist() == many[col].tolist(), col
    for col in ("scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(one[col].to_numpy(float), many[col].to_numpy(float), rtol=1e-9, atol=1e-9)
    for c in CLASSES:
        assert s_many[f"mem_{c}_perc"] == pytest.approx(s_one[f"mem_{c}_perc"], rel=1e-9, abs=1e-9), c


# --- tensor parallelism, configuration -------------------------------------------------------
def test_tensor_parallel_from_tp1_tables_adds_the_all_reduces(profile):
    one, two = model(profile), model(profile, tp=2)
    assert "tp1 tables / 2" in two.tp_source
    tokens = 64
    shape = BatchShape(decode_seqs=tokens, decode_context=tokens * 1024)
    # RTX 4090: no NVLink, no peer-to-peer: PCIe 4.0 through host memory, the catalogue's derived
    # figure (PCIe 5.0 without P2P at 4 GPUs, 35 GB/s, times PCIe 4.0 / 5.0 with P2P, 25.8 / 40.1),
    # and NCCL's 24 us a call on PCIe
    link = 35e9 * 25.8 / 40.1
    allreduce = 2 * LAYERS * (24e-6 + (2 * 1 / 2) * tokens * 4096 * 2 / link)
    assert two.allreduce_time(tokens) == pytest.approx(allreduce, rel=1e-12)
    norms = (LAYERS * 2 * us("dense", "layernorm", tokens) + us("dense", "final_layernorm", tokens)
             + us("per_sequence", "sampler", tokens))
    sharded = one.step_time(shape) - norms
    assert two.step_time(shape) == pytest.approx(norms + sharded / 2 + allreduce, rel=1e-9)
    # an NVLink GPU pays far less for the same all-reduces
    assert model(profile, tp=2, gpu="h100-sxm").allreduce_time(tokens) < allreduce / 5


def test_a_profile_of_other_shapes_is_refused(profile):
    with pytest.raises(OperatorProfileError, match="llama-2-7b|Llama-2-7B"):
        ProfiledCostModel(profile, Deployment(MODELS["llama-2-7b"], GPUS["rtx4090"]))
    ProfiledCostModel(profile, Deployment(MODELS["llama-3-8b"], GPUS["rtx4090"]))  # same shapes: accepted


def config(tmp_path, **cost):
    return sharegpt_config(tmp_path, name="profiled", model="llama-3.1-8b", gpu="rtx4090", rate=6.0,
                           num_requests=120, scheduler={"max_num_batched_tokens": 4096},
                           cost_model={"kind": "profiled", "profile": NAME, **cost})


def test_run_experiment_with_kind_profiled(tmp_path):
    cfg = validate_config(config(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        on = run_experiment(cfg)
        off = run_experiment(cfg.model_copy(update={"engine": cfg.engine.model_copy(
            update={"macro_steps": False})}))
    assert on.summary["completed"] == 120
    assert on.summary["cost_out_of_grid_lookups"] > 0  # prompts under 16 tokens, contexts under 16
    assert on.summary["mean_tpot_ms"] == pytest.approx(off.summary["mean_tpot_ms"], rel=1e-9)
    assert on.summary["mean_ttft_ms"] == pytest.approx(off.summary["mean_ttft_ms"], rel=1e-9)
    # step overhead 0 by default for profiled; an explicit one is added to every step
    cfg2 = validate_config(config(tmp_path, step_overhead_s=0.002))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        slower = run_experiment(cfg2)
    assert slower.summary["mean_tpot_ms"] > on.summary["mean_tpot_ms"] + 1.5


def test_profiled_needs_a_profile_and_a_known_one(tmp_path):
    raw = config(tmp_path)
    del raw["cost_model"]["profile"]
    with pytest.raises(ConfigError, match="kind 'profiled' needs profile"):
        validate_config(raw)
    cfg = validate_config(config(tmp_path, profile="no-such-profile"))
    with pytest.raises(OperatorProfileError, match="no-such-profile.*not found.*rtx4090-llama-3.1-8b"):
        run_experiment(cfg)


def test_a_model_described_by_its_shape(tmp_path):
    raw = config(tmp_path)
    raw["model"] = {"name": "my-llama", "context_len_tokens": 4096, "shape": {
        "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
        "intermediate_size": 14336, "vocab_size": 128256, "context_len_tokens": 131072}}
    cfg = validate_config(raw)
    spec = cfg.model.spec
    assert (spec.num_layers, spec.head_dim, spec.kv_bytes_per_token) == (32, 128, 2 * 32 * 8 * 128 * 2)
    assert spec.layer_params == MODELS["llama-3.1-8b"].layer_params
    raw["model"] = {"name": "my-llama"}
    with pytest.raises(ConfigError, match="unknown model 'my-llama'.*model.shape"):
        validate_config(raw)


def test_num_gpu_blocks_sets_the_kv_capacity_and_is_reported(tmp_path):
    raw = config(tmp_path)
    raw["hardware"]["num_gpu_blocks"] = 2588  # vLLM 0.19's log for this GPU and model
    cfg = validate_config(raw)
    assert cfg.kv_slots == 2588 * 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        result = run_experiment(cfg)
    assert result.summary["kv_num_gpu_blocks"] == 2588 and result.summary["kv_capacity_slots"] == 41408
    # Without it, vLLM's budget (simulator/capacity.py): the driver's total x utilization - weights
    # (norms and rotary table included) - the activation peak (sampling 256 rows of 128,256
    # logits) - 0.1 GiB outside PyTorch, in whole blocks of 16 tokens.
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096
                   + 65 * 4096 + 131072 * 128)
    activation = 4096 * 4096 * 2 + 256 * 4096 * 2 + 256 * 128256 * (2 + 3 * 4)
    kv = 25_250_627_584 * 0.9 - weights - activation - round(0.1 * 2**30)
    expected = int(kv // (2 * 32 * 8 * 128 * 2))
    assert validate_config(config(tmp_path)).kv_slots == int(kv // (16 * 131072)) * 16
    # Computed capacity: the summary counts whole blocks of the configured size.
    raw = config(tmp_path)
    raw["allocator"] = {**raw.get("allocator", {}), "block_size": 32}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        result = run_experiment(validate_config(raw))
    assert result.summary["kv_num_gpu_blocks"] == expected // 32  # 1,444 whole blocks
    assert result.summary["kv_capacity_slots"] == expected // 32 * 32


def test_roofline_check_reports_the_error_distribution(capsys):
    from kvsim.simulator.cost_model.roofline import ROOFLINE_PRESETS, RooflineParams
    from kvsim.simulator.cost_model.roofline_check import compare, error_table, main

    points = compare(NAME, "rtx4090", "llama-3.1-8b", RooflineParams(**ROOFLINE_PRESETS["hand-picked"]))
    assert len(points) == 8643
    rows = {r[0]: r for r in error_table(points)}
    assert rows["all"][1] == 8643 and rows["decode"][1] == 99 and rows["prefill"][1] == 96
    # The roofline's earlier hand-picked efficiencies (60% of peak compute, 80% of bandwidth,
    # 1 ms a step) overestimate this GPU: decode and prefill steps are too slow.
    assert 0.1 < rows["decode"][3] < 0.4 and rows["prefill"][3] > 0.2
    # the defaults, fitted to this profile (tests/simulator/cost_model/test_roofline_fit.py), do better
    fitted = {r[0]: r for r in error_table(compare(NAME, "rtx4090", "llama-3.1-8b"))}
    assert abs(fitted["decode"][3]) < rows["decode"][3] and abs(fitted["prefill"][3]) < rows["prefill"][3]
    p = points[0]
    assert p.error == pytest.approx(p.roofline_s / p.profiled_s - 1)
    assert main([NAME]) == 0
    assert "decode" in capsys.readouterr().out


def test_a_measured_tp_degree_is_used_as_is(profile):
    import dataclasses

    both = dataclasses.replace(profile, tp={1: profile.tp[1], 2: profile.tp[1]})  # tp2 "measured" = tp1
    shape = BatchShape(decode_seqs=16, decode_context=16 * 700)
    two = model(both, tp=2)
    assert two.tp_source == "tp2 tables"
    assert two.step_time(shape) == pytest.approx(model(profile).step_time(shape) + two.allreduce_time(16), rel=1e-12)


def test_catalogue_gpus_links_and_new_models():
    from kvsim.simulator.cost_model.interconnect import interconnect
    from kvsim.simulator.cost_model.roofline import allreduce_coefficients

    for name, g in GPUS.items():
        assert g.memory_bytes > 0 and g.hbm_bandwidth > 0 and g.peak_flops > 0, name
        if name != "mi300x":  # no published RCCL figure in the catalogue: its link is given in the config
            assert interconnect(g.interconnect) is not None, name
    assert (GPUS["h100-sxm"].interconnect, GPUS["l40s"].interconnect, GPUS["rtx4090"].interconnect) == (
        "nvlink4", "pcie-gen4-p2p", "pcie-gen4")
    # the roofline's all-reduce follows the link: PCIe-only GPUs pay more than NVLink ones
    m = MODELS["llama-3.1-8b"]
    pcie_fixed, pcie_token = allreduce_coefficients(m, interconnect("pcie-gen4-p2p"), 2)
    nvlink_fixed, nvlink_token = allreduce_coefficients(m, interconnect("nvlink4"), 2)
    assert pcie_token == pytest.approx(2 * 32 * 1.0 * 4096 * 2 / 25.8e9)  # measured at 4 GPUs, P2P driver
    assert (pcie_fixed, nvlink_fixed) == (2 * 32 * 24e-6, 2 * 32 * 6e-6)
    assert nvlink_token < pcie_token / 10
    q = MODELS["qwen3-32b"]  # head_dim 128, not 5120 / 64
    assert q.head_dim == 128 and q.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert q.layer_params == 5120 * 8192 * 2 + 2 * 5120 * 1024 + 3 * 5120 * 25600
    assert MODELS["qwen3-8b"].num_params == pytest.approx(8.19e9, rel=0.01)  # Qwen3-8B: 8.2B parameters
    assert MODELS["llama-3.1-70b"].num_params == pytest.approx(70.6e9, rel=0.01)
    assert MODELS["mistral-7b"].num_params == pytest.approx(7.25e9, rel=0.01)
