"""Fits recover known coefficients; the report computes its numbers (numpy only)."""

import numpy as np
import pytest

from kvsim.gpu_validation.fitting import (
    build_profile,
    fit_decode,
    fit_transfer,
    nonneg_relative_lstsq,
)
from kvsim.gpu_validation.raw_rows import swap_columns
from kvsim.gpu_validation.report import hbm_peak_from_name, summarize
from kvsim.simulator.cost_model.calibration_profile import (
    ProfileMetadata,
    read_profile,
    write_profile,
)


def test_decode_fit_recovers_generating_coefficients():
    a, b, c = 6e-6, 1 / 3.0e12, 2e-9
    rng = np.random.default_rng(0)
    kv = rng.uniform(1e6, 5e9, 40)
    sh = rng.integers(8, 2048, 40)
    fit = fit_decode(kv, sh, a + b * kv + c * sh)
    assert fit.a == pytest.approx(a, rel=1e-4)
    assert fit.b == pytest.approx(b, rel=1e-4)
    assert fit.c == pytest.approx(c, rel=1e-3)
    assert fit.rel_rmse < 1e-6 and fit.points == 40


def test_fit_never_returns_negative_costs():
    x = np.linspace(1, 10, 20)
    y = 5.0 - 0.2 * x  # falls with x: an unconstrained fit would give a negative slope
    coef, err = nonneg_relative_lstsq(np.column_stack([np.ones_like(x), x]), y)
    assert np.all(coef >= 0)
    assert coef[1] == 0.0  # the slope is clamped, the intercept absorbs the rest
    assert err > 0


def test_relative_fit_weights_small_points():
    """Points 1000x apart with 2% noise: weighting by 1/y pins the intercept (the launch
    cost that dominates small steps), which an unweighted fit loses in the big points' noise."""
    x = np.array([1, 2, 3, 1000, 2000, 3000], dtype=float)
    noise = np.array([1.02, 0.98, 1.02, 0.98, 1.02, 0.98])
    y = (1e-5 + 1e-5 * x) * noise
    X = np.column_stack([np.ones_like(x), x])
    coef, _ = nonneg_relative_lstsq(X, y)
    assert coef[0] == pytest.approx(1e-5, rel=0.1)
    assert np.max(np.abs((X @ coef) / y - 1)) < 0.05
    unweighted, *_ = np.linalg.lstsq(X, y, rcond=None)
    assert abs(unweighted[0] / 1e-5 - 1) > 1.0  # what the weighting protects against


def test_transfer_fit_recovers_latency_and_bandwidth():
    lat, bw = 8e-6, 24e9
    transfers = np.array([8, 64, 512, 4096, 4, 4])
    nbytes = np.array([1e5, 1e6, 8e6, 6.4e7, 6.4e7, 1e5])
    fit = fit_transfer(transfers, nbytes, lat * transfers + nbytes / bw)
    assert fit.latency_s == pytest.approx(lat, rel=1e-4)
    assert fit.bytes_per_s == pytest.approx(bw, rel=1e-4)


def synthetic_rows():
    """Rows as the bench writes them, from known formulas."""
    rows = []
    for batch in (1, 64, 128):
        for ctx in (512, 2048, 4096):
            kvb = batch * ctx * 4096
            t_contig = 5e-6 + kvb / 3.0e12 + 1e-9 * batch * 8
            rows.append(
                dict(
                    section="decode",
                    kernel="contiguous",
                    block_size=0,
                    batch=batch,
                    context=ctx,
                    kv_bytes=kvb,
                    seq_heads=batch * 8,
                    seconds=t_contig,
                )
            )
            for bs, factor in ((1, 2.0), (16, 1.1)):
                rows.append(
                    dict(
                        section="decode",
                        kernel="paged",
                        block_size=bs,
                        batch=batch,
                        context=ctx,
                        kv_bytes=kvb,
                        seq_heads=batch * 8,
                        seconds=factor * t_contig,
                    )
                )
    for m in (1, 64, 4096):
        rows.append(
            dict(
                section="gemm",
                m=m,
                n=4096,
                k=4096,
                flops=2 * m * 4096 * 4096,
                seconds=1e-5 + m * 1e-7,
            )
        )
    for f in (1e9, 1e11, 1e12):
        rows.append(dict(section="prefill", flops=f, seconds=1e-5 + f / 4e14))
    for bs in (1, 16):
        for nbytes in (1e5, 1e7):
            rows.append(
                dict(
                    section="block_copy", block_size=bs, bytes=nbytes, seconds=4e-6 + nbytes / 1e12
                )
            )
        for mode, per in (("per_block", 8), ("batched", 1)):
            for direction in ("out", "in"):
                for blocks in (8, 64):
                    nbytes = blocks * bs * 16384
                    transfers = per * blocks if mode == "per_block" else 4
                    row = swap_columns(mode, direction, bs, blocks, transfers, nbytes)
                    rows.append(dict(row, seconds=1e-5 * transfers + nbytes / 25e9))
    return rows


