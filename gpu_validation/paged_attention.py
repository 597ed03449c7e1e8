"""Decode attention in Triton: paged (through block tables), contiguous, and split-KV.

One decode step: every sequence has one new query token per query head and attends to
all of its cached keys and values. The paged kernel finds each token's K/V through the
sequence's block table; the contiguous kernel is the *same code* with the table lookup
compiled out (``PAGED=False``), so the measured difference between them is the cost of
paging and nothing else.

Layouts (last dimension contiguous, other strides free, so a K view cut out of a larger
pool tensor works as is):

- ``q``: ``[num_seqs, num_q_heads, head_dim]``
- paged ``k_cache``/``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``
- contiguous ``k``/``v``: ``[num_seqs, max_context, num_kv_heads, head_dim]``
- ``block_tables``: ``[num_seqs, max_blocks]`` int32 physical block numbers
- ``context_lens``: ``[num_seqs]`` int32, tokens of K/V each sequence reads (>= 1)

Keyword options, the same for both entry points (``paged_decode_attention``,
``contiguous_decode_attention``; their defaults live in ``_launch``):

- ``scale``: the softmax scale, default ``1/sqrt(head_dim)``;
- ``max_context_len`` (tokens): sizes the splits; without it the kernel reads it from
  ``context_lens`` (one device sync);
- ``num_splits``: None picks split-KV automatically (``choose_num_splits``), 1 forces a
  single pass;
- ``config``: the ``DecodeConfig`` launch parameters, default ``DecodeConfig()``;
- ``out``: a ``[num_seqs, num_q_heads, head_dim]`` tensor to write into (else a new one).

Design (for a memory-bound kernel on Hopper-class GPUs):

- One program per (sequence, KV head[, split]) handles all query heads of the GQA group
  together, so each K/V byte is loaded once per group, not once per query head.
- KV is walked in tiles of ``TILE`` tokens regardless of block size. Each token of a tile
  looks up its own block (``pos // BLOCK_SIZE``), so blocks smaller than a tile are
  gathered several per tile and tiny blocks still give full-width loads; blocks larger
  than a tile are walked a tile at a time. The block numbers are fetched one tile ahead,
  which lets Triton's software pipeliner keep ``num_stages - 1`` K/V tiles in flight as
  for contiguous K/V (fetched in the same iteration, the dependent load allowed only one).
- Scores and the softmax run in fp32 with an online (streaming) softmax in base 2
  (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; the same
  rescaling FlashAttention uses): running max ``m``, running sum ``l`` and an unnormalised
  accumulator, rescaled by ``2**(m_old - m_new)`` whenever the max grows.
- ``tl.dot`` needs at least 16 rows, so the group's query heads are padded to
  ``GROUP_PAD = max(16, next_pow2(group))`` rows of zeros (never stored).
- Split-KV: with few sequences there are too few programs to fill the GPU, so the
  context is cut into ``num_splits`` ranges, each program writes a partial ``(m, l, acc)``
  and a second kernel merges them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the decode kernel (tokens per tile, warps, pipeline stages)."""

    tile: int = 64  # tokens of K/V per loop iteration; power of two >= 16
    num_warps: int = 4
    num_stages: int = 3  # software-pipeline depth: num_stages - 1 K/V tiles in flight
    programs_per_sm: int = 2  # split-KV when (sequence, KV head) programs are fewer per SM

    def __post_init__(self):
        if self.tile < 16 or self.tile & (self.tile - 1):
            raise ValueError(f"tile must be a power of two >= 16, got {self.tile}")


