"""Profiled step-time model: measured operator times, looked up and interpolated.

A step's time on one GPU is assembled from an operator profile
(``simulator.cost_model.operator_profile``, e.g. the imported RTX 4090 / Llama-3.1-8B one)::

    step = layers x sum(count x dense_op(tokens))     per-layer dense operators (projections,
                                                      norms, rotary, activation) at the step's tokens
         + sum(dense_op(tokens))                      once per step: embedding, final norm
         + sum(per_sequence_op(sequences))            once per step: LM head, sampler
         + layers x attention(prefill chunk, cached prefix, decoding sequences, their context)
         + MoE layers x moe(tokens, experts touched)       mixture-of-experts blocks (moe.py)
         + tensor-parallel all-reduces                     communication (not in the tables)
         + step_overhead_s + host time                    host work outside the kernels

``tokens`` = prefill tokens + decoding sequences; ``sequences`` = sequences sampled
(prefill groups + decoding sequences).

Interpolation: piecewise linear along every axis between the two measured neighbours
(multilinear on the attention grid, as nested 1-D interpolations so that grid cells the
profile did not measure are bridged along the axis that has them), except along the
prefill chunk, where the weight between the two measured chunks ``c0 < c < c1`` is taken
in the attention kernel's work rather than in tokens::

    w = (work(c) - work(c0)) / (work(c1) - work(c0)),
    work(c) = ceil((c + decodes) / tile) x (prefix + c / 2)

A FlashAttention-style kernel reads the whole cached prefix once per tile of ``tile``
query rows and computes ``c (prefix + c / 2)`` query-key pairs: below one tile a longer
chunk costs little more (launch- and prefix-bound), one row past a tile it pays another
pass over the prefix (on the RTX 4090 profile a 512-token chunk over 16K cached tokens
takes twice a 256-token one, and 16 to 256 tokens cost the same). ``tile`` is chosen per
profile, when it is loaded, among the powers of two from the smallest to the largest
measured chunk and none (plain linear), by held-out error (each interior chunk
interpolated from its two neighbours: p95, then median; ``chunk_tile``). On the RTX 4090
profile it is 256 (p95 10.2% against 19.6% for plain linear), and counting a mixed step's
decoding sequences as query rows is what the data support (the chunk-axis p95 over mixed
steps is 10.1% with them, 23% without). ``ProfiledCostModel(chunk_tile=...)`` overrides it.

Held-out error (``tests/simulator/cost_model/test_profiled_cost_model.py``): each interior value of
each attention axis left out of the profile in turn, the model rebuilt on the rest and
asked for the left-out points (a doubling grid: 4x gaps, harsher than real lookups), tile
fixed at the whole profile's 256. Median / p95 of attention's own times, decode, prefill,
mixed:

- on the points whose KV fits the GPU (prefix + chunk + decodes x context <= 196,608
  tokens, 24 GiB / 128 KiB): 2.1% / 14.1%, 0.8% / 11.7% (31.8% with plain linear),
  0.6% / 12.5%; dense 0.6% / 8.4%, per-sequence 0.5% / 3.7%; step times median <= 0.3%,
  p95 <= 5.5%;
- over the whole grid (up to 2M tokens of KV): 1.7% / 13.9%, 0.8% / 11.7%, 0.7% / 17.6%
  (15.2% without the 1,056 points a held-out model extrapolates to: mixed steps were timed
  up to 128 decodes only); dense and per-sequence as above; step times p95 <= 7%. Mixed
  attention misses the 15%: its kernel switches regime between grid points (at 2K+ tokens
  of context 128 decodes beside a chunk cost a median 3.6x what 64 do, up to 3.9x; beside
  a 16-token chunk 1 and 2 decodes cost the same at short contexts, 1 to 4 at long ones),
  and with a slice left out the neighbours 4x apart cannot show where.

Schemes tried over the whole grid (median / p95, decode, prefill, mixed), the model's
linear first; the others change one axis:

=========================================  ===========  ===========  ===========
scheme                                     decode       prefill      mixed
=========================================  ===========  ===========  ===========
linear (the model)                         1.7 / 13.9   0.8 / 11.7   0.7 / 17.6
decodes: log-x                             6.9 / 24.5   0.8 / 11.7   1.2 / 30.4
decodes: log-log                           1.8 / 17.4   0.8 / 11.7   1.2 / 19.1
decodes: monotone cubic                    2.3 / 13.1   0.8 / 11.7   0.7 / 18.5
decodes: at constant KV read (n x ctx)     1.8 / 19.3   0.8 / 11.7   0.8 / 20.0
context: log-log                           2.1 / 16.8   0.8 / 11.7   1.0 / 19.7
context: time per KV token vs log context  3.1 / 27.1   0.8 / 11.7   1.0 / 20.3
=========================================  ===========  ===========  ===========

Two schemes with a parameter chosen by held-out error, like the chunk tile, do better only
when the parameter is chosen on the whole profile, left-out points included: along a mixed
step's decodes, weights in waves of 4 sequences (RTX 4090: 128 SMs / 32 query heads, one
wave per 4 decodes plus the chunk's tiles) give mixed 16.1%, but chosen without the
left-out slice 18.7%; along the context, tiles of 64 KV tokens give decode 12.9%, mixed
16.8%, chosen without the slice (32 when 64 is out) no gain. Both together: mixed 14.9%,
decode 12.9%, i.e. the 15% only with parameters tuned on the points they are tested on;
not adopted. The chunk tile has the same weakness: re-chosen without the left-out slice it
is 512 when the 256-token chunks are out, and prefill's p95 is 31.6% (mixed 21.0% whole).
Linear along the decode context also keeps a decode step piecewise affine in the batch's
context, which the engine's runs of decode steps need (``decode_segment``). The dense and
per-sequence tables: linear ties log-log and beats log-x and nearest.

Outside the grid (each case counted in ``out_of_grid`` and warned about once):

- below the smallest measured value, the smallest value's time (small kernels are
  launch-bound: a 5-token prefill or a 3-token context costs what 16 does);
- above the largest, linear extrapolation along the secant from the largest measured
  value at or below half the largest to the largest (tokens, sequences, decoding
  sequences, contexts: compute or bandwidth grows linearly there);
- a prefill chunk longer than the largest measured chunk is timed as consecutive chunks
  of that size, each over the prefix the previous ones left (attention grows with
  the square of the chunk; a linear extrapolation would not).

Shapes the profile does not distinguish (``BatchShape`` holds sums, not lists):

- several prefill sequences in one step: ``s`` chunks of the mean length ``P / s`` over
  the mean cached prefix that gives the step's causal query-key pairs; one launch of the
  varlen kernel pays the fixed cost once, so the step pays one chunk's time plus
  ``s - 1`` times that chunk's time above the grid's cheapest prefill (the launch);
- decoding sequences of unequal context: timed at the mean context (the equal-length
  approximation; the skew tables are not used). Measured on the RTX 4090 bundle's 13,009
  skew shots (bimodal batches; ``profile_import.mean_context_error``, recorded in the
  profile's notes), the attention kernel alone is off by median 3.9%, p95 31.0%, and the mean
  context underestimates the skewed batch in 83% of the shots: median 3.0% / p95 20% when
  the long sequences are at most 4K tokens, 10.7% / 42% above. Only the shots' ratios
  are used: their absolute times run about 3x the attention grid's at the same shape
  (median; a different harness, undocumented upstream). What would close it, measured
  (not built) on the same shots with ``t_mean + alpha (t_max - t_mean)``, the two times
  from this model's grid at the mean and the longest context, ``alpha`` fitted by least
  squares and 5-fold cross-validated: one ``alpha`` 5.2% / 27.6%; per decode-count bucket
  3.0% / 22%; per bucket of (chunk, decodes, longest / mean context, longest context in
  log-4x bins, prefix) 2.0% / 18.4%; the bundle's own table (``skew_fit.csv``, fitted on
  all the shots, and bucketed by the share of long sequences, which a sum and a maximum do
  not give) 1.3% / 11.3% in-sample. It needs the longest context in ``BatchShape``, kept
  by every allocator as it keeps the sum, and decode runs cut where ``alpha``'s bucket or
  the longest context's grid segment changes.

Tensor parallelism: a profile's ``tp<N>`` tables are per-GPU times measured at degree
``N`` on one GPU (upstream emulates a rank by dividing the model's shapes), so they hold
no communication. A run at a degree the profile has uses its tables; otherwise the
degree-1 tables with every sharded operator's time divided by the degree (norms and the
sampler, ``tp_stable``, are not: ideal sharding, optimistic where launches dominate); a
profile without degree 1 (Vidur's of some large models) refuses the degrees it lacks, in one
line naming those it has (``check_profile_degree``). In
both cases the model adds the two all-reduces per layer the tables lack (the attention
output projection's and the MLP down projection's: ``o_proj`` and ``down_proj`` are timed
without their reduction), each ``2 (n-1)/n x tokens x hidden x dtype_bytes / busbw + latency``
over the GPUs' link (``hardware.interconnect``, default the GPU's: measured NCCL bus
bandwidth and per-call latency, ``interconnect.py``). They are the step's communication part
(``step_parts``).

The attention tables were measured with the engine's paged kernel at the profile's block
size (provenance ``measurement``); other block sizes and the contiguous allocator use the
same tables (no block-size effect is modelled here, unlike ``roofline`` and ``calibrated``).

A profile that measured no mixed step (Vidur's, ``vidur_import``) times one as its chunk's
attention plus its decodes' (two kernels, as Vidur composes them); one without per-sequence
tables (Vidur's: no LM head, no sampler) adds nothing for them.

Not in a kernel profile, so taken from the roofline (catalogue GPU): swap over the host
link and copy-on-write block copies. ``step_overhead_s`` defaults to 0: the profile times
the GPU's work, and vLLM overlaps its CPU-side scheduling with it (async scheduling).
Host time (``Deployment.host``, ``host_time.py``; none by default) is added per step and
per sequence; a profile with a ``sampler`` per-sequence table has timed sampling already,
so the host time's sampling share is dropped (``HostTime.without_sampling``).
"""

