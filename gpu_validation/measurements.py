"""The calibration grids: each function times one part of a step and returns raw rows.

A row is a flat dict (one CSV line): ``section``, the shape it ran, the quantities the
profile's formulas use (``kv_bytes``, ``flops``, ``bytes``, ``transfers``...) and the
median ``seconds``. Every grid stops early at its ``deadline`` (a ``time.monotonic()``
value) so the whole benchmark fits its time budget; the points are ordered so that a cut
grid still spans its range.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from kvsim.gpu_validation.block_copy import copy_blocks
from kvsim.gpu_validation.gpu_block_pool import GPUBlockPool
from kvsim.gpu_validation.paged_attention import (
    DecodeConfig,
    choose_num_splits,
    contiguous_decode_attention,
    num_sms,
    paged_decode_attention,
)
from kvsim.gpu_validation.raw_rows import Row, swap_columns
from kvsim.gpu_validation.timing import Timer
from kvsim.simulator.cost_model.gemm_shapes import catalogue_gemms

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class BenchGrid:
    """What to measure. Decode/pool shapes default to Llama-3-8B's attention (8 KV heads of
    128, 4 query heads per KV head, fp16); GEMMs to every catalogue model at TP 1-8."""

    dtype: torch.dtype = torch.float16
    num_kv_heads: int = 8
    head_dim: int = 128
    group: int = 4
    block_sizes: tuple[int, ...] = BLOCK_SIZES
    batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    contexts: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    # (batch, context) points that the targets are judged on, measured first
    target_points: tuple[tuple[int, int], ...] = ((64, 2048), (128, 4096), (256, 2048), (64, 8192))
    gemm_shapes: list[tuple[int, int]] = field(default_factory=catalogue_gemms)
    gemm_ms: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    # (batch, prompt length) for causal prefill attention; 32 heads of 128
    prefill_points: tuple[tuple[int, int], ...] = (
        (64, 128),
        (16, 512),
        (8, 1024),
        (4, 2048),
        (2, 4096),
        (1, 8192),
        (1, 16384),
        (32, 256),
    )
    prefill_heads: int = 32
    pool_layers: int = 4  # layers of the block pool for copy and swap
    pool_tokens: int = 1 << 17  # device token slots of that pool
    host_tokens: int = 1 << 15  # pinned host token slots
    copy_counts: tuple[int, ...] = (1, 8, 64, 512)
    swap_max_bytes: int = 64 << 20  # largest swap timed per block size
    swap_max_transfers: int = 4096  # cap on per-block-mode copies per timing
    tune_configs: tuple[DecodeConfig, ...] = (
        # (tile, warps, stages, programs per SM before split-KV); sm_90 shared memory per
        # program: 64/4/3 ~70 KB, 64/4/4 ~102 KB, 32/4/4 ~53 KB, 128/8/3 ~136 KB
        DecodeConfig(64, 4, 3),
        DecodeConfig(64, 4, 4),
        DecodeConfig(32, 4, 4),
        DecodeConfig(64, 8, 4),
        DecodeConfig(128, 8, 3),
        DecodeConfig(64, 4, 2),
        DecodeConfig(64, 4, 3, programs_per_sm=4),
        DecodeConfig(32, 4, 4, programs_per_sm=4),
    )
    tune_point: tuple[int, int] = (64, 4096)

    @classmethod
    def quick(cls) -> BenchGrid:
        """A smaller grid (~1 minute on an H100-class GPU) for a first look."""
        return cls(
            block_sizes=(1, 4, 16, 64, 256),
            batches=(1, 32, 128),
            contexts=(512, 2048, 8192),
            target_points=((64, 2048), (128, 4096)),
            gemm_shapes=catalogue_gemms((1,)),
            gemm_ms=(1, 32, 256, 2048, 8192),
            prefill_points=((16, 512), (2, 4096), (1, 8192)),
            copy_counts=(1, 64),
            tune_configs=(DecodeConfig(64, 4, 3), DecodeConfig(64, 4, 4), DecodeConfig(32, 4, 4)),
        )

    @classmethod
    def cpu_smoke(cls) -> BenchGrid:
        """Tiny shapes that run under ``TRITON_INTERPRET=1`` on a CPU in seconds: exercises
        every code path of the benchmark (not a measurement)."""
        return cls(
            num_kv_heads=2,
            head_dim=16,
            group=2,
            block_sizes=(1, 16),
            batches=(1, 3),
            contexts=(16, 40),
            target_points=(),
            gemm_shapes=[(32, 16), (16, 32)],
            gemm_ms=(1, 4, 16),
            prefill_points=((2, 8), (1, 32)),
            prefill_heads=2,
            pool_layers=2,
            pool_tokens=512,
            host_tokens=256,
            copy_counts=(1, 4),
            swap_max_bytes=16 << 10,
            swap_max_transfers=64,
            tune_configs=(DecodeConfig(16, 4, 2), DecodeConfig(32, 4, 2)),
            tune_point=(3, 40),
        )

    def decode_points(self) -> list[tuple[int, int]]:
        """Target points first, then the rest of batch x context, spread (not sorted)."""
        rest = [
            (b, c) for b in self.batches for c in self.contexts if (b, c) not in self.target_points
        ]
        # interleave small and large so a cut grid still spans the range
        rest.sort(key=lambda p: p[0] * p[1])
        spread = []
        while rest:
            spread.append(rest.pop(len(rest) // 2))
            if rest:
                spread.append(rest.pop(0))
            if rest:
                spread.append(rest.pop())
        return list(self.target_points) + spread


def timed(timer: Timer, fn, label: str, **kw) -> float | None:
    """``timer(fn)``, or None (with a one-line note) when the point cannot run: a launch
    config that needs more shared memory than the GPU has, an out-of-memory shape. One bad
    point must not cost the whole calibration."""
    try:
        return timer(fn, **kw)
    except Exception as e:  # any failure of one point is reported and skipped
        first = (str(e).strip().splitlines() or [""])[0][:160]
        print(f"  skipped {label}: {type(e).__name__}: {first}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def time_row(
    rows: list[Row], timer: Timer, fn, label: str, *, reps: int | None = None, **columns
) -> float | None:
    """``timed`` one point and, when it ran, append its row: ``columns``, then ``seconds``
    (the median, in seconds). Returns the seconds, or None for a skipped point."""
    t = timed(timer, fn, label, reps=reps)
    if t is not None:
        rows.append({**columns, "seconds": t})
    return t


def kv_bytes(num_tokens: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for ``num_tokens`` tokens of one layer."""
    return 2 * num_tokens * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