def profile_from(rows):
    md = ProfileMetadata(
        gpu="Test GPU", date="2025-01-01", synthetic=False, hbm_peak_bytes_per_s=4e12
    )
    return build_profile(rows, md, {"num_kv_heads": 8, "head_dim": 128, "group": 4})


def test_build_profile_from_rows():
    p = profile_from(synthetic_rows())
    assert p.decode_contiguous.b == pytest.approx(1 / 3.0e12, rel=1e-4)
    assert p.decode_paged[1].b == pytest.approx(2 / 3.0e12, rel=1e-4)
    assert p.decode_paged[16].a == pytest.approx(1.1 * 5e-6, rel=1e-3)
    assert p.prefill.b == pytest.approx(1 / 4e14, rel=1e-4)
    assert p.block_copy[16].b == pytest.approx(1e-12, rel=1e-4)
    assert p.swap_per_block.out.latency_s == pytest.approx(1e-5, rel=1e-4)
    assert p.swap_batched.into.bytes_per_s == pytest.approx(25e9, rel=1e-4)
    # reported GB/s: the largest transfer at each block size (64 blocks)
    nbytes = 64 * 16 * 16384
    assert p.swap_per_block.gbps_out[16] == pytest.approx(
        nbytes / (1e-5 * 8 * 64 + nbytes / 25e9) / 1e9, rel=1e-3
    )
    assert p.gemm_tables[(4096, 4096)].m == (1, 64, 4096)


def test_summary_numbers():
    s = summarize(synthetic_rows(), hbm_peak=4e12)
    # only batch >= 64 and context >= 2048 count: 4 points, all ratios exact
    assert s["paged_over_contiguous"] == {1: pytest.approx(2.0), 16: pytest.approx(1.1)}
    kvb = [b * c * 4096 for b in (64, 128) for c in (2048, 4096)]
    t = [5e-6 + x / 3.0e12 + 1e-9 * b * 8 for x, b in zip(kvb, (64, 64, 128, 128))]
    expected = float(np.median([x / (1.1 * ti) for x, ti in zip(kvb, t)]))
    assert s["decode_share_of_hbm_peak"]["paged"][16] == pytest.approx(expected / 4e12)
    assert s["targets"]["paged_over_contiguous_bs16 <= 1.15"] is True
    assert s["swap_gbps"]["batched"]["in"][1] == pytest.approx(
        64 * 16384 / (4e-5 + 64 * 16384 / 25e9) / 1e9
    )


def test_hbm_peaks_by_name():
    assert hbm_peak_from_name("NVIDIA H200") == 4.8e12
    assert hbm_peak_from_name("NVIDIA H100 80GB HBM3") == 3.35e12
    assert hbm_peak_from_name("NVIDIA H100 PCIe") == 2.0e12
    assert hbm_peak_from_name("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert hbm_peak_from_name("NVIDIA A100-SXM4-40GB") == 1.555e12
    assert hbm_peak_from_name("Some Future GPU") is None


def test_fitted_profile_round_trips_with_its_fit_quality(tmp_path):
    """Every fit's ``rel_rmse`` and ``points`` are written and read back (the example
    profile only has the defaults, so this is where a dropped quality field shows)."""
    rows = synthetic_rows()
    rng = np.random.default_rng(1)
    for r in rows:
        r["seconds"] *= rng.uniform(0.95, 1.05)  # noise: every fit gets a non-zero error
    p = profile_from(rows)
    fits = [p.decode_contiguous, p.prefill, p.block_copy[16], p.swap_batched.out]
    assert all(f.rel_rmse > 0 and f.points > 0 for f in fits)
    back = read_profile(write_profile(p, tmp_path / "p.yaml"))
    assert back == p
    assert [(f.rel_rmse, f.points) for f in fits] == [
        (f.rel_rmse, f.points)
        for f in (back.decode_contiguous, back.prefill, back.block_copy[16], back.swap_batched.out)
    ]
