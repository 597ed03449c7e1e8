"""vLLM v1's free block queue: one FIFO of every free KV block, cached or not.

vLLM v1 (``vllm/v1/core/block_pool.py``, ``kv_cache_utils.FreeKVCacheBlockQueue``) keeps
no separate list of evictable cached blocks: every block no request holds sits in one
queue. A request frees its blocks to the *tail* (last block first, so its tail is evicted
first); an allocation takes the *head* and, if that block still names cached content,
forgets it there (lazy eviction); a prefix-cache hit on a free block takes it out of the
middle. The queue order is therefore the eviction order.

vLLM's doubly linked list makes each of those O(1) per block, but one Python operation per
block too. Here releasing a whole table, taking ``n`` blocks from the head and taking a
hit's blocks out of the middle are each a few numpy calls (the cost follows the event,
not its blocks)::

    head                                                                     tail
    _fresh: range(a, b)       _buf[_head:_tail]: [ 9, 4, 7, 12, 7, 3 ]  (int32)
    never used, index order   freed, oldest first; the first 7 is dead
    _pos[b] = -2: b is in _fresh;  _pos[b] = i: b's live entry is _buf[i];  -1: not queued

- **Never-used blocks** stay a ``range`` at the head (no prefix hit can name a block never
  used): an unbounded cache's million blocks cost no entry until they are used.
- **Releasing** writes the blocks at the tail and their slots into ``_pos``.
- **A hit out of the middle** only sets ``_pos[b] = -1``: ``b``'s entry stays in the buffer,
  dead. An entry ``_buf[i]`` is live exactly when ``_pos[_buf[i]] == i`` (a block queued
  again gets a new slot), one vectorized comparison for a whole window, so taking from the
  head skips dead entries in bulk.
- When the buffer is full, its live entries move to the front of a buffer at least twice
  their number (amortized O(1) per entry; dead entries never outnumber the buffer's size),
  unless nothing was taken from the head and at most half the entries are dead (an
  unbounded cache's usual case): then the buffer doubles and no entry moves.
  Taking a never-used block out of the middle (tests only: no hit can) first moves the
  range into the buffer.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np

from kvsim.policies.accel.int_runs import BLOCKS, arange, from_numpy, index

IN_FRESH = -2
NOT_QUEUED = -1
MAX_BLOCK = 2**31 - 1
"""Block numbers are stored as 32-bit ints: far more blocks than a GPU pool holds (one H100's
KV cache is about 30k blocks of 16 Llama-3-8B tokens)."""
MIN_CAPACITY = 1024
"""Slots of the first buffer (it grows by doubling)."""
SCALAR_BATCH = 64
"""Releases, takes and hits of at most this many blocks go one block at a time (about 0.1 us
each), larger ones through numpy (a few microseconds a call, then C speed): measured, a
release + hit + take cycle of 8 blocks costs 3x more in numpy, one of 1,000 half as much."""


def _int32s(size: int, fill: int) -> tuple[array, np.ndarray]:
    """``size`` 32-bit ints set to ``fill``: an ``array`` (fast to read and write one item
    from Python) and a numpy view of the same memory (fast for many at once)."""
    store = array("i", [fill]) * size
    return store, np.frombuffer(store, dtype=np.int32) if size else np.zeros(0, dtype=np.int32)


def _as_list(blocks: Iterable[int]) -> list[int] | tuple[int, ...] | np.ndarray:
    """``blocks`` as a sequence: lists, tuples and large numpy arrays (a pool's whole-table
    release) as they are, a few blocks of an array as a list (for the scalar paths)."""
    if isinstance(blocks, np.ndarray):
        return blocks.tolist() if len(blocks) <= SCALAR_BATCH else blocks
    return blocks if isinstance(blocks, (list, tuple)) else list(blocks)


def _plain_ints(blocks: Iterable[int]) -> Iterable[int]:
    """Python ints for a block-at-a-time loop (a pool passes a whole table as a numpy array)."""
    return blocks.tolist() if isinstance(blocks, np.ndarray) else blocks


class FreeBlockQueue:
    """Free block numbers in eviction order (head first): ``_fresh`` (never-used blocks, a
    range) then the live entries of ``_buf[_head:_tail]`` (freed blocks, oldest first); see
    the module docstring for ``_pos`` and dead entries. ``_len``: blocks in the queue.
    ``_buf`` and ``_pos`` are numpy views of the arrays ``_bufa`` and ``_posa``."""

    __slots__ = ("_fresh", "_bufa", "_buf", "_head", "_tail", "_posa", "_pos", "_len")

    def __init__(self, blocks: Iterable[int] = ()):
        self._bufa, self._buf = _int32s(MIN_CAPACITY, 0)
        self._head = self._tail = 0
        if isinstance(blocks, range) and blocks.step == 1 and blocks.start >= 0:
            self._fresh = blocks
            self._posa, self._pos = _int32s(max(blocks.stop, 0), NOT_QUEUED)
            self._pos[blocks.start:blocks.stop] = IN_FRESH
            self._len = len(blocks)
        else:
            self._fresh = range(0)
            self._posa, self._pos = _int32s(0, NOT_QUEUED)
            self._len = 0
            self.extend(blocks)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    @property
    def never_used(self) -> int:
        """Blocks at the head that were never used (taken before any other; none holds content)."""
        return len(self._fresh)

    def __contains__(self, block: int) -> bool:
        return 0 <= block < len(self._posa) and self._posa[block] != NOT_QUEUED

    def __iter__(self) -> Iterator[int]:
        """Head (next to be taken) first."""
        return chain(self._fresh, self._live(self._head, self._tail).tolist())

    def _live(self, start: int, stop: int) -> np.ndarray:
        """The live entries of ``_buf[start:stop]``, in order."""
        seg = index(self._buf[start:stop])
        return seg[self._pos[seg] == np.arange(start, stop, dtype=np.int32)]

    def _index(self, blocks: list[int] | tuple[int, ...]) -> np.ndarray:
        """``blocks`` as an index array into ``_pos``, grown to hold the largest."""
        try:
            idx = index(blocks)
        except (OverflowError, TypeError, ValueError):
            idx = None
        if idx is None or idx.min() < 0:
            raise ValueError(f"block numbers are integers >= 0, got {list(blocks)[:5]}")
        top = int(idx.max())
        if top > MAX_BLOCK:
            raise ValueError(f"block {top} is beyond the queue's 32-bit block numbers (at most {MAX_BLOCK})")
        if top >= len(self._pos):
            store, grown = _int32s(max(top + 1, 2 * len(self._pos)), NOT_QUEUED)
            grown[:len(self._pos)] = self._pos
            self._posa, self._pos = store, grown
        return idx

    def _room(self, count: int) -> None:
        """Make room for ``count`` entries at the tail: move the live entries to the front
        of a buffer with room for at least as many again (module docstring)."""
        if self._tail + count <= len(self._buf):
            return
        tail, size = self._tail, len(self._buf)
        if self._head == 0 and 2 * (self._len - len(self._fresh)) >= tail:
            # nothing taken from the head and at most half the entries dead: no entry moves
            while size < 2 * (tail + count):
                size *= 2
            store, grown = _int32s(size, 0)
            grown[:tail] = self._buf[:tail]
            self._bufa, self._buf = store, grown
            return
        live = self._live(self._head, tail)
        while size < 2 * (len(live) + count):
            size *= 2
        if size != len(self._buf):
            self._bufa, self._buf = _int32s(size, 0)
        self._buf[:len(live)] = live
        self._pos[live] = np.arange(len(live), dtype=np.int32)
        self._head, self._tail = 0, len(live)

    # --- releasing --------------------------------------------------------------------------
    def append(self, block: int) -> None:
        """Put a freed block at the tail (taken last)."""
        pos, tail = self._posa, self._tail
        if not (0 <= block < len(pos) and tail < len(self._bufa)):
            self.extend((block,))  # grows the marks or the buffer, or says what is wrong
            return
        if pos[block] != NOT_QUEUED:
            raise ValueError(f"block {block} is already in the free queue")
        pos[block] = tail
        self._bufa[tail] = block
        self._tail = tail + 1
        self._len += 1

    def extend(self, blocks: Iterable[int]) -> None:
        """Put freed blocks at the tail, in the given order: a few numpy calls for a whole
        table's worth (a request's release is one event, not a call per block)."""
        blocks = _as_list(blocks)
        if not len(blocks):
            return
        if len(blocks) <= SCALAR_BATCH and self._extend_scalar(blocks):
            return
        idx = self._index(blocks)
        pos = self._pos
        if (pos[idx] != NOT_QUEUED).any():
            queued = next(b for b in blocks if b in self)
            raise ValueError(f"block {queued} is already in the free queue")
        self._room(len(idx))
        slots = np.arange(self._tail, self._tail + len(idx), dtype=np.int32)
        pos[idx] = slots
        if (pos[idx] != slots).any():  # a repeated block kept only its last slot
            pos[idx] = NOT_QUEUED
            raise ValueError("a block was given twice: it is already in the free queue")
        self._buf[self._tail:self._tail + len(idx)] = idx
        self._tail += len(idx)
        self._len += len(idx)

    def extend_freed(self, idx: np.ndarray) -> None:
        """``extend`` for blocks a pool has just freed (their holders went to zero): an index
        array of distinct blocks of the pool, none queued. The pool's books vouch for what
        ``extend`` checks, so a whole table costs two numpy writes."""
        n = len(idx)
        if n <= SCALAR_BATCH:
            self.extend(idx)
            return
        self._room(n)
        tail = self._tail
        self._pos[idx] = np.arange(tail, tail + n, dtype=np.int32)
        self._buf[tail:tail + n] = idx
        self._tail = tail + n
        self._len += n

    def _extend_scalar(self, blocks: list[int] | tuple[int, ...]) -> bool:
        """``extend`` a block at a time; False (nothing done) when the marks or the buffer
        must grow first."""
        pos, buf, tail = self._posa, self._bufa, self._tail
        if tail + len(blocks) > len(buf) or not 0 <= min(blocks) <= max(blocks) < len(pos):
            return False
        for i, b in enumerate(blocks):
            if pos[b] != NOT_QUEUED:  # undo, then say why
                for done in blocks[:i]:
                    pos[done] = NOT_QUEUED
                if b in blocks[:i]:
                    raise ValueError("a block was given twice: it is already in the free queue")
                raise ValueError(f"block {b} is already in the free queue")
            pos[b] = tail + i
            buf[tail + i] = b
        self._tail = tail + len(blocks)
        self._len += len(blocks)
        return True

    # --- taking from the head ----------------------------------------------------------------
    def popleft(self) -> int:
        """Take the block at the head."""
        if not self._len:
            raise IndexError("the free block queue is empty")
        fresh = self._fresh
        if not fresh:
            self._len -= 1
            return self._take_live(1)[0]
        self._fresh = fresh[1:]
        self._posa[fresh[0]] = NOT_QUEUED
        self._len -= 1
        return fresh[0]

    def popleft_many(self, count: int) -> array:
        """Take ``count`` blocks from the head, head first (all or none), as an ``array`` of
        block numbers (``policies.accel.int_runs``: a run of never-used blocks costs no int object
        per block)."""
        if count > self._len:
            raise IndexError(f"asked for {count} blocks, {self._len} in the free queue")
        fresh = self._fresh
        part = fresh[:count]
        taken = arange(part.start, part.stop) if len(part) > SCALAR_BATCH else array(BLOCKS, part)
        if part:
            self._fresh = fresh[count:]
            self._pos[part.start:part.stop] = NOT_QUEUED
        need = count - len(part)
        if need > 0:
            taken.extend(self._take_live(need))
        self._len -= count
        return taken

    def _take_live(self, need: int) -> list[int] | array:
        """The first ``need`` live entries from the buffer's head: one by one for a few
        (``SCALAR_BATCH``), else in numpy windows that double until they hold enough (dead
        entries are passed over in bulk)."""
        if need <= SCALAR_BATCH:
            buf, pos, i, taken = self._bufa, self._posa, self._head, []
            while len(taken) < need:  # _len says enough are live before the tail
                b = buf[i]
                if pos[b] == i:
                    pos[b] = NOT_QUEUED
                    taken.append(b)
                i += 1
            self._head = i
            return taken
        head, tail, buf, pos = self._head, self._tail, self._buf, self._pos
        width = need
        while True:
            stop = min(head + width, tail)
            seg = index(buf[head:stop])
            live = np.flatnonzero(pos[seg] == np.arange(head, stop, dtype=np.int32))
            if len(live) >= need or stop == tail:
                break
            width *= 2
        if len(live) < need:
            raise AssertionError("the free queue's count is wrong")  # _len said enough were live
        live = live[:need]
        chosen = seg[live]
        pos[chosen] = NOT_QUEUED
        self._head = head + int(live[-1]) + 1
        return from_numpy(chosen)

    # --- taking out of the middle ------------------------------------------------------------
    def _spill(self) -> None:
        """Move the never-used blocks into the buffer, at the head (before a removal from
        the middle of them)."""
        fresh, live = self._fresh, self._live(self._head, self._tail)
        self._fresh = range(0)
        self._head = self._tail = 0
        both = np.concatenate([np.arange(fresh.start, fresh.stop, dtype=np.int32), live])
        self._room(len(both))
        self._buf[:len(both)] = both
        self._pos[both] = np.arange(len(both), dtype=np.int32)
        self._tail = len(both)

    def _any_fresh(self, idx: np.ndarray) -> bool:
        """Whether any of the blocks ``idx`` is still never used (at C speed)."""
        fresh = self._fresh
        return bool(fresh) and bool(((idx >= fresh.start) & (idx < fresh.stop)).any())

    def remove(self, block: int) -> None:
        """Take a block out of the middle (a prefix-cache hit on a free block)."""
        self.remove_many((block,))

    def remove_many(self, blocks: Iterable[int]) -> None:
        """Take several blocks out of the middle (the free blocks of one prefix hit): their
        entries become dead (all or none)."""
        blocks = _as_list(blocks)
        if not len(blocks):
            return
        if len(blocks) <= SCALAR_BATCH and not self._fresh:
            self._remove_scalar(blocks)
            return
        pos = self._pos
        try:
            idx = index(blocks)
            queued = 0 <= idx.min() and idx.max() < len(pos) and bool((pos[idx] != NOT_QUEUED).all())
        except (OverflowError, TypeError, ValueError):
            queued = False
        if not queued:  # say which
            missing = next(b for b in blocks if b not in self)
            raise ValueError(f"block {missing} is not in the free queue")
        if len(idx) > 1:
            marks, order = pos[idx], np.arange(len(idx), dtype=np.int32)
            pos[idx] = order
            if (pos[idx] != order).any():  # a repeated block kept only its last number
                pos[idx] = marks
                twice = next(b for i, b in enumerate(blocks) if b in blocks[:i])
                raise ValueError(f"block {twice} is not in the free queue (taken out twice)")
        if self._any_fresh(idx):
            self._spill()
        pos[idx] = NOT_QUEUED
        self._len -= len(blocks)

    def remove_reclaimed(self, idx: np.ndarray) -> None:
        """``remove_many`` for free blocks a pool takes back (a prefix hit's, found free by
        its refcounts): an index array of distinct queued blocks. The pool's books vouch
        for what ``remove_many`` checks, so a whole hit costs one numpy write."""
        if len(idx) <= SCALAR_BATCH:
            self.remove_many(idx)
            return
        if self._any_fresh(idx):
            self._spill()
        self._pos[idx] = NOT_QUEUED
        self._len -= len(idx)

    def _remove_scalar(self, blocks: list[int] | tuple[int, ...]) -> None:
        """``remove_many`` a block at a time (no never-used blocks left to spill)."""
        pos, was = self._posa, []
        for b in blocks:
            slot = pos[b] if 0 <= b < len(pos) else NOT_QUEUED
            if slot == NOT_QUEUED:  # undo, then say why
                for done, old in zip(blocks, was):
                    pos[done] = old
                twice = " (taken out twice)" if b in blocks[:len(was)] else ""
                raise ValueError(f"block {b} is not in the free queue{twice}")
            was.append(slot)
            pos[b] = NOT_QUEUED
        self._len -= len(blocks)


class UncachedFirstQueue:
    """The free blocks of a v1 prefix cache under an eviction policy other than vLLM's LRU
    (``allocator.eviction_policy``): free blocks that hold no cached content wait in a
    :class:`FreeBlockQueue` (freed order) and are always taken first, since taking them
    loses nothing; free *cached* blocks are taken only when none is left, in the order of
    an :class:`~policies.indexes.eviction_order.EvictionOrder` over their content keys.

    Why the default ``lru`` keeps vLLM's single queue instead: vLLM v1 (``block_pool.py``,
    ``get_new_blocks`` pops the head of ``FreeKVCacheBlockQueue``) takes whichever block
    has waited longest, cached or not, and the simulator reproduces that exactly.

    The queue knows a block is cached by the owner's ``key_of`` (block -> content key) and
    finds a victim's block by ``block_of`` (content key -> block); the owner files an
    entry's facts (hits, releases) in the order itself. Same interface as
    :class:`FreeBlockQueue`, so :class:`~policies.ledger.block_pool.QueuedBlockPool` drives it.
    """

    __slots__ = ("uncached", "order", "key_of", "block_of")

    def __init__(self, blocks: Iterable[int], order, key_of: dict, block_of: dict):
        self.uncached = FreeBlockQueue(blocks)
        self.order = order
        self.key_of = key_of
        self.block_of = block_of

    def __len__(self) -> int:
        return len(self.uncached) + self.order.num_filed

    @property
    def never_used(self) -> int:
        """Never-used blocks, at the head of the uncached ones (taken first)."""
        return self.uncached.never_used

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
        for b in _plain_ints(blocks):
            self.append(b)

    def extend_freed(self, idx: np.ndarray) -> None:
        """Blocks a pool has just freed: each filed as ``append`` files it."""
        self.extend(idx)

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
        for b in _plain_ints(blocks):
            self.remove(b)

    def remove_reclaimed(self, idx: np.ndarray) -> None:
        """Free blocks a pool takes back: each taken out as ``remove`` takes it."""
        self.remove_many(idx)
