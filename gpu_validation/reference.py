"""Plain torch decode attention: the ground truth the Triton kernels are tested against.

Deliberately naive (a Python loop over sequences, fp32 math, ``repeat_interleave`` for
GQA) so that it is obviously right rather than fast.
"""

from __future__ import annotations

import math

import torch


def gather_paged_kv(
    cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> torch.Tensor:
    """One sequence's ``[context_len, kv_heads, head_dim]`` K (or V) from a paged cache."""
    block_size = cache.shape[1]
    num_blocks = math.ceil(context_len / block_size)
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(num_blocks * block_size, *cache.shape[2:])[:context_len]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention of ``q [q_heads, dim]`` over ``k, v [tokens, kv_heads, dim]`` in fp32."""
    group = q.shape[0] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [tokens, q_heads, dim]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", q.float(), k) * scale
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("ht,thd->hd", weights, v)


def reference_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_decode_attention``; output in ``q.dtype``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q)
    for s, n in enumerate(context_lens.tolist()):
        k = gather_paged_kv(k_cache, block_tables[s], n)
        v = gather_paged_kv(v_cache, block_tables[s], n)
        out[s] = attend_one(q[s], k, v, scale).to(q.dtype)
    return out


def reference_contiguous_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as ``contiguous_decode_attention``; output in ``q.dtype``.

    Contiguous ``k``/``v`` ``[num_seqs, max_context, kv_heads, dim]`` are a paged cache
    whose block ``s`` (``max_context`` tokens) holds all of sequence ``s``: the paged
    reference reads them through that one-block-per-sequence table.
    """
    one_block_each = torch.arange(k.shape[0], dtype=torch.int32, device=k.device)[:, None]
    return reference_paged_decode_attention(q, k, v, one_block_each, context_lens, scale)
