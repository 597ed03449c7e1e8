"""KV blocks in real device memory, allocated by the simulator's own ``policies.BlockPool``.

One preallocated tensor holds every layer's K and V:
``kv[layer, block, 0|1, slot, kv_head, dim]`` (0 = K, 1 = V). ``k_cache(layer)`` and
``v_cache(layer)`` are ``[num_blocks, block_size, num_kv_heads, head_dim]`` views of it,
exactly what ``paged_decode_attention`` takes. Keeping K and V of a block side by side
makes a block of one layer a single contiguous run of bytes, so copy-on-write copies one
run per (block, layer) and a batched swap moves a run of consecutive host blocks of a
layer in one transfer.

Which block numbers are free, shared or held is decided by ``policies.BlockPool`` (one for
device blocks, one for host swap blocks), the very class the simulator's paged allocator
drives: the bytes moved here follow the bookkeeping the simulator models.

Swap has two modes, both timed by the calibration benchmark:

- per block (``batched=False``): one copy per block, per layer, K and V separately, as
  vLLM v0's ``swap_blocks`` issues them: ``2 * layers * blocks`` transfers;
- batched: gather the blocks on the device into a staging tensor (one kernel), then one
  transfer per layer for each run of consecutive host blocks (usually one run).
"""

from __future__ import annotations

import torch

from kvsim.gpu_validation.block_copy import copy_blocks
from kvsim.policies import BlockPool


