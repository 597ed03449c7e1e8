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

Blocks never taken yet stay a ``range`` at the head, in index order, and enter the dict
only if one is taken out of the middle (no prefix hit can name a block never used): an
unbounded cache's million blocks cost neither memory nor time until they are used, and
freed blocks join the dict's tail, behind them, as in one queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from itertools import chain


class FreeBlockQueue:
    """Free block numbers in eviction order (head first): ``_fresh`` (never-used blocks,
    a range) then ``_order`` (freed blocks, oldest first)."""

    __slots__ = ("_order", "_fresh")

    def __init__(self, blocks: Iterable[int] = ()):
        if isinstance(blocks, range) and blocks.step == 1:
            self._fresh, self._order = blocks, OrderedDict()
        else:
            self._fresh, self._order = range(0), OrderedDict.fromkeys(blocks)

    def __len__(self) -> int:
        return len(self._fresh) + len(self._order)

    def __bool__(self) -> bool:
        return bool(self._fresh) or bool(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._fresh or block in self._order

    def __iter__(self) -> Iterator[int]:
        """Head (next to be taken) first."""
        return chain(self._fresh, self._order)

    def _spill(self) -> None:
        """Move the never-used blocks into the dict, at the head (before a removal from
        the middle of them)."""
        self._order = OrderedDict.fromkeys(chain(self._fresh, self._order))
        self._fresh = range(0)

    def append(self, block: int) -> None:
        """Put a freed block at the tail (taken last)."""
        if block in self:
            raise ValueError(f"block {block} is already in the free queue")
        self._order[block] = None

    def extend(self, blocks: Iterable[int]) -> None:
        """Put freed blocks at the tail, in the given order: one C-level update for a whole
        table's worth (a request's release is one event, not a call per block)."""
        if not isinstance(blocks, (list, tuple)):
            blocks = list(blocks)
        if not blocks:
            return
        order = self._order
        if self._any_fresh(blocks) or not order.keys().isdisjoint(blocks):
            queued = next(b for b in blocks if b in self)
            raise ValueError(f"block {queued} is already in the free queue")
        before = len(order)
        order.update(dict.fromkeys(blocks))
        if len(order) - before != len(blocks):
            raise ValueError("a block was given twice: it is already in the free queue")

    def popleft(self) -> int:
        """Take the block at the head."""
        if self._fresh:
            block = self._fresh[0]
            self._fresh = self._fresh[1:]
            return block
        if not self._order:
            raise IndexError("the free block queue is empty")
        return self._order.popitem(last=False)[0]

    def popleft_many(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head, head first (all or none)."""
        order, fresh = self._order, self._fresh
        if count > len(fresh) + len(order):
            raise IndexError(f"asked for {count} blocks, {len(self)} in the free queue")
        taken = list(fresh[:count])
        self._fresh = fresh[count:]
        pop = order.popitem
        taken += [pop(last=False)[0] for _ in range(count - len(taken))]
        return taken

    def _any_fresh(self, blocks: list[int] | tuple[int, ...]) -> bool:
        """Whether any of ``blocks`` is still never used (at C speed: a block taken lies
        below the never-used range)."""
        fresh = self._fresh
        return bool(fresh and blocks and max(blocks) >= fresh.start and any(map(fresh.__contains__, blocks)))

    def remove(self, block: int) -> None:
        """Take a block out of the middle (a prefix-cache hit on a free block)."""
        self.remove_many((block,))

    def remove_many(self, blocks: Iterable[int]) -> None:
        """Take several blocks out of the middle (the free blocks of one prefix hit)."""
        if not isinstance(blocks, (list, tuple)):
            blocks = list(blocks)
        if self._any_fresh(blocks):
            self._spill()
        order = self._order
        for b in blocks:
            try:
                del order[b]
            except KeyError:
                raise ValueError(f"block {b} is not in the free queue") from None


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

    def remove_many(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            self.remove(b)
