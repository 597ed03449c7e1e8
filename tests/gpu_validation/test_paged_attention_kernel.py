"""Decode-attention kernels (Triton interpreter, CPU tensors) against the torch reference."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.gpu_validation.paged_attention import (  # noqa: E402
    DecodeConfig,
    choose_num_splits,
    contiguous_decode_attention,
    paged_decode_attention,
)
from kvsim.gpu_validation.reference import (  # noqa: E402
    reference_contiguous_decode_attention,
    reference_paged_decode_attention,
)

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LENS = [70, 1, 33, 16]  # ragged: longest, single token, odd, exactly one 16-block


def paged_case(block_size, q_heads, kv_heads, head_dim, dtype, seed=0, lens=LENS):
    g = torch.Generator().manual_seed(seed)
    per_seq = math.ceil(max(lens) / block_size)
    num_blocks = len(lens) * per_seq + 5  # spare blocks never referenced
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    # block tables in random order: sequences own scattered, interleaved blocks
    table = torch.randperm(num_blocks, generator=g)[: len(lens) * per_seq].view(len(lens), per_seq)
    q = torch.randn(len(lens), q_heads, head_dim, generator=g).to(dtype)
    return q, k, v, table.to(torch.int32), torch.tensor(lens, dtype=torch.int32)


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize(
    "block_size,q_heads,kv_heads,head_dim,dtype,splits",
    [
        (1, 4, 2, 32, torch.float16, 1),  # GQA 2
        (2, 2, 2, 16, torch.float16, 1),  # MHA
        (4, 8, 1, 32, torch.bfloat16, 1),  # MQA, group 8
        (8, 6, 2, 16, torch.float16, 2),  # group 3: not a power of two
        (16, 4, 2, 32, torch.bfloat16, 3),  # split-KV
        (32, 16, 1, 16, torch.float16, 1),  # group 16 fills tl.dot's 16 rows exactly
        (64, 4, 1, 24, torch.float16, 1),  # head_dim not a power of two
        (256, 2, 1, 16, torch.bfloat16, 4),  # one block longer than any sequence
    ],
)
def test_paged_matches_reference(block_size, q_heads, kv_heads, head_dim, dtype, splits):
    q, k, v, table, lens = paged_case(block_size, q_heads, kv_heads, head_dim, dtype)
    out = paged_decode_attention(
        q, k, v, table, lens, num_splits=splits, config=DecodeConfig(tile=16)
    )
    ref = reference_paged_decode_attention(q, k, v, table, lens)
    assert out.dtype == dtype and out.shape == q.shape
    assert max_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_tile_size_does_not_change_result(tile):
    q, k, v, table, lens = paged_case(4, 4, 2, 16, torch.float16, seed=1)
    ref = reference_paged_decode_attention(q, k, v, table, lens)
    out = paged_decode_attention(q, k, v, table, lens, num_splits=1, config=DecodeConfig(tile=tile))
    assert max_err(out, ref) <= TOL[torch.float16]


def test_split_kv_equals_single_pass():
    q, k, v, table, lens = paged_case(8, 4, 2, 16, torch.float16, seed=2)
    one = paged_decode_attention(q, k, v, table, lens, num_splits=1, config=DecodeConfig(tile=16))
    # 5 splits of 16 tokens: the 1- and 16-token sequences leave most splits empty
    many = paged_decode_attention(q, k, v, table, lens, num_splits=5, config=DecodeConfig(tile=16))
    assert max_err(one, many) <= 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_contiguous_matches_reference_and_paged(dtype):
    q, k, v, table, lens = paged_case(16, 4, 2, 32, dtype, seed=3)
    kc = k[table.long()].flatten(1, 2)  # the same tokens laid out per sequence
    vc = v[table.long()].flatten(1, 2)
    out = contiguous_decode_attention(q, kc, vc, lens, config=DecodeConfig(tile=16))
    ref = reference_contiguous_decode_attention(q, kc, vc, lens)
    paged = paged_decode_attention(q, k, v, table, lens, config=DecodeConfig(tile=16))
    assert max_err(out, ref) <= TOL[dtype]
    assert max_err(out, paged) == 0.0  # same algorithm, same order of operations


def test_single_token_returns_its_value_and_uniform_keys_average():
    """Two facts of softmax attention, independent of any implementation."""
    q, k, v, table, lens = paged_case(4, 2, 1, 16, torch.float16, seed=4, lens=[1, 9])
    k[:] = 0  # equal scores: attention is the plain mean of V
    out = paged_decode_attention(q, k, v, table, lens, config=DecodeConfig(tile=16))
    first = v[table[0, 0].long(), 0, 0]
    assert max_err(out[0], first.expand(2, -1)) <= 1e-3
    tokens = v[table[1].long()].flatten(0, 1)[:9, 0].float()
    assert max_err(out[1], tokens.mean(0).expand(2, -1)) <= 2e-3


def test_rejects_bad_inputs():
    q, k, v, table, lens = paged_case(4, 4, 2, 16, torch.float16)
    with pytest.raises(ValueError, match="power of two"):
        paged_decode_attention(q, k[:, :3], v[:, :3], table, lens)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode_attention(q[:, :3], k, v, table, lens)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_attention(q.float(), k, v, table, lens)
    with pytest.raises(ValueError, match="int32"):
        paged_decode_attention(q, k, v, table.long(), lens)
    with pytest.raises(ValueError, match="tile"):
        DecodeConfig(tile=24)


def test_choose_num_splits():
    assert choose_num_splits(programs=512, max_context_len=8192, sms=132, tile=64) == 1
    few = choose_num_splits(programs=8, max_context_len=8192, sms=132, tile=64)
    assert few == 32  # ceil(8192 / (4 * 64)): each split keeps at least 4 tiles
    assert choose_num_splits(programs=8, max_context_len=100, sms=132, tile=64) == 1
