"""GPU block pool on CPU tensors: block copy kernel, copy-on-write, swap round trips."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.gpu_validation.block_copy import copy_blocks  # noqa: E402
from kvsim.gpu_validation.gpu_block_pool import GPUBlockPool, _runs  # noqa: E402
from kvsim.gpu_validation.paged_attention import DecodeConfig, paged_decode_attention  # noqa: E402
from kvsim.gpu_validation.reference import reference_paged_decode_attention  # noqa: E402

LAYERS, BLOCKS, HEADS, DIM = 3, 24, 2, 16


def random_bits_pool(block_size=4, cpu_blocks=16, dtype=torch.float16, seed=0):
    """A pool filled with random bit patterns (NaNs and all): comparisons are byte-exact."""
    pool = GPUBlockPool(
        LAYERS, BLOCKS, block_size, HEADS, DIM, dtype=dtype, device="cpu", num_cpu_blocks=cpu_blocks
    )
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15, pool.kv.shape, generator=g, dtype=torch.int16)
    pool.kv.view(torch.int16).copy_(bits)
    return pool


def raw(t):
    return t.contiguous().view(torch.int16)


def test_views_and_sizes():
    pool = random_bits_pool(block_size=8)
    assert pool.k_cache(1).shape == (BLOCKS, 8, HEADS, DIM)
    assert pool.k_cache(1).data_ptr() == pool.kv[1].data_ptr()
    assert torch.equal(raw(pool.v_cache(2)[5]), raw(pool.kv[2, 5, 1]))
    assert pool.block_bytes == 2 * 8 * HEADS * DIM * 2  # K+V, 8 tokens, fp16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_copy_blocks_kernel_copies_every_layer_and_nothing_else(dtype):
    pool = random_bits_pool(dtype=dtype)
    before = pool.kv.clone()
    src, dst = [3, 7, 0, 11], [20, 1, 15, 9]
    copy_blocks(pool.kv, torch.tensor(src), torch.tensor(dst))
    expected = before.clone()
    expected[:, dst] = before[:, src]
    assert torch.equal(raw(pool.kv), raw(expected))


def test_copy_blocks_rejects_mismatched_lists():
    pool = random_bits_pool()
    with pytest.raises(ValueError, match="equal length"):
        copy_blocks(pool.kv, torch.tensor([1, 2]), torch.tensor([3]))


def test_copy_on_write_moves_only_shared_blocks():
    pool = random_bits_pool()
    blocks = pool.allocate(4)
    pool.share(blocks[:2])  # a fork shares the first two
    content = pool.kv[:, blocks].clone()
    written = pool.copy_on_write(blocks)
    assert written[2:] == blocks[2:]  # exclusive: written in place
    assert set(written[:2]).isdisjoint(blocks)  # shared: fresh copies
    assert torch.equal(raw(pool.kv[:, written]), raw(content))
    for b in blocks[:2]:
        assert pool.blocks.refcount(b) == 1  # the other holder keeps the original
    for b in written:
        assert pool.blocks.refcount(b) == 1
    pool.blocks.check()


@pytest.mark.parametrize("batched", [False, True])
def test_swap_round_trip_is_byte_exact(batched):
    pool = random_bits_pool(seed=1)
    blocks = pool.allocate(5)
    content = pool.kv[:, blocks].clone()
    free_before = pool.blocks.num_free
    host = pool.swap_out(blocks, batched=batched)
    assert pool.blocks.num_free == free_before + 5 and pool.cpu_blocks.num_used == 5
    assert torch.equal(raw(pool.cpu_kv[:, host]), raw(content))
    pool.kv.zero_()  # whatever reuses the freed blocks overwrites them
    back = pool.swap_in(host, batched=batched)
    assert pool.cpu_blocks.num_used == 0
    assert torch.equal(raw(pool.kv[:, back]), raw(content))
    pool.blocks.check()
    pool.cpu_blocks.check()


def test_transfer_counts():
    pool = random_bits_pool()
    dev = [4, 9, 2]
    assert (
        pool.copy_to_host(dev, [0, 1, 2], batched=False) == 2 * LAYERS * 3
    )  # K, V per block per layer
    assert pool.copy_to_host(dev, [2, 0, 1], batched=True) == LAYERS  # one consecutive run
    assert pool.copy_to_host(dev, [0, 5, 6], batched=True) == 2 * LAYERS  # two runs
    assert pool.copy_to_device([0, 5, 6], dev, batched=True) == 2 * LAYERS


def test_batched_swap_with_scattered_host_blocks_is_exact():
    pool = random_bits_pool(seed=2)
    dev, host = [4, 9, 2, 17], [7, 0, 8, 3]  # runs 0, 3, 7-8 after sorting
    pool.copy_to_host(dev, host, batched=True)
    assert torch.equal(raw(pool.cpu_kv[:, host]), raw(pool.kv[:, dev]))
    target = [1, 5, 6, 10]
    pool.copy_to_device(host, target, batched=True)
    assert torch.equal(raw(pool.kv[:, target]), raw(pool.kv[:, dev]))


def test_runs():
    assert _runs([0, 1, 2, 5, 7, 8]) == [(0, 0, 3), (3, 5, 1), (4, 7, 2)]
    assert _runs([3]) == [(0, 3, 1)]


def test_pool_views_feed_the_attention_kernel():
    """K/V views of the pool (block stride spans K and V) work as kernel inputs."""
    pool = GPUBlockPool(2, 12, 4, 2, 16, dtype=torch.float16, device="cpu")
    pool.kv.normal_(generator=torch.Generator().manual_seed(3))
    lens = torch.tensor([10, 3], dtype=torch.int32)
    table = torch.tensor([pool.allocate(3), pool.allocate(1) + [0, 0]], dtype=torch.int32)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(4)).half()
    k, v = pool.k_cache(1), pool.v_cache(1)
    assert not k.is_contiguous()
    out = paged_decode_attention(q, k, v, table, lens, config=DecodeConfig(tile=16))
    ref = reference_paged_decode_attention(q, k, v, table, lens)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-3