class DecodeBench:
    """Shared K/V storage viewed as paged caches of any block size or as contiguous K/V."""

    def __init__(self, grid: BenchGrid, device: torch.device, seed: int = 0):
        self.grid, self.device = grid, device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        H, D = grid.num_kv_heads, grid.head_dim
        # Enough slots for every point at every block size: a sequence holds whole blocks.
        unit = max(max(grid.block_sizes), 16)  # 16: tuning runs at block size 16
        points = grid.decode_points() + [grid.tune_point]
        self.max_tokens = max(b * math.ceil(c / unit) * unit for b, c in points)
        self.k = torch.randn(
            self.max_tokens * H * D, generator=self.gen, device=device, dtype=grid.dtype
        )
        self.v = torch.randn(
            self.max_tokens * H * D, generator=self.gen, device=device, dtype=grid.dtype
        )
        self.sms = num_sms(device)

    def inputs(self, batch: int, context: int):
        g = self.grid
        q = torch.randn(
            batch,
            g.num_kv_heads * g.group,
            g.head_dim,
            generator=self.gen,
            device=self.device,
            dtype=g.dtype,
        )
        lens = torch.full((batch,), context, dtype=torch.int32, device=self.device)
        return q, lens

    def paged_cache(self, batch: int, context: int, block_size: int):
        """K/V views ``[blocks, block_size, H, D]`` and a random (fragmented) block table."""
        g = self.grid
        num_blocks = self.max_tokens // block_size
        shape = (num_blocks, block_size, g.num_kv_heads, g.head_dim)
        per_seq = math.ceil(context / block_size)
        perm = torch.randperm(num_blocks, generator=self.gen, device=self.device)[: batch * per_seq]
        table = perm.view(batch, per_seq).to(torch.int32)
        return self.k.view(shape), self.v.view(shape), table

    def contiguous_cache(self, batch: int, context: int):
        g = self.grid
        n = batch * context * g.num_kv_heads * g.head_dim
        shape = (batch, context, g.num_kv_heads, g.head_dim)
        return self.k[:n].view(shape), self.v[:n].view(shape)

    def runner(
        self,
        kernel: str,
        batch: int,
        context: int,
        block_size: int,
        config: DecodeConfig,
        num_splits: int | None = None,
    ):
        """A no-argument callable running one launch, and the number of splits it uses."""
        q, lens = self.inputs(batch, context)
        out = torch.empty_like(q)
        splits = num_splits or choose_num_splits(
            batch * self.grid.num_kv_heads, context, self.sms, config.tile, config.programs_per_sm
        )
        if kernel == "paged":
            k, v, table = self.paged_cache(batch, context, block_size)
            return (
                lambda: paged_decode_attention(
                    q,
                    k,
                    v,
                    table,
                    lens,
                    max_context_len=context,
                    num_splits=splits,
                    config=config,
                    out=out,
                ),
                splits,
            )
        k, v = self.contiguous_cache(batch, context)
        return (
            lambda: contiguous_decode_attention(
                q, k, v, lens, max_context_len=context, num_splits=splits, config=config, out=out
            ),
            splits,
        )


