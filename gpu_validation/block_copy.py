"""Batched block copy in one Triton launch: the GPU side of copy-on-write.

When a forked sequence appends to a shared, partly filled block, the engine copies that
block to a fresh one first. A step can need many such copies (every beam, every layer);
doing them as one launch over all (src, dst) pairs and all layers keeps the cost at one
kernel launch plus the bytes, which is what the simulator's ``copy_time`` models.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 1024  # elements one program copies


@triton.jit
def _copy_blocks_kernel(
    cache_ptr,
    src_ptr,
    dst_ptr,
    stride_layer,
    stride_block,
    block_elems,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    layer = tl.program_id(1)
    chunk = tl.program_id(2)
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = offs < block_elems
    base = cache_ptr + layer.to(tl.int64) * stride_layer
    data = tl.load(base + src * stride_block + offs, mask=ok)
    tl.store(base + dst * stride_block + offs, data, mask=ok)


def copy_blocks(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy block ``src[i]`` to block ``dst[i]`` in every layer of ``cache``, in one launch.

    ``cache`` is ``[num_layers, num_blocks, ...]`` with each block's data contiguous
    (e.g. the pool's ``[layers, blocks, 2, block_size, kv_heads, head_dim]``: K and V of a
    block move together). ``src``/``dst`` are int64 block numbers on the cache's device;
    the ``dst`` blocks must be distinct and disjoint from ``src``.
    """
    if src.shape != dst.shape or src.dim() != 1:
        raise ValueError("src and dst must be 1-D and of equal length")
    if cache.dim() < 3:
        raise ValueError("cache must be [num_layers, num_blocks, ...]")
    block_elems = cache[0, 0].numel()
    if cache.stride(1) != block_elems or not cache[0, 0].is_contiguous():
        raise ValueError("each block of the cache must be one contiguous run of elements")
    if src.numel() == 0:
        return
    num_layers = cache.shape[0]
    grid = (src.numel(), num_layers, triton.cdiv(block_elems, CHUNK))
    _copy_blocks_kernel[grid](
        cache, src, dst, cache.stride(0), cache.stride(1), block_elems, CHUNK=CHUNK, num_warps=4
    )
