"""Correctness checks run before any timing: kernels against the torch reference, block
copy and swap round trips byte for byte. A benchmark of a wrong kernel is worthless, so
the bench runs these first (at full size on the GPU) and records the outcome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvsim.gpu_validation.gpu_block_pool import GPUBlockPool
from kvsim.gpu_validation.paged_attention import (
    DecodeConfig,
    contiguous_decode_attention,
    paged_decode_attention,
)
from kvsim.gpu_validation.reference import (
    reference_contiguous_decode_attention,
    reference_paged_decode_attention,
)

# max |kernel - reference| allowed: fp16 keeps 11 bits, bf16 8; P is rounded to the input
# dtype before the PV product (as every fused attention kernel does)
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 1e-4}


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class CheckSizes:
    num_seqs: int = 32
    max_context: int = 4096
    num_kv_heads: int = 8
    group: int = 4
    head_dim: int = 128
    block_sizes: tuple[int, ...] = (1, 16, 256)
    split_seqs: int = 2
    split_context: int = 8000
    pool_layers: int = 4

    @classmethod
    def tiny(cls) -> CheckSizes:
        return cls(3, 40, 2, 2, 16, (1, 16), 1, 70, 2)


def _random_case(
    sizes: CheckSizes, num_seqs: int, max_context: int, block_size: int, dtype, device, gen
):
    lens = torch.randint(
        1, max_context + 1, (num_seqs,), generator=gen, device=device, dtype=torch.int32
    )
    lens[0] = max_context  # the longest case always present
    per_seq = math.ceil(max_context / block_size)
    num_blocks = num_seqs * per_seq + 7
    H, D = sizes.num_kv_heads, sizes.head_dim
    k = torch.randn(num_blocks, block_size, H, D, generator=gen, device=device, dtype=dtype)
    v = torch.randn(num_blocks, block_size, H, D, generator=gen, device=device, dtype=dtype)
    table = torch.randperm(num_blocks, generator=gen, device=device)[: num_seqs * per_seq]
    q = torch.randn(num_seqs, H * sizes.group, D, generator=gen, device=device, dtype=dtype)
    return q, k, v, table.view(num_seqs, per_seq).to(torch.int32), lens


def check_decode(
    device: torch.device,
    sizes: CheckSizes,
    dtypes=(torch.float16, torch.bfloat16),
    config: DecodeConfig | None = None,
) -> list[CheckResult]:
    gen = torch.Generator(device=device).manual_seed(0)
    results = []
    for dtype in dtypes:
        tol = TOLERANCE[dtype]
        for bs in sizes.block_sizes:
            cases = [
                ("single pass", sizes.num_seqs, sizes.max_context, 1),
                ("split", sizes.split_seqs, sizes.split_context, 4),
            ]
            for label, n, ctx, splits in cases:
                q, k, v, table, lens = _random_case(sizes, n, ctx, bs, dtype, device, gen)
                out = paged_decode_attention(q, k, v, table, lens, num_splits=splits, config=config)
                ref = reference_paged_decode_attention(q, k, v, table, lens)
                err = (out.float() - ref.float()).abs().max().item()
                name = f"paged {str(dtype).split('.')[-1]} bs={bs} {label} seqs={n} ctx<={ctx}"
                results.append(
                    CheckResult(name, err <= tol, f"max abs err {err:.2e} (tol {tol:.0e})")
                )
        # contiguous baseline: the same K/V gathered into per-sequence rows
        q, k, v, table, lens = _random_case(
            sizes, sizes.num_seqs, sizes.max_context, 16, dtype, device, gen
        )
        kc = k[table.long()].flatten(1, 2)
        vc = v[table.long()].flatten(1, 2)
        out = contiguous_decode_attention(q, kc, vc, lens, config=config)
        ref = reference_contiguous_decode_attention(q, kc, vc, lens)
        err = (out.float() - ref.float()).abs().max().item()
        paged = paged_decode_attention(q, k, v, table, lens, config=config)
        same = (paged.float() - out.float()).abs().max().item()
        results.append(
            CheckResult(
                f"contiguous {str(dtype).split('.')[-1]}", err <= tol, f"max abs err {err:.2e}"
            )
        )
        results.append(
            CheckResult(
                f"paged == contiguous {str(dtype).split('.')[-1]}",
                same <= tol,
                f"max abs diff {same:.2e}",
            )
        )
    return results


def check_pool(device: torch.device, sizes: CheckSizes, block_size: int = 16) -> list[CheckResult]:
    pool = GPUBlockPool(
        sizes.pool_layers,
        64,
        block_size,
        sizes.num_kv_heads,
        sizes.head_dim,
        device=device,
        num_cpu_blocks=32,
    )
    pool.kv.normal_()
    results = []
    # copy-on-write: share 6 blocks, then each writer gets its own exact copy
    blocks = pool.allocate(6)
    pool.share(blocks)
    before = pool.kv[:, blocks].clone()
    fresh = pool.copy_on_write(blocks)
    ok = all(f != b for f, b in zip(fresh, blocks)) and torch.equal(pool.kv[:, fresh], before)
    results.append(
        CheckResult(
            "block copy (copy-on-write)", ok, f"{len(blocks)} blocks x {sizes.pool_layers} layers"
        )
    )
    for batched in (False, True):
        snapshot = pool.kv[:, fresh].clone()
        host = pool.swap_out(fresh, batched=batched)
        pool.kv[:, fresh] = 0  # the freed device blocks get overwritten
        back = pool.swap_in(host, batched=batched)
        pool.synchronize()
        ok = torch.equal(pool.kv[:, back], snapshot)
        results.append(
            CheckResult(
                f"swap round trip {'batched' if batched else 'per block'}",
                ok,
                f"{len(back)} blocks",
            )
        )
        fresh = back
    return results


def run_checks(
    device: torch.device, sizes: CheckSizes, config: DecodeConfig | None = None
) -> list[CheckResult]:
    return check_decode(device, sizes, config=config) + check_pool(device, sizes)
