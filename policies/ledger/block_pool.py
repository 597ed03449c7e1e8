"""A pool of equal KV blocks with reference counts: the heart of paged allocation.

The pool knows nothing about sequences: it hands out block numbers, counts how
many holders each block has, and takes a block back when its last holder lets
go. Both the simulator's paged allocator and ``gpu_validation``'s GPU block pool
drive their memory through this one class, so the GPU measurements exercise the
very bookkeeping the simulator models.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence, Sized

import numpy as np

from kvsim.policies.accel.int_runs import index
from kvsim.policies.indexes.free_block_queue import FreeBlockQueue


def checked_sizes(num_blocks: int, block_size: int) -> tuple[int, int]:
    """A pool's block count and block size (tokens), refused when impossible."""
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return num_blocks, block_size

class OutOfBlocks(RuntimeError):
    """Raised when a block is requested and the pool has none free."""


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots each.

    Free blocks sit on a LIFO free list (the most recently freed block is reused
    first, as a real engine's free list does, which keeps hot blocks hot).
    ``refcount[b]`` is the number of holders of block ``b``; a block is free
    exactly when its refcount is 0.
    """

    __slots__ = ("num_blocks", "block_size", "_free", "_refcount", "free_list")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = checked_sizes(num_blocks, block_size)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refcount: list[int] = [0] * num_blocks
        # The free blocks, for hot loops that count them (``len``: no property call).
        # Read-only: change it through the methods.
        self.free_list: Sized = self._free

    # --- queries -----------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    @property
    def refcounts(self) -> Sequence[int]:
        """Every block's refcount, indexed by block: for loops that read many (one attribute
        read instead of a call per block). Read-only: change counts through the methods."""
        return self._refcount

    # --- mutations ---------------------------------------------------------
    def allocate(self) -> int:
        """Take one free block; its refcount becomes 1."""
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use")
        block = self._free.pop()
        self._refcount[block] = 1
        return block

    def allocate_many(self, count: int) -> list[int]:
        """Take ``count`` blocks at once, or none if fewer are free."""
        if count > len(self._free):
            raise OutOfBlocks(f"asked for {count} blocks, {len(self._free)} free")
        free = self._free
        taken = free[len(free) - count :]
        del free[len(free) - count :]
        rc = self._refcount
        for b in taken:
            rc[b] = 1
        taken.reverse()
        return taken

    def share(self, block: int) -> None:
        """Add a holder to a block that is in use (a fork or a prefix hit)."""
        if self._refcount[block] <= 0:
            raise ValueError(f"block {block} is free and cannot be shared")
        self._refcount[block] += 1

    def release(self, block: int) -> bool:
        """Drop one holder; return True when that was the last and the block is free again."""
        rc = self._refcount[block] - 1
        if rc < 0:
            raise ValueError(f"block {block} released more often than held")
        self._refcount[block] = rc
        if rc == 0:
            self._free.append(block)
            return True
        return False

    def free_exclusive(self, blocks: list[int]) -> None:
        """Free blocks the caller knows it holds alone (refcount 1). A plain loop: ~3x
        faster than ``map`` over bound methods for a block table's length (measured)."""
        rc = self._refcount
        for b in blocks:
            if rc[b] != 1:
                raise ValueError(f"free_exclusive got block {b}, which is shared or already free")
        for b in blocks:
            rc[b] = 0
        self._free.extend(blocks)

    def release_all(self, blocks: list[int]) -> list[int]:
        """Drop one holder of each block (a whole block table at once), in the given order;
        return those freed, which join the free list in that order, all at once (one
        update of a queued pool's queue per table)."""
        rc = self._refcount
        freed = []
        for b in blocks:
            r = rc[b] - 1
            if r < 0:
                raise ValueError(f"block {b} released more often than held")
            rc[b] = r
            if not r:
                freed.append(b)
        self._free.extend(freed)
        return freed

    # --- invariants ----------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the pool's books do not balance."""
        free = self._free
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert all(0 <= b < self.num_blocks for b in free), "free list holds a foreign block"
        for b in free:
            assert self._refcount[b] == 0, f"block {b} is free but has refcount {self._refcount[b]}"
        used = sum(1 for r in self._refcount if r > 0)
        assert all(r >= 0 for r in self._refcount), "negative refcount"
        assert used + len(free) == self.num_blocks, "blocks are not conserved"


NUMPY_TABLE = 80
"""Tables and hits of more blocks than this are released or held through numpy (about ten
calls of a few microseconds each, then C speed); smaller ones a block at a time (about 0.1 us
a block). Measured (an allocate, hold, release, release cycle): even at about 70 blocks now
that tables reach numpy as ``array``s without a copy (``policies.accel.int_runs``); it was 256
while they were lists that numpy converted."""