def tune_decode(
    bench: DecodeBench, timer: Timer, deadline: float
) -> tuple[dict[str, DecodeConfig], list[dict]]:
    """Pick the fastest launch config for each kernel kind at one representative point
    (paged at block size 16, vLLM's default), so neither kernel is handicapped. Configs
    are tried for both kinds in turn, so a deadline cuts both lists at the same place."""
    g = bench.grid
    batch, context = g.tune_point
    rows = []
    timings: dict[str, list[tuple[float, DecodeConfig]]] = {"paged": [], "contiguous": []}
    for cfg in g.tune_configs:
        if time.monotonic() > deadline and all(timings.values()):
            break
        for kernel in timings:
            fn, _ = bench.runner(kernel, batch, context, 16, cfg)
            t = time_row(
                rows,
                timer,
                fn,
                f"tune {kernel} {cfg}",
                section="tune",
                kernel=kernel,
                block_size=16 if kernel == "paged" else 0,
                batch=batch,
                context=context,
                **asdict(cfg),
            )
            if t is not None:
                timings[kernel].append((t, cfg))
    best = {}
    for kernel, ts in timings.items():
        if not ts:
            raise RuntimeError(f"no launch config of the {kernel} decode kernel ran")
        best[kernel] = min(ts, key=lambda x: x[0])[1]
    return best, rows


def measure_decode(
    bench: DecodeBench, timer: Timer, configs: dict[str, DecodeConfig], deadline: float
) -> tuple[list[dict], bool]:
    """Paged (every block size) and contiguous decode over batch x context; rows, truncated."""
    g = bench.grid
    rows = []
    kinds = [("contiguous", 0)] + [("paged", bs) for bs in g.block_sizes]
    for batch, context in g.decode_points():
        if time.monotonic() > deadline:
            return rows, True
        for kernel, bs in kinds:
            cfg = configs[kernel]
            fn, splits = bench.runner(kernel, batch, context, bs, cfg)
            time_row(
                rows,
                timer,
                fn,
                f"decode {kernel} bs={bs} batch={batch} context={context}",
                section="decode",
                kernel=kernel,
                block_size=bs,
                batch=batch,
                context=context,
                num_splits=splits,
                **asdict(cfg),
                kv_bytes=kv_bytes(batch * context, g.num_kv_heads, g.head_dim, g.dtype),
                seq_heads=batch * g.num_kv_heads,
            )
    return rows, False


def measure_split_effect(bench: DecodeBench, timer: Timer, config: DecodeConfig) -> list[dict]:
    """Few sequences, long context: the split-KV variant against a single pass."""
    g = bench.grid
    batch, context = min(g.batches), max(g.contexts)
    rows = []
    for label, splits in (("single_pass", 1), ("split_kv", None)):
        bs = 16 if 16 in g.block_sizes else g.block_sizes[0]
        fn, used = bench.runner("paged", batch, context, bs, config, splits)
        time_row(
            rows,
            timer,
            fn,
            f"split-KV effect {label}",
            section="split_kv",
            kernel=label,
            batch=batch,
            context=context,
            num_splits=used,
            kv_bytes=kv_bytes(batch * context, g.num_kv_heads, g.head_dim, g.dtype),
        )
    return rows


def measure_memcpy(device: torch.device, timer: Timer, nbytes: int = 1 << 30) -> list[dict]:
    """Device-to-device copy: the bandwidth a streaming kernel can practically reach."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    rows: list[Row] = []
    time_row(rows, timer, lambda: dst.copy_(src), "memcpy", section="memcpy", bytes=2 * nbytes)
    return rows  # bytes: each read once and written once


def measure_gemm(
    grid: BenchGrid, device: torch.device, timer: Timer, deadline: float
) -> tuple[list[dict], bool]:
    """``x[m, k] @ w[k, n]`` (``F.linear``) at every catalogue shape and token count."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(1)
    max_m = max(grid.gemm_ms)
    x_by_k: dict[int, torch.Tensor] = {}
    for n, k in grid.gemm_shapes:
        if time.monotonic() > deadline:
            return rows, True
        w = torch.randn(n, k, generator=gen, device=device, dtype=grid.dtype) * 0.02
        if k not in x_by_k:
            x_by_k[k] = torch.randn(max_m, k, generator=gen, device=device, dtype=grid.dtype)
        for m in grid.gemm_ms:
            x = x_by_k[k][:m]
            label = f"gemm m={m} n={n} k={k}"
            fn = partial(F.linear, x, w)
            time_row(rows, timer, fn, label, section="gemm", m=m, n=n, k=k, flops=2 * m * n * k)
        del w
    return rows, False