def _runs(sorted_blocks: list[int]) -> list[tuple[int, int, int]]:
    """``(index, first_block, length)`` for each run of consecutive numbers in a sorted list."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(sorted_blocks) + 1):
        if i == len(sorted_blocks) or sorted_blocks[i] != sorted_blocks[i - 1] + 1:
            runs.append((start, sorted_blocks[start], i - start))
            start = i
    return runs


class GPUBlockPool:
    """Device KV cache of ``num_blocks`` blocks (all layers) plus a host swap space.

    The host space (``num_cpu_blocks`` blocks) is pinned when the device is a CUDA GPU,
    so device<->host copies are asynchronous DMA; on a CPU device it is plain memory and
    every operation still runs (that is how the tests check it byte for byte).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cuda",
        num_cpu_blocks: int = 0,
    ):
        self.device = torch.device(device)
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        block_shape = (2, block_size, num_kv_heads, head_dim)
        self.kv = torch.zeros(
            (num_layers, num_blocks, *block_shape), dtype=dtype, device=self.device
        )
        pin = self.device.type == "cuda"
        self.cpu_kv = torch.zeros(
            (num_layers, num_cpu_blocks, *block_shape), dtype=dtype, pin_memory=pin
        )
        self.blocks = BlockPool(num_blocks, block_size)
        self.cpu_blocks = BlockPool(num_cpu_blocks, block_size)

    # --- views and sizes ----------------------------------------------------------
    def k_cache(self, layer: int) -> torch.Tensor:
        """``[num_blocks, block_size, num_kv_heads, head_dim]`` K of one layer (a view)."""
        return self.kv[layer, :, 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.kv[layer, :, 1]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block's K and V in one layer."""
        return self.kv[0, 0].numel() * self.kv.element_size()

    def _index(self, blocks: list[int]) -> torch.Tensor:
        return torch.tensor(blocks, dtype=torch.int64).to(self.device, non_blocking=True)

    # --- allocation (bookkeeping by policies.BlockPool) ----------------------------
    def allocate(self, count: int) -> list[int]:
        return self.blocks.allocate_many(count)

    def share(self, blocks: list[int]) -> None:
        """Add a holder to each block (a fork: the child shares the parent's blocks)."""
        for b in blocks:
            self.blocks.share(b)

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            self.blocks.release(b)

    # --- copies within the device -------------------------------------------------
    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy ``src[i]`` to ``dst[i]`` in every layer, one kernel launch."""
        copy_blocks(self.kv, self._index(src), self._index(dst))

    def copy_on_write(self, blocks: list[int]) -> list[int]:
        """Make each block exclusively held before a write; returns the blocks to write.

        A block with other holders is copied to a fresh block and this holder moves to
        the copy (one batched copy for all of them); an exclusive block is returned as is.
        """
        src = [b for b in blocks if self.blocks.refcount(b) > 1]
        dst = self.blocks.allocate_many(len(src))
        if src:
            self.copy_blocks(src, dst)
        moved = dict(zip(src, dst))
        for b in src:
            self.blocks.release(b)
        return [moved.get(b, b) for b in blocks]

    # --- transfers to and from the host ------------------------------------------------
    def copy_to_host(
        self, device_blocks: list[int], host_blocks: list[int], *, batched: bool
    ) -> int:
        """Copy device blocks into host blocks (all layers); returns the transfers issued."""
        return self._transfer(device_blocks, host_blocks, batched=batched, to_host=True)

    def copy_to_device(
        self, host_blocks: list[int], device_blocks: list[int], *, batched: bool
    ) -> int:
        """Copy host blocks into device blocks (all layers); returns the transfers issued."""
        return self._transfer(device_blocks, host_blocks, batched=batched, to_host=False)

    def _transfer(
        self, device_blocks: list[int], host_blocks: list[int], *, batched: bool, to_host: bool
    ) -> int:
        """``device_blocks[i]`` <-> ``host_blocks[i]``, all layers, in the direction ``to_host``
        says; returns the transfers issued. One body for both directions: a swap out and a
        swap in are the same copies with source and destination exchanged (the module
        docstring's two modes)."""
        if len(device_blocks) != len(host_blocks):
            raise ValueError("device_blocks and host_blocks differ in length")
        if not device_blocks:
            return 0
        kv, host = self.kv, self.cpu_kv
        if not batched:  # per block, per layer, K and V separately
            src, dst = (kv, host) if to_host else (host, kv)
            moves = list(zip(device_blocks, host_blocks) if to_host else zip(host_blocks, device_blocks))
            for layer in range(self.num_layers):
                for a, b in moves:
                    dst[layer, b, 0].copy_(src[layer, a, 0], non_blocking=True)
                    dst[layer, b, 1].copy_(src[layer, a, 1], non_blocking=True)
            return 2 * self.num_layers * len(device_blocks)
        # Batched: a device staging tensor in host-block order, one transfer per layer and run
        # of consecutive host blocks; the gather (out) or scatter (in) is one kernel.
        pairs = sorted(zip(host_blocks, device_blocks))
        runs = _runs([h for h, _ in pairs])
        index = self._index([d for _, d in pairs])
        if to_host:
            staging = kv.index_select(1, index)
        else:
            staging = torch.empty(
                (self.num_layers, len(pairs), *kv.shape[2:]), dtype=self.dtype, device=self.device
            )
        for layer in range(self.num_layers):
            for i, first, n in runs:
                on_device, on_host = staging[layer, i : i + n], host[layer, first : first + n]
                if to_host:
                    on_host.copy_(on_device, non_blocking=True)
                else:
                    on_device.copy_(on_host, non_blocking=True)
        if not to_host:
            kv.index_copy_(1, index, staging)
        return self.num_layers * len(runs)

    def swap_out(self, blocks: list[int], *, batched: bool = False) -> list[int]:
        """Move blocks to host swap space; frees them on the device, returns the host blocks."""
        host = self.cpu_blocks.allocate_many(len(blocks))
        self.copy_to_host(blocks, host, batched=batched)
        self.free(blocks)
        return host

    def swap_in(self, host_blocks: list[int], *, batched: bool = False) -> list[int]:
        """Move host blocks back to (new) device blocks; frees the host blocks."""
        blocks = self.blocks.allocate_many(len(host_blocks))
        self.copy_to_device(host_blocks, blocks, batched=batched)
        for h in host_blocks:
            self.cpu_blocks.release(h)
        return blocks

    def synchronize(self) -> None:
        """Wait for queued copies (host memory is only safe to read after this on a GPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
