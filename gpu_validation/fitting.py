"""Turn raw benchmark rows into the fitted formulas of a profile (numpy, no torch).

All fits minimise *relative* squared error (each row weighted by 1 / measured seconds):
the grids span microseconds to tens of milliseconds and a plain least-squares fit would
ignore the small points, which are the decode steps the simulator runs most. Every
coefficient is a cost, so fits are constrained to be non-negative (an exact small NNLS:
every subset of columns is tried and the best admissible one kept).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from kvsim.gpu_validation.raw_rows import Row
from kvsim.simulator.cost_model.calibration_profile import (
    AffineFit,
    DecodeFit,
    GemmRoofline,
    GemmTable,
    Profile,
    ProfileMetadata,
    SwapMode,
    TransferFit,
)


def sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (profiles stay readable; the
    measurements are nowhere near that precise)."""
    return float(f"{float(x):.{digits}g}")


def nonneg_relative_lstsq(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative ``coef`` minimising ``sum(((X @ coef - y) / y)**2)``; also the RMS
    relative error. ``X`` is ``[points, p]`` with small ``p`` (all subsets are tried)."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim != 2 or len(y) != X.shape[0] or len(y) == 0:
        raise ValueError("X must be [points, columns] with one y per point")
    if np.any(y <= 0):
        raise ValueError("measured times must be > 0")
    Xw, yw = X / y[:, None], np.ones_like(y)
    p = X.shape[1]
    best, best_err = np.zeros(p), np.inf
    for r in range(1, p + 1):
        for cols in itertools.combinations(range(p), r):
            sol, *_ = np.linalg.lstsq(Xw[:, cols], yw, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(p)
            coef[list(cols)] = sol
            err = float(np.sum((Xw @ coef - 1.0) ** 2))
            if err < best_err - 1e-15:
                best, best_err = coef, err
    rel_rmse = float(np.sqrt(best_err / len(y))) if np.isfinite(best_err) else float("inf")
    return best, rel_rmse


def _fit(X: np.ndarray, seconds: Sequence[float]) -> tuple[np.ndarray, dict[str, float | int]]:
    """``nonneg_relative_lstsq`` of ``seconds`` on ``X``: the coefficients, and the
    ``FitQuality`` keywords every fit stores (error to 3 significant digits, point count)."""
    coef, err = nonneg_relative_lstsq(X, np.asarray(seconds))
    return coef, {"rel_rmse": sig(err, 3), "points": len(seconds)}


def fit_decode(
    kv_bytes: Sequence[float], seq_heads: Sequence[float], seconds: Sequence[float]
) -> DecodeFit:
    X = np.column_stack([np.ones(len(seconds)), kv_bytes, seq_heads])
    (a, b, c), quality = _fit(X, seconds)
    return DecodeFit(sig(a), sig(b), sig(c), **quality)


def fit_affine(x: Sequence[float], seconds: Sequence[float]) -> AffineFit:
    X = np.column_stack([np.ones(len(seconds)), x])
    (a, b), quality = _fit(X, seconds)
    return AffineFit(sig(a), sig(b), **quality)


def fit_transfer(
    transfers: Sequence[float], nbytes: Sequence[float], seconds: Sequence[float]
) -> TransferFit:
    X = np.column_stack([transfers, nbytes])
    (lat, inv_bw), quality = _fit(X, seconds)
    if inv_bw <= 0:  # latency explained everything (tiny transfers only): bound bandwidth
        inv_bw = float(np.min(np.asarray(seconds) / np.asarray(nbytes, dtype=float)))
    return TransferFit(sig(lat), sig(1.0 / inv_bw), **quality)


def fit_gemm_fallback(rows: Iterable[Row], dtype_bytes: int = 2) -> GemmRoofline:
    """A roofline through the measured GEMMs, for shapes the bench did not run.

    ``flops_per_s``/``bytes_per_s``: the 90th percentile of achieved rates over all
    points (the rate large, well-shaped GEMMs reach); ``a``: the median time left over.
    """
    m, n, k, t = (np.array([float(r[c]) for r in rows]) for c in ("m", "n", "k", "seconds"))
    if len(t) == 0:
        raise ValueError("no GEMM measurements")
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * dtype_bytes
    f_rate = float(np.percentile(flops / t, 90))
    b_rate = float(np.percentile(nbytes / t, 90))
    rest = t - np.maximum(flops / f_rate, nbytes / b_rate)
    return GemmRoofline(sig(max(0.0, float(np.median(rest)))), sig(f_rate), sig(b_rate))


def gemm_table(n: int, k: int, seconds_by_m: dict[int, float]) -> GemmTable:
    """The table of one ``[m, k] @ [k, n]`` shape: token counts ``m`` in increasing order,
    seconds to 6 significant digits."""
    ms = sorted(seconds_by_m)
    return GemmTable(n, k, tuple(ms), tuple(sig(seconds_by_m[m]) for m in ms))


def gemm_tables(rows: Iterable[Row]) -> dict[tuple[int, int], GemmTable]:
    by_shape: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for r in rows:
        by_shape[(int(r["n"]), int(r["k"]))][int(r["m"])] = float(r["seconds"])
    return {(n, k): gemm_table(n, k, points) for (n, k), points in by_shape.items()}


def reported_gbps(nbytes: float, seconds: float) -> float:
    """A transfer's rate as the profile reports it: 1e9 bytes/s, 4 significant digits."""
    return sig(nbytes / seconds / 1e9, 4)


def _select(rows: Iterable[Row], section: str, **match) -> list[Row]:
    return [
        r for r in rows if r["section"] == section and all(r.get(k) == v for k, v in match.items())
    ]


def _swap_mode(rows: list[Row], mode: str) -> SwapMode:
    fits, gbps = {}, {}
    for direction in ("out", "in"):
        sel = _select(rows, "swap", mode=mode, direction=direction)
        if not sel:
            raise ValueError(f"no swap measurements for mode={mode} direction={direction}")
        fits[direction] = fit_transfer(
            [r["transfers"] for r in sel], [r["bytes"] for r in sel], [r["seconds"] for r in sel]
        )
        # Reported GB/s per block size: the largest transfer measured at that size.
        largest: dict[int, Row] = {}
        for r in sel:
            bs = int(r["block_size"])
            if bs not in largest or r["bytes"] > largest[bs]["bytes"]:
                largest[bs] = r
        gbps[direction] = {
            bs: reported_gbps(r["bytes"], r["seconds"]) for bs, r in sorted(largest.items())
        }
    return SwapMode(fits["out"], fits["in"], gbps["out"], gbps["in"])


def build_profile(
    rows: list[Row], metadata: ProfileMetadata, decode_shape: dict[str, int]
) -> Profile:
    """Fit every section of a profile from the benchmark's raw rows."""
    decode = _select(rows, "decode")
    paged: dict[int, list[Row]] = defaultdict(list)
    for r in decode:
        if r["kernel"] == "paged":
            paged[int(r["block_size"])].append(r)
    contiguous = [r for r in decode if r["kernel"] == "contiguous"]
    if not paged or not contiguous:
        raise ValueError("decode measurements for both paged and contiguous kernels are needed")

    def dfit(sel: list[Row]) -> DecodeFit:
        return fit_decode(
            [r["kv_bytes"] for r in sel], [r["seq_heads"] for r in sel], [r["seconds"] for r in sel]
        )

    prefill = _select(rows, "prefill")
    copies: dict[int, list[Row]] = defaultdict(list)
    for r in _select(rows, "block_copy"):
        copies[int(r["block_size"])].append(r)
    gemm = _select(rows, "gemm")
    if not prefill or not copies or not gemm:
        raise ValueError("prefill, block_copy and gemm measurements are all needed")
    return Profile(
        metadata=metadata,
        decode_shape=dict(decode_shape),
        decode_paged={bs: dfit(sel) for bs, sel in sorted(paged.items())},
        decode_contiguous=dfit(contiguous),
        prefill=fit_affine([r["flops"] for r in prefill], [r["seconds"] for r in prefill]),
        gemm_tables=gemm_tables(gemm),
        gemm_fallback=fit_gemm_fallback(gemm),
        block_copy={
            bs: fit_affine([r["bytes"] for r in sel], [r["seconds"] for r in sel])
            for bs, sel in sorted(copies.items())
        },
        swap_per_block=_swap_mode(rows, "per_block"),
        swap_batched=_swap_mode(rows, "batched"),
    )