from __future__ import annotations

import bisect
import math
import statistics
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from kvsim.simulator.cost_model.base import BatchShape, CostModel, Deployment
from kvsim.simulator.cost_model.catalogue import ModelSpec
from kvsim.simulator.cost_model.interpolation import bracket, lerp
from kvsim.simulator.cost_model.moe import ExpertGroup, MoeProfiled
from kvsim.simulator.cost_model.operator_profile import (
    AttentionGrid,
    OperatorProfile,
    OperatorProfileError,
    Table1D,
    find_operator_profile,
    padded_vocab_sizes,
    read_operator_profile,
)
from kvsim.simulator.cost_model.roofline import (
    RooflineCostModel,
    RooflineParams,
    allreduce_coefficients,
)

_CACHE_LIMIT = 65536  # memoised dense/per-sequence times (distinct counts) before a reset


class ProfileExtrapolationWarning(UserWarning):
    """A step fell outside the profile's measured grid (emitted once per axis and side)."""


def load_profile(profile: str | Path, base_dir: str | Path | None = None) -> OperatorProfile:
    """The operator profile a config names (a path or a shipped profile's name)."""
    return read_operator_profile(find_operator_profile(profile, base_dir))


def chunk_work(chunk: float, prefix: float, decodes: float, tile: float) -> float:
    """The prefill-chunk coordinate attention times are interpolated in (module docstring):
    passes over the prefix (one per ``tile`` query rows, decodes included) x the KV each
    pass reads plus the causal half of the chunk. ``tile`` ``math.inf``: linear in tokens."""
    tiles = 1 if math.isinf(tile) else math.ceil((chunk + decodes) / tile)
    return tiles * (prefix + chunk / 2)


