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


class UncachedFirstQueue:
    """The free blocks of a v1 prefix cache under an eviction policy other than vLLM's LRU
    (``allocator.eviction_policy``): free blocks that hold no cached content wait in a
    :class:`FreeBlockQueue` (freed order) and are always taken first, since taking them
    loses nothing; free *cached* blocks are taken only when none is left, in the order of
    an :class:`~policies.eviction_order.EvictionOrder` over their content keys.

    Why the default ``lru`` keeps vLLM's single queue instead: vLLM v1 (``block_pool.py``,
    ``get_new_blocks`` pops the head of ``FreeKVCacheBlockQueue``) takes whichever block
    has waited longest, cached or not, and the simulator reproduces that exactly.

    The queue knows a block is cached by the owner's ``key_of`` (block -> content key) and
    finds a victim's block by ``block_of`` (content key -> block); the owner files an
    entry's facts (hits, releases) in the order itself. Same interface as
    :class:`FreeBlockQueue`, so :class:`~policies.block_pool.QueuedBlockPool` drives it.
    """

    __slots__ = ("uncached", "order", "key_of", "block_of")

    def __init__(self, blocks: Iterable[int], order, key_of: dict, block_of: dict):
        self.uncached = FreeBlockQueue(blocks)
        self.order = order
        self.key_of = key_of
        self.block_of = block_of

    def __len__(self) -> int:
        return len(self.uncached) + self.order.num_filed

    def __bool__(self) -> bool:
        return len(self) > 0

    def __contains__(self, block: int) -> bool:
        if block in self.uncached:
            return True
        key = self.key_of.get(block)
        entry = self.order.entries.get(key) if key is not None else None
        return entry is not None and entry.filed

    def __iter__(self) -> Iterator[int]:
        """Uncached blocks in taking order, then the cached ones (in no particular order)."""
        yield from self.uncached
        for key, entry in self.order.entries.items():
            if entry.filed:
                yield self.block_of[key]

    def append(self, block: int) -> None:
        """A freed block: cached ones are filed in the eviction order (the owner has
        inserted or touched their entry), the rest join the uncached queue's tail."""
        key = self.key_of.get(block)
        if key is None:
            self.uncached.append(block)
        else:
            self.order.offer(key)

    def extend(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            self.append(b)

    def popleft(self) -> int:
        """An uncached block if any (the oldest freed), else the eviction order's victim
        (the caller forgets its content)."""
        if self.uncached:
            return self.uncached.popleft()
        key = self.order.evict()
        if key is None:
            raise IndexError("the free block queue is empty")
        return self.block_of[key]

    def popleft_many(self, count: int) -> list[int]:
        """``count`` blocks as ``popleft`` takes them one by one (all or none)."""
        if count > len(self):
            raise IndexError(f"asked for {count} blocks, {len(self)} in the free queue")
        taken = self.uncached.popleft_many(min(count, len(self.uncached)))
        for _ in range(count - len(taken)):
            taken.append(self.popleft())
        return taken

    def remove(self, block: int) -> None:
        """A prefix-cache hit on a free cached block takes it back (withdrawn from the order)."""
        if block in self.uncached:
            self.uncached.remove(block)
            return
        key = self.key_of.get(block)
        entry = self.order.entries.get(key) if key is not None else None
        if entry is None or not entry.filed:
            raise ValueError(f"block {block} is not in the free queue")
        self.order.withdraw(key)