# Arguments that vary from call to call without changing the code: not specialised (Triton
# otherwise compiles a variant per value 1 / multiple of 16 / other). Strides of K and V
# stay specialised: knowing they are multiples of 16 is what lets loads vectorise.
@triton.jit(do_not_specialize=["stride_bt_seq", "num_q_heads", "num_splits"])
def _decode_attention_kernel(
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    context_lens_ptr,
    qk_scale,  # softmax scale * log2(e): scores come out in base 2
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    num_q_heads,
    num_splits,
    tokens_per_split,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    PAGED: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    context_len = tl.load(context_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(context_len, start + tokens_per_split)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    q_heads = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_q_seq + q_heads[:, None] * stride_q_head + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)

    offs = tl.arange(0, TILE)
    table_row = block_table_ptr + seq.to(tl.int64) * stride_bt_seq
    if PAGED:  # block numbers of the first tile; each iteration fetches the next tile's
        first = start + offs
        next_block = tl.load(table_row + first // BLOCK_SIZE, mask=first < end, other=0)
    for tile_start in range(start, end, TILE):
        pos = tile_start + offs
        tok_ok = pos < end
        if PAGED:
            # Fetched one tile ahead: K/V addresses never wait on a table load issued in the
            # same iteration, so Triton pipelines the K/V loads as deep as for contiguous K/V.
            block = next_block.to(tl.int64)
            ahead = pos + TILE
            next_block = tl.load(table_row + ahead // BLOCK_SIZE, mask=ahead < end, other=0)
            slot = pos % BLOCK_SIZE
            k_rows = block * stride_k_block + slot * stride_k_slot
            v_rows = block * stride_v_block + slot * stride_v_slot
        else:
            k_rows = seq.to(tl.int64) * stride_k_block + pos.to(tl.int64) * stride_k_slot
            v_rows = seq.to(tl.int64) * stride_v_block + pos.to(tl.int64) * stride_v_slot
        if HEAD_DIM == HEAD_DIM_PAD:  # no padding: a row mask, plainly constant along dims
            kv_mask = tok_ok[:, None]
        else:
            kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(
            k_ptr + (k_rows + kv_head * stride_k_head)[:, None] + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        if DOT_IN_FP32:  # interpreter only: its tl.dot mishandles bf16 (see _dot_in_fp32)
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale  # [GROUP_PAD, TILE] fp32, base-2 logits
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + (v_rows + kv_head * stride_v_head)[:, None] + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        if DOT_IN_FP32:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if SPLIT:
        # Partials are [num_seqs, num_q_heads, num_splits(, HEAD_DIM)] fp32, contiguous.
        part = (seq.to(tl.int64) * num_q_heads + q_heads) * num_splits + split
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
            acc,
            mask=row_ok[:, None] & dim_ok[None, :],
        )
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty context gives zeros
        tl.store(
            out_ptr
            + seq.to(tl.int64) * stride_o_seq
            + q_heads[:, None] * stride_o_head
            + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


@triton.jit(do_not_specialize=["num_q_heads", "num_splits"])
def _merge_splits_kernel(
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    stride_o_seq,
    stride_o_head,
    num_q_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Merge the splits of one (sequence, query head): rescale each to the global max."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_ok = splits < num_splits
    dim_ok = dims < HEAD_DIM
    part = (seq.to(tl.int64) * num_q_heads + head) * num_splits + splits
    m = tl.load(part_m_ptr + part, mask=split_ok, other=float("-inf"))
    part_sum = tl.load(part_l_ptr + part, mask=split_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty
    w = tl.exp2(m - m_max)  # empty splits (m = -inf) weigh 0
    l_total = tl.sum(w * part_sum, 0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], 0) / tl.where(l_total > 0, l_total, 1.0)
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_o_seq + head * stride_o_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_ok,
    )


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    """True under ``TRITON_INTERPRET=1`` for bf16: the interpreter's ``tl.dot`` multiplies
    bf16 operands as their raw 16-bit integers (triton 3.x), so there the kernel upcasts
    the operands to fp32 first, after rounding P to bf16 exactly as the GPU path does.
    Compiled kernels always take the native bf16 path."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: no split heuristics on CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_num_splits(
    programs: int, max_context_len: int, sms: int, tile: int, programs_per_sm: int = 2
) -> int:
    """Splits per sequence so that at least ``programs_per_sm`` programs run per SM, each
    split at least 4 tiles long.

    With ``programs = num_seqs * num_kv_heads`` already that many a single pass is best:
    splitting only adds the merge kernel's traffic.
    """
    if programs >= programs_per_sm * sms:
        return 1
    wanted = math.ceil(programs_per_sm * sms / max(programs, 1))
    longest = math.ceil(max_context_len / (4 * tile))
    return max(1, min(wanted, longest, 64))


def _check_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_lens: torch.Tensor):
    if q.dim() != 3 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q must be [seqs, q_heads, head_dim] and K/V 4-D")
    if k.shape != v.shape:
        raise ValueError(f"K and V shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head_dim of q ({q.shape[-1]}) and K ({k.shape[-1]}) differ")
    if q.shape[1] % k.shape[2]:
        raise ValueError(f"q heads ({q.shape[1]}) not a multiple of KV heads ({k.shape[2]})")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the head_dim axis of q, K and V must be contiguous")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, K, V dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if context_lens.dtype != torch.int32 or context_lens.shape != (q.shape[0],):
        raise ValueError("context_lens must be int32 of shape [num_seqs]")


def _launch(
    q,
    k,
    v,
    block_tables,
    context_lens,
    *,
    paged: bool,
    block_size: int,
    scale: float | None = None,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The launch behind both entry points; the keyword options are the module docstring's."""
    config = config or DecodeConfig()
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_q_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if max_context_len is None:
        max_context_len = int(context_lens.max().item())  # a device sync; pass it to avoid
    max_context_len = max(max_context_len, 1)
    tile = config.tile
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs * num_kv_heads,
            max_context_len,
            num_sms(q.device),
            tile,
            config.programs_per_sm,
        )
    tokens_per_split = math.ceil(math.ceil(max_context_len / num_splits) / tile) * tile
    num_splits = math.ceil(max_context_len / tokens_per_split)
    split = num_splits > 1

    if split:
        part_m = torch.empty(
            (num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(
            (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
    else:
        part_m = part_l = part_acc = out  # unused
    table = block_tables if paged else context_lens  # unused when not paged
    grid = (num_seqs, num_kv_heads, num_splits)
    _decode_attention_kernel[grid](
        out,
        part_m,
        part_l,
        part_acc,
        q,
        k,
        v,
        table,
        context_lens,
        scale * LOG2_E,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        table.stride(0),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        num_splits,
        tokens_per_split,
        GROUP=group,
        GROUP_PAD=max(16, _next_pow2(group)),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, _next_pow2(head_dim)),
        BLOCK_SIZE=block_size,
        TILE=tile,
        PAGED=paged,
        SPLIT=split,
        DOT_IN_FP32=_dot_in_fp32(q.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split:
        _merge_splits_kernel[(num_seqs, num_q_heads)](
            out,
            part_m,
            part_l,
            part_acc,
            out.stride(0),
            out.stride(1),
            num_q_heads,
            num_splits,
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=max(16, _next_pow2(head_dim)),
            SPLITS_PAD=max(2, _next_pow2(num_splits)),
            num_warps=4,
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    **options: Any,
) -> torch.Tensor:
    """Decode attention over a paged KV cache; returns ``[num_seqs, num_q_heads, head_dim]``.

    ``options``: ``scale``, ``max_context_len``, ``num_splits``, ``config``, ``out``
    (keyword only; meanings and defaults in the module docstring).
    """
    _check_common(q, k_cache, v_cache, context_lens)
    block_size = k_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if (
        block_tables.dtype != torch.int32
        or block_tables.dim() != 2
        or block_tables.shape[0] != q.shape[0]
    ):
        raise ValueError("block_tables must be int32 of shape [num_seqs, max_blocks]")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables rows must be contiguous")
    return _launch(
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        paged=True,
        block_size=block_size,
        **options,
    )


def contiguous_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_lens: torch.Tensor, **options: Any
) -> torch.Tensor:
    """The same kernel over per-sequence contiguous K/V ``[num_seqs, max_context, kv_heads, dim]``
    (``options`` as for ``paged_decode_attention``)."""
    _check_common(q, k, v, context_lens)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"contiguous K has {k.shape[0]} sequences, q has {q.shape[0]}")
    return _launch(q, k, v, None, context_lens, paged=False, block_size=1, **options)
