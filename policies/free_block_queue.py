"""vLLM v1's free block queue: one FIFO of every free KV block, cached or not.

vLLM v1 (``vllm/v1/core/block_pool.py``, ``kv_cache_utils.FreeKVCacheBlockQueue``) keeps
no separate list of evictable cached blocks: every block no request holds sits in one
queue. A request frees its blocks to the *tail* (last block first, so its tail is evicted
first); an allocation takes the *head* and, if that block still names cached content,
forgets it there (lazy eviction); a prefix-cache hit on a free block takes it out of the
middle. The queue order is therefore the eviction order.

An ``OrderedDict`` is the queue: appending, popping the oldest entry and deleting any
entry are all O(1), as in vLLM's doubly linked list. (A plain ``dict`` would not do:
popping its first entry over and over scans the holes earlier pops left behind.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator


class FreeBlockQueue:
    """Free block numbers in eviction order (head first)."""

    __slots__ = ("_order",)

    def __init__(self, blocks: Iterable[int] = ()):
        self._order: OrderedDict[int, None] = OrderedDict.fromkeys(blocks)

    def __len__(self) -> int:
        return len(self._order)

    def __bool__(self) -> bool:
        return bool(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def __iter__(self) -> Iterator[int]:
        """Head (next to be taken) first."""
        return iter(self._order)

    def append(self, block: int) -> None:
        """Put a freed block at the tail (taken last)."""
        if block in self._order:
            raise ValueError(f"block {block} is already in the free queue")
        self._order[block] = None

    def extend(self, blocks: Iterable[int]) -> None:
        """Put freed blocks at the tail, in the given order."""
        for b in blocks:
            self.append(b)

    def popleft(self) -> int:
        """Take the block at the head."""
        if not self._order:
            raise IndexError("the free block queue is empty")
        return self._order.popitem(last=False)[0]

    def popleft_many(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head, head first (all or none)."""
        order = self._order
        if count > len(order):
            raise IndexError(f"asked for {count} blocks, {len(order)} in the free queue")
        pop = order.popitem
        return [pop(last=False)[0] for _ in range(count)]

    def remove(self, block: int) -> None:
        """Take a block out of the middle (a prefix-cache hit on a free block)."""
        try:
            del self._order[block]
        except KeyError:
            raise ValueError(f"block {block} is not in the free queue") from None