def measure_prefill(
    grid: BenchGrid, device: torch.device, timer: Timer, deadline: float
) -> tuple[list[dict], bool]:
    """Causal self-attention of whole prompts (torch SDPA: flash attention on a GPU)."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(2)
    H, D = grid.prefill_heads, grid.head_dim
    for batch, length in grid.prefill_points:
        if time.monotonic() > deadline:
            return rows, True
        q, k, v = (
            torch.randn(batch, H, length, D, generator=gen, device=device, dtype=grid.dtype)
            for _ in range(3)
        )
        pairs = batch * length * (length + 1) // 2
        time_row(
            rows,
            timer,
            partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
            f"prefill {batch}x{length}",
            section="prefill",
            batch=batch,
            context=length,
            pairs=pairs,
            flops=4 * H * D * pairs,
        )
    return rows, False


def _swap_counts(
    grid: BenchGrid, block_bytes_all_layers: int, transfers_per_block: int
) -> list[int]:
    """Two swap sizes per block size: one near the byte cap and one an eighth of it."""
    by_bytes = max(1, grid.swap_max_bytes // block_bytes_all_layers)
    by_transfers = max(1, grid.swap_max_transfers // transfers_per_block)
    large = min(by_bytes, by_transfers)
    return sorted({max(1, large // 8), large})


def measure_pool(
    grid: BenchGrid, device: torch.device, timer: Timer, deadline: float
) -> tuple[list[dict], bool]:
    """Block copy (one launch, all layers) and swap out/in, per block and batched."""
    rows = []
    gen = torch.Generator().manual_seed(3)
    for bs in grid.block_sizes:
        if time.monotonic() > deadline:
            return rows, True
        rows += _measure_pool_at(grid, device, timer, bs, gen)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, False


def _measure_pool_at(
    grid: BenchGrid, device: torch.device, timer: Timer, bs: int, gen: torch.Generator
) -> list[dict]:
    rows = []
    num_blocks = grid.pool_tokens // bs
    num_host = max(1, grid.host_tokens // bs)
    pool = GPUBlockPool(
        grid.pool_layers,
        num_blocks,
        bs,
        grid.num_kv_heads,
        grid.head_dim,
        dtype=grid.dtype,
        device=device,
        num_cpu_blocks=num_host,
    )
    pool.kv.normal_()
    block_bytes = pool.block_bytes * grid.pool_layers  # one block, all layers, K and V
    for n in grid.copy_counts:
        if 2 * n > num_blocks:
            continue
        perm = torch.randperm(num_blocks, generator=gen)[: 2 * n]
        src, dst = perm[:n].to(device), perm[n:].to(device)
        time_row(
            rows,
            timer,
            partial(copy_blocks, pool.kv, src, dst),
            f"block copy bs={bs} n={n}",
            section="block_copy",
            block_size=bs,
            blocks=n,
            bytes=n * block_bytes,
        )
    for mode in ("per_block", "batched"):
        batched = mode == "batched"
        for n in _swap_counts(grid, block_bytes, 1 if batched else 2 * grid.pool_layers):
            n = min(n, num_host, num_blocks)
            dev_blocks = torch.randperm(num_blocks, generator=gen)[:n].tolist()
            host_blocks = list(range(n))  # a fresh host pool hands out consecutive blocks
            for direction in ("out", "in"):
                if direction == "out":
                    fn = partial(pool.copy_to_host, dev_blocks, host_blocks, batched=batched)
                else:
                    fn = partial(pool.copy_to_device, host_blocks, dev_blocks, batched=batched)
                try:
                    transfers = fn()  # also a warm-up; returns the transfers issued
                except Exception as e:
                    print(
                        f"  skipped swap {mode} {direction} bs={bs} n={n}: {type(e).__name__}: {e}"
                    )
                    continue
                # per-block mode issues thousands of copies per call: fewer repetitions
                reps = None if batched else max(3, timer.reps // 2)
                label = f"swap {mode} {direction} bs={bs} n={n}"
                columns = swap_columns(mode, direction, bs, n, transfers, n * block_bytes)
                time_row(rows, timer, fn, label, reps=reps, **columns)
    return rows