def chunk_weight(c0: float, c1: float, chunk: float, prefix: float, decodes: float, tile: float) -> float:
    """Interpolation weight of ``c1`` for a chunk between measured chunks ``c0 < c1``."""
    w0 = chunk_work(c0, prefix, decodes, tile)
    return (chunk_work(chunk, prefix, decodes, tile) - w0) / (chunk_work(c1, prefix, decodes, tile) - w0)


def _chunk_lines(grid: AttentionGrid) -> list[tuple[int, int, list[tuple[int, float]]]]:
    """``(prefix, decodes, [(chunk, s), ...])`` per measured line along the chunk axis."""
    lines: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    for pc, kp, nd, kd, t in grid.points():
        if pc > 0:
            lines.setdefault((kp, nd, kd), []).append((pc, t))
    return [(kp, nd, sorted(line)) for (kp, nd, _), line in lines.items() if len(line) >= 3]


def held_out_chunk_errors(grid: AttentionGrid, tile: float, lines: list | None = None) -> list[float]:
    """``|interpolated / measured - 1|`` of every interior measured chunk, interpolated along
    the chunk axis from its two measured neighbours (same prefix, decodes and context)."""
    errors = []
    for kp, nd, line in lines if lines is not None else _chunk_lines(grid):
        for (c0, y0), (c, y), (c1, y1) in zip(line, line[1:], line[2:]):
            errors.append(abs(y0 + chunk_weight(c0, c1, c, kp, nd, tile) * (y1 - y0) - y) / y)
    return errors