class QueuedBlockPool(BlockPool):
    """A block pool whose free blocks wait in vLLM v1's FIFO free queue (see
    ``policies.indexes.free_block_queue``) instead of a LIFO list: freed blocks join the tail,
    allocations take the head, and a free block can be reclaimed from the middle.

    What a free block *holds* (a cached identity) is its owner's business: the pool
    only orders blocks and counts holders. The books' check is the base pool's.

    Cost: the refcounts are 32-bit ints in an ``array`` (one item read or
    written from Python as fast as a list's, 4 bytes a block instead of a list slot), so
    that a whole block table is released, or a whole prefix hit held, with a few numpy
    calls on a view of the same memory: the work per block is C's, and the Python work
    follows the event (a finish, an admission). Tables of at most ``NUMPY_TABLE`` blocks
    still go a block at a time (a numpy call costs a few microseconds). An unbounded
    cache's never-used blocks cost no Python object each: the queue keeps them a range.
    """

    __slots__ = ()

    def __init__(self, num_blocks: int, block_size: int, queue: FreeBlockQueue | None = None):
        """``queue``: the free blocks' order if not vLLM's FIFO (an
        ``UncachedFirstQueue`` of all ``num_blocks``, for another eviction policy)."""
        self.num_blocks, self.block_size = checked_sizes(num_blocks, block_size)
        # index order, 0 at the head (no list of every block: the queue holds them as a range)
        self._free = queue if queue is not None else FreeBlockQueue(range(num_blocks))  # type: ignore[assignment]
        self._refcount = array("i", [0]) * num_blocks  # type: ignore[assignment]
        self.free_list = self._free

    @property
    def never_used(self) -> int:
        """Free blocks never used yet: ``allocate_many`` takes them first, and none of them
        holds cached content (an owner need not look for any)."""
        return self._free.never_used

    def _counts(self) -> np.ndarray:
        """A numpy view of the refcounts (made per call: a copy of the pool copies the
        ``array``, and a stored view would still point at the original)."""
        return np.frombuffer(self._refcount, dtype=np.int32)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use")
        block = self._free.popleft()
        self._refcount[block] = 1
        return block

    def allocate_many(self, count: int) -> array:  # type: ignore[override]
        """``count`` blocks from the head of the queue, as an ``array`` of block numbers."""
        if count > len(self._free):
            raise OutOfBlocks(f"asked for {count} blocks, {len(self._free)} free")
        taken = self._free.popleft_many(count)  # an array (policies.accel.int_runs)
        if len(taken) > NUMPY_TABLE:
            self._counts()[index(taken)] = 1
        else:
            rc = self._refcount
            for b in taken:
                rc[b] = 1
        return taken

    def reclaim(self, block: int) -> None:
        """Take a particular free block out of the queue (a prefix hit on it): refcount 0 -> 1."""
        self._free.remove(block)
        self._refcount[block] = 1

    def release_all(self, blocks: list[int]) -> list[int]:
        """Drop one holder of each of ``blocks`` (a whole block table, in the order they join
        the queue); return those freed. ``release_table`` without the list of freed blocks."""
        if len(blocks) <= NUMPY_TABLE:
            return super().release_all(blocks)
        return self._release_array(blocks).tolist()

    def release_table(self, blocks: list[int]) -> int:
        """``release_all`` for one table's *distinct* blocks, returning only how many were
        freed (a caller that needs no list of them creates no int object per block)."""
        if len(blocks) <= NUMPY_TABLE:
            return len(super().release_all(blocks))
        return len(self._release_array(blocks))

    def _release_array(self, blocks: list[int]) -> np.ndarray:
        """The numpy release: distinct blocks (a table), so one fancy-indexed write counts
        each once (a repeated block is refused, nothing done)."""
        idx = index(blocks)
        rc = self._counts()
        held = rc[idx]
        if held.min() < 1:
            bad = int(idx[np.argmax(held < 1)])
            raise ValueError(f"block {bad} released more often than held")
        order = np.arange(len(idx), dtype=np.int32)
        rc[idx] = order  # a repeated block keeps only its last number
        if (rc[idx] != order).any():
            rc[idx] = held
            raise ValueError("a block was released twice at once: a table's blocks are distinct")
        left = held - 1
        rc[idx] = left
        freed = idx[left == 0]
        self._free.extend_freed(freed)
        return freed

    def hold(self, blocks: list[int]) -> int:
        """Add a holder to each of ``blocks`` (distinct: the blocks of one prefix hit), taking
        the free ones out of the queue; return how many were free. One call per hit, with
        the queue's removals done together, instead of a ``share`` or ``reclaim`` per block."""
        if len(blocks) > NUMPY_TABLE:
            idx = index(blocks)
            rc = self._counts()
            held = rc[idx]
            free = idx[held == 0]
            if len(free):
                self._free.remove_reclaimed(free)
            rc[idx] = held + 1
            return len(free)
        rc = self._refcount
        free = [b for b in blocks if not rc[b]]
        if free:
            self._free.remove_many(free)
        for b in blocks:
            rc[b] += 1
        return len(free)

    def in_use(self, blocks: list[int]) -> int:
        """How many of ``blocks`` have a holder (the rest wait in the free queue)."""
        if len(blocks) > NUMPY_TABLE:
            return int(np.count_nonzero(self._counts()[index(blocks)]))
        return len(blocks) - list(map(self._refcount.__getitem__, blocks)).count(0)