_TILES: dict[int, tuple[AttentionGrid, float]] = {}  # id(grid) -> (grid kept alive, its tile)


def chunk_tile(grid: AttentionGrid) -> float:
    """The tile (a power of two from the smallest to the largest measured chunk, or
    ``math.inf``) with the lowest held-out error along the chunk axis: p95, then median
    (memoised per grid: replicas share a profile)."""
    hit = _TILES.get(id(grid))
    if hit is not None and hit[0] is grid:
        return hit[1]
    best, best_key, lines = math.inf, None, _chunk_lines(grid)
    chunks = [pc for pc in grid.prefill_chunk if pc > 0]
    tiles = [1 << e for e in range(chunks[0].bit_length() - 1, chunks[-1].bit_length())]
    for tile in [*tiles, math.inf]:
        errors = sorted(held_out_chunk_errors(grid, tile, lines))
        if not errors:
            break
        key = (errors[int(0.95 * (len(errors) - 1))], statistics.median(errors))
        if best_key is None or key < best_key:
            best, best_key = tile, key
    if len(_TILES) > 64:
        _TILES.clear()
    _TILES[id(grid)] = (grid, best)
    return best


class _Attention:
    """One layer's attention time (s) from an ``AttentionGrid`` by nested 1-D interpolation.

    Innermost the decode context, then decoding sequences, cached prefix, prefill chunk;
    each axis uses only the values measured on its line (the grid has holes: upstream did
    not time 256 decoding sequences next to a prefill chunk). Built from the grid's measured
    points alone (it is sparse), in time and memory proportional to them. ``0`` on the chunk and
    sequence axes means "none" and is never interpolated towards (1..15 prefill tokens
    cost what 16 do). Only the two bracketing points of each axis are evaluated.
    """

    def __init__(self, grid: AttentionGrid, scale: float, count: Callable[[str, int], None],
                 tile: float | None = None):
        self.count = count
        g = grid
        pcs, kps, nds, kds = g.prefill_chunk, g.kv_prefill, g.n_decode, g.kv_decode
        # (i, j) -> time with no decode; (i, j) -> (decode counts, their context lines)
        self.alone: dict[tuple[int, int], float] = {}
        self.decode: dict[tuple[int, int], tuple[tuple[int, ...], list[tuple[tuple[int, ...], tuple[float, ...]]]]] = {}
        lines: dict[tuple[int, int], dict[int, list[tuple[int, float]]]] = {}
        for (i, j, k, m), t in g.seconds.items():  # the measured points, in C order
            nd, kd = nds[k], kds[m]
            if (nd == 0) != (kd == 0):  # decodes without a context, or a context without decodes
                continue
            if nd == 0:
                self.alone[(i, j)] = t * scale
            else:
                lines.setdefault((i, j), {}).setdefault(k, []).append((kd, t * scale))
        for ij, by_count in lines.items():
            ks = sorted(by_count)
            self.decode[ij] = (tuple(nds[k] for k in ks),
                               [(tuple(p[0] for p in by_count[k]), tuple(p[1] for p in by_count[k])) for k in ks])
        # measured prefixes per chunk index, and chunks (> 0), with and without decodes
        self.prefixes: dict[tuple[int, bool], list[int]] = {(i, d): [] for i in range(len(pcs)) for d in (False, True)}
        for d, cells in ((False, self.alone), (True, self.decode)):
            for i, j in sorted(cells):
                self.prefixes[(i, d)].append(j)
        self.chunks = {d: [i for i, pc in enumerate(pcs) if pc > 0 and self.prefixes[(i, d)]] for d in (False, True)}
        self.pcs, self.kps = pcs, kps
        self.max_chunk = max(pcs)
        if not self.chunks[False] or not self.prefixes.get((0, True)) or pcs[0] != 0:
            raise OperatorProfileError("attention grid needs prefill-only and decode-only points")
        self.launch_s = min(self.alone[(i, j)] for i in self.chunks[False] for j in self.prefixes[(i, False)])
        self.contexts = tuple(sorted({kd for _, lines in self.decode.values() for xs, _ in lines for kd in xs}))
        self.tile = chunk_tile(grid) if tile is None else tile

    def _cell(self, i: int, j: int, n: float, kd: float) -> float:
        if not n:
            return self.alone[(i, j)]
        counts, lines = self.decode[(i, j)]
        k0, k1, w, side = bracket(counts, n)
        if side:
            self.count("n_decode", side)
        xs, ys = lines[k0]
        y0, s0 = lerp(xs, ys, kd)
        if s0:
            self.count("kv_decode", s0)
        if not w:
            return y0
        xs, ys = lines[k1]
        return y0 + w * (lerp(xs, ys, kd)[0] - y0)

    def _row(self, i: int, prefix: float, n: float, kd: float) -> float:
        js = self.prefixes[(i, bool(n))]
        a, b, w, side = bracket([self.kps[j] for j in js], prefix)
        if side:
            self.count("kv_prefill", side)
        y0 = self._cell(i, js[a], n, kd)
        return y0 + w * (self._cell(i, js[b], n, kd) - y0) if w else y0

    def _chunk(self, chunk: float, prefix: float, n: float, kd: float) -> float:
        if chunk <= 0:
            return self._row(0, 0.0, n, kd)
        if n and not self.chunks[True]:  # no mixed point measured (Vidur): two kernels, added
            return self._chunk(chunk, prefix, 0, 0.0) + self._row(0, 0.0, n, kd)
        idx = self.chunks[bool(n)]
        a, b, w, side = bracket([self.pcs[i] for i in idx], chunk)
        if side:
            self.count("prefill_chunk", side)
        elif w:  # inside: weight in the kernel's work (module docstring), not in tokens
            w = chunk_weight(self.pcs[idx[a]], self.pcs[idx[b]], chunk, prefix, n, self.tile)
        y0 = self._row(idx[a], prefix, n, kd)
        return y0 + w * (self._row(idx[b], prefix, n, kd) - y0) if w else y0

    def time(self, chunk: float, prefix: float, n: float, kd: float) -> float:
        """Seconds of one chunk of ``chunk`` new tokens over ``prefix`` cached ones plus
        ``n`` decoding sequences holding ``kd`` tokens each (0: none)."""
        big = self.max_chunk
        if chunk <= big:
            return self._chunk(chunk, prefix, n, kd)
        # Longer than measured: consecutive chunks of the largest size, decodes ride the last.
        self.count("prefill_chunk", 1)
        sizes = [big] * int(chunk // big)
        if chunk - len(sizes) * big > 0:
            sizes.append(chunk - len(sizes) * big)
        t, done = 0.0, prefix
        for m, c in enumerate(sizes):
            last = m == len(sizes) - 1
            t += self._chunk(c, done, n if last else 0, kd if last else 0.0)
            done += c
        return t


class ProfiledCostModel(CostModel):
    """Step times from a measured operator profile; swaps and copies from the roofline."""

    def __init__(self, profile: OperatorProfile, deployment: Deployment, *,
                 swap_batched: bool = False, step_overhead_s: float = 0.0, check_model: bool = True,
                 chunk_tile: float | None = None):
        """``step_overhead_s``: seconds added to every step; ``check_model``: refuse a profile
        of other shapes than ``deployment.model``; ``chunk_tile``: the chunk axis's tile in
        tokens (module docstring; None: chosen from the profile)."""
        d = deployment
        super().__init__(d.model, d.gpu, d.tensor_parallel, d.block_size, d.kernel)
        model, gpu, tensor_parallel = d.model, d.gpu, d.tensor_parallel
        self.profile = profile
        self.step_overhead_s = step_overhead_s
        if check_model:
            check_profile_model(profile, model)
        check_profile_degree(profile, tensor_parallel, model)
        self.out_of_grid: Counter[str] = Counter()  # "axis<" / "axis>" -> lookups outside the grid
        if tensor_parallel in profile.tp:
            tables, scale = profile.tp[tensor_parallel], 1.0
            self.tp_source = f"tp{tensor_parallel} tables"
        else:
            tables, scale = profile.tp[1], 1.0 / tensor_parallel
            self.tp_source = f"tp1 tables / {tensor_parallel} (sharded operators)" if tensor_parallel > 1 \
                else "tp1 tables"
        stable = set(profile.tp_stable)

        def share(op: str) -> float:
            return 1.0 if op in stable else scale

        layers = model.num_layers
        weights = {op: layers * c * share(op) for op, c in profile.per_layer.items() if c}
        for op in profile.per_step:
            weights[op] = weights.get(op, 0.0) + share(op)
        self._dense = _combine({op: tables.dense[op] for op in weights}, weights)
        self._per_seq = _combine(tables.per_sequence, {op: share(op) for op in tables.per_sequence})
        # the chunk axis's tile (module docstring): chosen from the profile unless given
        self._attn = _Attention(tables.attention, scale, self._count, chunk_tile)
        self._layers = layers
        # Two ring all-reduces per layer over the GPUs' link (the tables hold no communication).
        self._ar_fixed, self._ar_token = allreduce_coefficients(model, d.link, tensor_parallel)
        # Mixture of experts: the measured MoE block (degree 1's table) and, across data-parallel
        # engines, its dispatch and combine collectives (moe.py).
        self.moe = None if model.moe is None else MoeProfiled(
            profile.tp[1].moe, model, d.expert_group or ExpertGroup(tensor_parallel), d.link, self._count)
        # Host work outside the kernels; sampling's share is in the tables when they time a sampler.
        self.host = h = d.host.without_sampling() if "sampler" in tables.per_sequence else d.host
        self._host_step_s, self._host_seq_s = h.per_step_s, h.per_seq_s  # (inlined in step_time)
        self._roofline = RooflineCostModel(model, gpu, tensor_parallel, d.block_size, d.kernel,
                                           RooflineParams(swap_batched=swap_batched), d.pcie)
        # Decode-only steps are affine in the mean context between these (breaks of every line).
        self._kd = tuple(sorted({kd for xs, _ in self._attn.decode[(0, 0)][1] for kd in xs}))
        self._dense_cache: dict[int, float] = {}
        self._seq_cache: dict[int, float] = {}
        self._segments: dict[tuple[int, int], tuple[float, float]] = {}

    # --- bookkeeping -------------------------------------------------------------------
    def _count(self, axis: str, side: int) -> None:
        key = f"{axis}{'<' if side < 0 else '>'}"
        if key not in self.out_of_grid:
            warnings.warn(
                f"profile {self.profile.name}: {axis} {'below' if side < 0 else 'above'} the measured grid; "
                f"{'clamped to the smallest point' if side < 0 else 'extrapolated'} (counted in out_of_grid)",
                ProfileExtrapolationWarning, stacklevel=4)
        self.out_of_grid[key] += 1

    # --- parts (seconds) ---------------------------------------------------------------
    def _lookup(self, table: tuple, cache: dict[int, float], axis: str, x: int) -> float:
        """A 1-D table at ``x``, memoised (bounded), counting lookups outside the grid."""
        t = cache.get(x)
        if t is None:
            t, side = lerp(table[0], table[1], x)
            if side:
                self._count(axis, side)
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[x] = t
        return t

    def dense_time(self, tokens: int) -> float:
        """All dense operators of the step (every layer's and the once-per-step ones)."""
        return self._lookup(self._dense, self._dense_cache, "tokens", tokens)

    def per_sequence_time(self, sequences: int) -> float:
        """LM head and sampler over the sampled sequences."""
        if sequences <= 0 or not self._per_seq[0]:  # a profile without these tables (Vidur's)
            return 0.0
        return self._lookup(self._per_seq, self._seq_cache, "sequences", sequences)

    def attention_time(self, shape: BatchShape) -> float:
        """All layers' attention for the step's mix (see the module docstring)."""
        n = shape.decode_seqs
        kd = shape.decode_context / n if n else 0.0
        s = shape.prefill_seqs
        if shape.prefill_tokens <= 0 or s <= 0:
            return self._layers * self._attn.time(0, 0.0, n, kd) if n else 0.0
        c = shape.prefill_tokens / s
        prefix = max(0.0, (shape.prefill_attn_pairs / s - c * (c + 1) / 2) / c)
        t = self._attn.time(c, prefix, n, kd)
        if s > 1:
            t += (s - 1) * max(0.0, self._attn.time(c, prefix, 0, 0.0) - self._attn.launch_s)
        return self._layers * t

    def allreduce_time(self, tokens: int) -> float:
        """The step's collectives: tensor-parallel all-reduces, and a MoE model's dispatch and
        combine across data-parallel engines."""
        if not tokens:
            return 0.0
        moe = self.moe.communication_s(tokens) if self.moe is not None else 0.0
        return self._ar_fixed + self._ar_token * tokens + moe

    # --- CostModel ---------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> float:
        tokens = shape.num_tokens
        if tokens == 0:
            return 0.0
        sampled = shape.prefill_seqs + shape.decode_seqs
        moe = self.moe.compute_s(tokens) if self.moe is not None else 0.0
        return (self.dense_time(tokens) + moe + self.per_sequence_time(sampled)
                + self.attention_time(shape) + self.allreduce_time(tokens) + self.step_overhead_s
                + (self._host_step_s + self._host_seq_s * sampled))

    def communication_coefficients(self) -> tuple[float, float]:
        fixed, per_token = self.moe.communication_coefficients() if self.moe is not None else (0.0, 0.0)
        return self._ar_fixed + fixed, self._ar_token + per_token


    def decode_segment(self, num_seqs: int, context: int) -> tuple[float, float, int]:
        """``(a, b, iterations)``: a decode-only step of ``num_seqs`` sequences holding
        ``context`` tokens in all lasts ``a + b * context``, and stays affine for this and
        the next ``iterations - 1`` steps (context growing by ``num_seqs`` per step).

        Linear interpolation along the decode context makes a decode step piecewise affine
        in its mean context ``context / num_seqs``, with breaks at the measured contexts; a
        segment ends at the next one.
        """
        n = num_seqs
        kds = self._kd
        j = bisect.bisect_right(kds, context / n)  # segment: kds[j-1] <= mean < kds[j]
        key = (n, j)
        ab = self._segments.get(key)
        if ab is None:
            hi = kds[j] if j < len(kds) else kds[-1] + 1  # above the grid: the extrapolated line
            t_hi = self.step_time(BatchShape(decode_seqs=n, decode_context=n * hi))
            if j == 0:  # below the smallest measured context the time is flat (clamped)
                b = 0.0
            else:
                lo = kds[j - 1]
                b = (t_hi - self.step_time(BatchShape(decode_seqs=n, decode_context=n * lo))) / (n * (hi - lo))
            ab = (t_hi - b * n * hi, b)
            if len(self._segments) >= _CACHE_LIMIT:
                self._segments.clear()
            self._segments[key] = ab
        if j < len(kds):
            span = (n * kds[j] - context) // n + 1
        else:
            span = sys.maxsize
        return ab[0], ab[1], max(1, int(span))

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """The affine form of the first context segment only (decode steps are piecewise
        affine here: use ``decode_segment``)."""
        a, b, _ = self.decode_segment(num_seqs, num_seqs * self._kd[0])
        return a, b

    def swap_time(self, num_blocks: int, num_slots: int | None = None) -> float:
        return self._roofline.swap_time(num_blocks, num_slots)

    def copy_time(self, num_blocks: int) -> float:
        return self._roofline.copy_time(num_blocks)


def _combine(tables: dict[str, Table1D], weights: dict[str, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """One table holding ``sum(weight x table)`` on the union of the tables' points.

    Exact for linear interpolation inside the grid (a sum of piecewise-linear functions is
    piecewise linear on the union of their breaks), and beyond the last point when the
    tables share their points (as measured bundles do: one token grid for all operators).
    """
    xs = sorted({x for t in tables.values() for x in t.x})
    ys = [sum(w * lerp(tables[op].x, tables[op].seconds, x)[0] for op, w in weights.items()) for x in xs]
    return tuple(xs), tuple(ys)


def check_profile_model(profile: OperatorProfile, model: ModelSpec) -> None:
    """Refuse a profile measured for other shapes than the configured model's (a vocabulary
    may be the model's padded as profilers pad it: ``operator_profile.padded_vocab_sizes``)."""
    pm = profile.model
    mine = {"num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
            "ffn_size": model.ffn_size, "vocab_size": model.vocab_size}
    if model.moe is not None or "num_experts" in pm:  # a MoE model needs the profile's MoE block, and only it
        mine["num_experts"] = model.moe.num_experts if model.moe is not None else None
        mine["experts_per_token"] = model.moe.experts_per_token if model.moe is not None else None
    diff = []
    for k, v in mine.items():
        if k == "vocab_size":  # the vocabulary the profiler ran, at each degree: the model's or its padding
            padded = padded_vocab_sizes(v)
            vocabs = dict.fromkeys([pm.get(k), *dict(pm.get("vocab_size_by_tp") or {}).values()])
            bad = [str(x) for x in vocabs if x not in padded]
            if bad:
                diff.append(f"vocab_size {'/'.join(bad)} vs {v} (padded: {'/'.join(map(str, padded[1:])) or '-'})")
        elif pm.get(k) != v:
            diff.append(f"{k} {pm.get(k)} vs {v}")
    if diff:
        raise OperatorProfileError(
            f"cost_model.profile: {profile.name} was measured for {pm.get('name')} shapes; model "
            f"{model.name} differs ({', '.join(diff)}): choose a profile of this model")


def check_profile_degree(profile: OperatorProfile, tensor_parallel: int, model: ModelSpec | None = None) -> None:
    """Refuse a tensor-parallel degree the profile can time neither from its own tables nor
    from degree 1's (a profile imported without degree 1: Vidur's of some large models); a
    MoE model needs degree 1's MoE block."""
    degrees = ", ".join(map(str, sorted(profile.tp)))
    if tensor_parallel not in profile.tp and 1 not in profile.tp:
        raise OperatorProfileError(
            f"cost_model.profile: {profile.name} has tensor-parallel degrees {degrees} only, not "
            f"{tensor_parallel} (and no degree 1 to scale from): run at one of {degrees}")
    if model is not None and model.moe is not None and 1 not in profile.tp:
        raise OperatorProfileError(
            f"cost_model.profile: {profile.name} has tensor-parallel degrees {degrees} only; the MoE "
            f"model {model.name} needs its degree-1 MoE block")


def profiled_cost_factory(profile: str | Path, base_dir: str | Path | None, deployment: Deployment,
                          **options) -> Callable[[], ProfiledCostModel]:
    """A factory of cost models (one per replica) on the profile a config names; the
    profile is read and checked against the model once, here, so a bad one fails early."""
    prof = load_profile(profile, base_dir)
    check_profile_model(prof, deployment.model)
    check_profile_degree(prof, deployment.tensor_parallel, deployment.model)
    return lambda: ProfiledCostModel(prof, deployment, check_model=False, **options)
