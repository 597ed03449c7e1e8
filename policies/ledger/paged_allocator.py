"""Paged KV allocation (vLLM's PagedAttention): fixed-size blocks, block tables, sharing.

A sequence's KV lives in a list of blocks (its block table); a new block is taken
only when the last one is full, so at most ``block_size - 1`` slots per sequence
are ever allocated ahead of need. Forked sequences share blocks by reference
count; appending to a shared, partly filled last block first copies it
(copy-on-write). Swapping moves a group's distinct blocks to a CPU pool once each,
however many of its sequences share them.

Prefix caching (optional): a full prompt block is identified by the chain of
contents before and including it (a block's identity depends on everything in
front of it, as in vLLM's hash of parent hash + tokens). The cache itself holds
one reference to every block it indexes, so a block whose sequences have all
finished stays valid and reusable; such *unreferenced* cached blocks count as
free and are evicted least-recently-used first when a block is needed (or in another
policy's order, ``eviction``: see ``_take``). (vLLM v1's cache,
one FIFO free queue and no cache reference, is the subclass in ``policies.ledger.v1_prefix_cache``;
``open_seq`` and ``extend`` grow sequences by prefill chunks for the v1 scheduler.)

Lockstep: a decode step appends one slot to every GPU-resident sequence, so a
resident sequence stores its length minus a clock, and sequences are bucketed by
that base modulo the block size: the append from clock ``t`` takes a new block for
exactly the bucket ``-t mod block_size``. A step, or a run of steps, touches only
the sequences that cross a block boundary.

Lazy block tables: while no block is shared (no forks, no prefix cache), which
block a sequence gets is unobservable, so a decode step only *counts* the blocks
it takes (``owed``: held by resident sequences but not yet taken from the pool)
and touches no sequence at all. A table is filled in (its owed blocks taken) only
when something needs its blocks: a swap, a per-sequence append, or ``check``. A
sequence entering the block that holds its final length is found in a heap keyed
by the clock at which that happens, once per lifetime.

Structure: the allocator is the *ledger* (tables, refcounts, copy-on-write, prefix
cache, running totals) and delegates what depends on whether tables are exact to a
strategy object, ``self._tables_mode``::

    PagedAllocator (the ledger) ──> LazyTables   while nothing is shared
                                    ExactTables  from the first share on (fork,
                                                 multi-sequence admit, prefix cache)

The switch happens once, in ``_share``: every table is filled in and the exact
strategy takes over. The strategies are this module's parts, not separate
abstractions: they keep the ledger's books with it and read its fields.
"""

from __future__ import annotations

import copy
import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from operator import mul

from kvsim.policies.indexes.eviction_order import EvictionOrder
from kvsim.policies.indexes.key_chain import chain_keys_plain
from kvsim.policies.kv_allocator import (
    Admission,
    KVAllocator,
    MemoryUsage,
    RunWeights,
    SwapResult,
    final_lengths,
)
from kvsim.policies.ledger.block_pool import BlockPool, OutOfBlocks


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` slots."""
    return -(-tokens // block_size)


def blocks_to_grow(length: int, tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``length`` stored tokens takes to store ``tokens`` more: the
    rule "a new block is taken when the last one is full", in one place. (For one token:
    1 exactly when ``length % block_size == 0``; the lockstep buckets precompute that.)"""
    return -(-(length + tokens) // block_size) - -(-length // block_size)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two block tables (C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    if hi and a[:hi - 1] == b[:hi - 1]:  # the usual case for beams: only the last block differs
        return hi - 1
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PagedAllocator(KVAllocator):
    """``num_blocks`` GPU blocks and ``swap_blocks`` CPU blocks of ``block_size`` slots."""

    shares_memory = True

    def __init__(self, num_blocks: int, block_size: int, swap_blocks: int = 0, prefix_caching: bool = False,
                 eviction: str = "lru"):
        self.pool = self._new_pool(num_blocks, block_size)
        self.cpu_pool = BlockPool(swap_blocks, block_size)
        self.block_size = block_size
        self.capacity = num_blocks * block_size
        self._tables: dict[int, list[int]] = {}  # seq -> GPU blocks, or CPU blocks while swapped
        # Every decode step appends one slot to every GPU-resident sequence, so their
        # lengths move in lockstep: a resident sequence stores kv - clock ("base").
        self._clock = 0  # lockstep appends so far
        self._kv: dict[int, int] = {}  # seq -> base while resident; tokens of KV while swapped
        self._final: dict[int, int] = {}  # seq -> final KV length (classification only)
        self._swapped: set[int] = set()
        # Slots written in each GPU block; for the last block of a sequence it may lag
        # behind (runs of decode steps skip it) until _refresh_fill derives it from kv.
        # A block not in use reads as full, so a table's full blocks need no writes.
        self._filled = [block_size] * num_blocks
        self._cpu_filled = [block_size] * swap_blocks
        self._token_states = 0  # sum of _filled over GPU blocks held by sequences
        self.copied_blocks = 0  # copy-on-write block copies so far
        # prefix cache
        self.prefix_caching = prefix_caching
        self._chain: dict[tuple, int] = {}  # (parent key, content) -> key: interned chain identities
        self._last_keys: tuple[Sequence[Hashable], list[int]] = ((), [])  # the last prompt's (_keys)
        self._cached: dict[int, int] = {}  # key -> GPU block holding that content
        self._key_of: dict[int, int] = {}  # GPU block -> its key
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks no sequence holds, LRU first
        # Another eviction policy than lru: its order over the cached keys (``_evictable`` then
        # only says which blocks are evictable). Clock: one tick per registration, hit, or
        # block becoming evictable.
        self._cache_order = EvictionOrder(eviction, num_blocks) if prefix_caching and eviction != "lru" else None
        self._cache_now = 0
        # Totals over GPU-resident sequences, kept so the hot path never walks all of them.
        self._res_seqs = 0
        self._res_base = 0  # sum of bases: the resident kv total is this + seqs * clock (tokens)
        self._res_blocks = 0  # sum of block-table lengths (a shared block counted per holder)
        self._res_over = 0  # sum of max(0, table slots - final length): slots no token will fill
        # A resident sequence needs a new block at the lockstep append from clock t exactly
        # when (base + t) % block_size == 0: _due[r] holds the sequences with base % B == r.
        self._due: list[dict[int, None]] = [{} for _ in range(block_size)]
        self._room: dict[int, int] = {}  # resident seq -> final length - base (room = this - clock)
        # The least room, which every lockstep step asks for (_least_room), without walking
        # every resident sequence: a heap of (room, seq) whose entry goes stale when its
        # sequence leaves or its room changes (dropped when it surfaces, or in a rebuild).
        self._room_heap: list[tuple[int, int]] = []
        # Lazy tables until the first share; a prefix cache shares from the start.
        self._tables_mode: LazyTables | ExactTables = ExactTables(self) if prefix_caching else LazyTables(self)
        self.prefix_lookups = 0  # cacheable prompt blocks looked up
        self.prefix_hits = 0  # ... and found
        self.evictions = 0
        # Cache tiers below the GPU (``policies.tiers.tier_stack``; vllm-v0 and vllm-v1): the blocks
        # requests loading from a tier hold, and, when the top tier stores what the GPU evicts
        # (``on_evict``), each cached key's (chain parent, priority of the request that named it).
        self._loading: dict[int, tuple[list[int], int]] = {}  # seq -> (hit + fresh blocks, hits)
        self._loading_blocks = 0  # blocks in those tables
        self.on_evict: Callable[[list, list, list], None] | None = None  # (keys, parents, priorities)
        self._meta: dict[Hashable, tuple[Hashable | None, int]] = {}

    def _new_pool(self, num_blocks: int, block_size: int) -> BlockPool:
        """The GPU pool (a subclass with another free-block order builds its own here, so
        no list of every block is built for nothing: a million-block cache's is ~40 MB)."""
        return BlockPool(num_blocks, block_size)

    @property
    def cow_copies(self) -> int:
        return self.copied_blocks

    @property
    def lazy_tables(self) -> bool:
        """Whether block tables are still lazy (nothing has been shared yet)."""
        return self._tables_mode.lazy

    @property
    def owed_blocks(self) -> int:
        """Blocks resident sequences hold beyond their listed tables (lazy tables; else 0)."""
        return self._tables_mode.owed

    # --- totals over GPU-resident sequences ------------------------------------------
    def _held(self, s: int) -> int:
        """Blocks a resident sequence holds: its listed table and any it is owed."""
        return -(-(self._kv[s] + self._clock) // self.block_size)

    def _over(self, s: int) -> int:
        return max(0, self._held(s) * self.block_size - self._final[s])

    def _enter(self, s: int) -> None:
        """Count a GPU-resident sequence (``_kv[s]`` is its base) in the totals."""
        B, base, final = self.block_size, self._kv[s], self._final[s]
        held = -(-(base + self._clock) // B)  # _held(s)
        self._res_seqs += 1
        self._res_base += base
        self._res_blocks += held
        if held * B > final:
            self._res_over += held * B - final
        self._due[base % B][s] = None
        self._room[s] = final - base
        heap = self._room_heap
        heapq.heappush(heap, (final - base, s))
        if len(heap) > 2 * len(self._room) + 64:  # mostly stale (per-sequence appends): rebuild
            self._room_heap = [(r, q) for q, r in self._room.items()]
            heapq.heapify(self._room_heap)
        self._tables_mode.entered(s, held, base, final)

    def _leave(self, s: int) -> None:
        B, base, final = self.block_size, self._kv[s], self._final[s]
        held = -(-(base + self._clock) // B)  # _held(s)
        self._res_seqs -= 1
        self._res_base -= base
        self._res_blocks -= held
        if held * B > final:
            self._res_over -= held * B - final
        del self._due[base % B][s]
        del self._room[s]  # (its room heap entry is now stale)
        self._tables_mode.left(s, held)

    def _least_room(self) -> int:
        """The least room (final length - base) of a resident sequence (one must be
        resident): the lockstep appends the first to reach its final length has left are
        this minus the clock. O(1) amortized, where ``min`` over ``_room`` walks them all."""
        heap, room = self._room_heap, self._room
        least, s = heap[0]
        while room.get(s) != least:  # stale: the sequence left or its room changed since
            heapq.heappop(heap)
            least, s = heap[0]
        return least

    def _fill_in(self, s: int) -> None:
        """Take the blocks a resident sequence is owed into its table (lazy tables; with
        exact tables nothing is owed and this does nothing)."""
        if not self._tables_mode.owed:
            return
        table = self._tables[s]
        owed = self._held(s) - len(table)
        if owed:
            self._filled[table[-1]] = self.block_size  # full now: fresh blocks follow it
            table.extend(self.pool.allocate_many(owed))
            self._tables_mode.owed -= owed

    def _share(self) -> None:
        """Blocks are about to be shared: from now on every table is exact."""
        self._tables_mode = self._tables_mode.exact()

    def resident(self) -> list[int]:
        return list(self._room)

    def resident_kv(self) -> tuple[int, int]:
        return self._res_seqs, self._res_base + self._res_seqs * self._clock

    # --- free blocks, counting unreferenced cached ones ----------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.pool.free_list) + len(self._evictable) - self._tables_mode.owed

    def _take(self) -> int:
        """One block for new content: a free one, else evict the least recently used cached one."""
        pool = self.pool
        if pool.free_list and not self._tables_mode.owed:  # the usual case (a copy per beam fork): one call
            return pool.allocate()
        if self.num_free_blocks <= 0:
            raise OutOfBlocks("no free GPU block (the caller skipped a check)")
        if pool.free_list:
            return pool.allocate()
        if self._cache_order is None:
            block, _ = self._evictable.popitem(last=False)
        else:  # the policy's victim among the evictable cached blocks
            block = self._cached[self._cache_order.evict()]
            del self._evictable[block]
        key = self._key_of.pop(block)
        del self._cached[key]
        self.evictions += 1
        if self.on_evict is not None:  # a tier stores what the GPU evicts (write-back)
            parent, priority = self._meta.pop(key)
            self.on_evict([key], [parent], [priority])
        self.pool.release(block)  # the cache's reference; now free
        self._filled[block] = self.block_size
        return self.pool.allocate()

    def _take_many(self, count: int) -> list[int]:
        if count > self.num_free_blocks:  # (blocks owed to lazy tables are not free)
            raise OutOfBlocks(f"asked for {count} GPU blocks, {self.num_free_blocks} free (the caller skipped a check)")
        if count <= len(self.pool.free_list):
            return self.pool.allocate_many(count)
        return [self._take() for _ in range(count)]

    def _release_gpu(self, table: Sequence[int]) -> None:
        """Drop a table's hold on its GPU blocks; a block freed takes its tokens with it."""
        filled, B = self._filled, self.block_size
        for b in self.pool.release_all(table):
            self._token_states -= filled[b]
            filled[b] = B
        if self._key_of:  # cached blocks that only the cache holds now become evictable
            rc = self.pool.refcounts
            for b in table:
                if rc[b] == 1 and b in self._key_of and b not in self._evictable:
                    self._token_states -= filled[b]
                    self._evictable[b] = None
                    if self._cache_order is not None:  # released now: recency
                        self._cache_now += 1
                        self._cache_order.touch(self._key_of[b], self._cache_now)
                        self._cache_order.offer(self._key_of[b])

    # --- prefix cache ----------------------------------------------------------------
    def prefix_keys(self, prefix: Sequence[Hashable]) -> list[int]:
        """The chain keys of the prompt's leading full blocks (``prefix``: their contents)."""
        return self._keys(prefix)

    def find_prefix(self, prefix: Sequence[Hashable]) -> tuple[list[int], list[int]]:
        """(The chain keys of the prompt's leading full blocks, the cached blocks of their
        longest leading run): what an admission of this prompt would look up and hit."""
        keys = self._keys(prefix)
        return keys, self._hits(keys)

    def _held_hits(self, hits: list[int]) -> int:
        """How many of the cached ``hits`` some sequence holds: they cost no free block (a
        cached block only the cache holds counts as free, and a hit takes it)."""
        return sum(1 for b in hits if b not in self._evictable)

    def _hold_hits(self, hits: list[int]) -> None:
        """Share the cached blocks of a hit: a use of each cached content; one only the
        cache held is revived (no longer free)."""
        pool, filled, order, key_of = self.pool, self._filled, self._cache_order, self._key_of
        for b in hits:
            pool.share(b)
            if order is not None:  # a use of the cached content
                self._cache_now += 1
                order.hit(key_of[b], self._cache_now)
            if b in self._evictable:
                del self._evictable[b]
                self._token_states += filled[b]
                if order is not None:
                    order.withdraw(key_of[b])

    def _cache_block(self, key: int, block: int, parent: int | None, priority: int) -> None:
        """Index full ``block`` under ``key`` (chain ``parent``): the cache holds a reference
        of its own. ``priority``: the namer's, kept when a cache tier stores GPU evictions."""
        self._cached[key] = block
        self._key_of[block] = key
        self.pool.share(block)
        if self._cache_order is not None:
            self._cache_now += 1
            self._cache_order.insert(key, self._cache_now)
        if self.on_evict is not None:
            self._meta[key] = (parent, priority)

    # --- loads from a cache tier below the GPU (policies.tiers.tier_stack, vllm-v0) ------------
    def load_blocks(self, hits: list[int], count: int) -> int:
        """Free blocks a load of ``count`` blocks after the GPU ``hits`` consumes: its fresh
        blocks, and the hits only the cache holds."""
        return count + len(hits) - self._held_hits(hits)

    def start_load(self, seq_id: int, keys: list[int], hits: list[int], count: int) -> None:
        """A request starts loading ``count`` blocks from a cache tier: it holds its GPU
        ``hits`` (a use each, as at admission, and counted as admission counts: the ``keys``
        looked up, the hits found) and ``count`` fresh blocks for the load (full: their KV is
        arriving), under ``seq_id``. The caller checked ``load_blocks`` against the free blocks."""
        self._hold_hits(hits)
        self.prefix_lookups += len(keys)
        self.prefix_hits += len(hits)
        self._hold_for_load(seq_id, hits, count)

    def _hold_for_load(self, seq_id: int, hits: list[int], count: int) -> None:
        """Take ``count`` fresh blocks for a load (full: their KV is arriving) and keep them
        with the ``hits`` already held as ``seq_id``'s loading table (vllm-v0 and vllm-v1)."""
        fresh = self._take_many(count)
        B, filled = self.block_size, self._filled
        for b in fresh:
            filled[b] = B
        self._token_states += count * B
        self._loading[seq_id] = (hits + fresh, len(hits))
        self._loading_blocks += len(hits) + count

    def finish_load(self, seq_id: int, keys: list[int], priority: int = 0) -> None:
        """The load of ``seq_id`` ended: its loaded blocks are cached under ``keys`` (the
        keys after its hits; one cached meanwhile keeps its block, the loaded copy is freed),
        then it lets go of all its blocks, as a finished sequence does: they stay cached."""
        table, h = self._loading.pop(seq_id)
        self._loading_blocks -= len(table)
        parent = self._key_of[table[h - 1]] if h else None
        for key, b in zip(keys, table[h:]):
            if key not in self._cached:
                self._cache_block(key, b, parent, priority)
            parent = key
        self._release_gpu(table)

    def _keys(self, prefix: Sequence[Hashable]) -> list[int]:
        """Chain identities of the prompt's leading full blocks (read-only). The last prompt's
        are kept: a scheduler checks, looks up and admits the same prompt in turn, and a
        prompt's keys never change once interned."""
        last, keys = self._last_keys
        if prefix is not last:
            keys = chain_keys_plain(self._chain, prefix)
            self._last_keys = (prefix, keys)
        return keys

    def _hits(self, keys: list[int]) -> list[int]:
        """Blocks of the longest cached run of leading keys."""
        hits = []
        for k in keys:
            b = self._cached.get(k)
            if b is None:
                break
            hits.append(b)
        return hits

    # --- admission -------------------------------------------------------------
    def _never_fits(self, prompt_len: int, final_len: int, num_seqs: int, wm_blocks: int) -> bool:
        B = self.block_size
        prompt_blocks = blocks_for(prompt_len, B)
        final_blocks = blocks_for(max(final_len, prompt_len), B)
        if num_seqs == 1:
            peak = final_blocks
        else:
            # Each sequence grows on its own past the shared prompt; a partly filled last
            # prompt block is copied by each (counted for all n, as try_append reserves it).
            copies = num_seqs if prompt_len % B else 0
            peak = prompt_blocks + num_seqs * (final_blocks - prompt_blocks) + copies
        return prompt_blocks > self.pool.num_blocks - wm_blocks or peak > self.pool.num_blocks

    def check_admit(self, prompt_len: int, final_len: int | Sequence[int], num_seqs: int, watermark_slots: int,
                    prefix: Sequence[Hashable] = ()) -> Admission:
        wm = watermark_slots // self.block_size
        longest = final_len if isinstance(final_len, int) else max(final_lengths(final_len, num_seqs))
        if self._never_fits(prompt_len, longest, num_seqs, wm):
            return Admission.NEVER
        need = blocks_for(prompt_len, self.block_size)
        if self.prefix_caching and prefix:
            need -= self._held_hits(self._hits(self._keys(prefix)))
        if self.num_free_blocks - need < wm:
            return Admission.NO_SPACE
        return Admission.OK

    def admit(self, seq_ids: Sequence[int], prompt_len: int, final_len: int | Sequence[int],
              prefix: Sequence[Hashable] = (), *, priority: int = 0, counted: bool = True) -> int:
        """Store the prompt once for the group's sequences, sharing the cached blocks of
        its leading run; return the prompt tokens found cached (at least the last one is
        computed). ``priority``: the request's, kept for a cache tier that stores what the
        GPU evicts; ``counted`` False: its lookups and hits were counted already (when its
        load from a cache tier started)."""
        B, pool, filled = self.block_size, self.pool, self._filled
        if len(seq_ids) == 1 and not (self.prefix_caching and prefix):  # the usual case, in short
            s, blocks = seq_ids[0], self._take_many(-(-prompt_len // B))
            filled[blocks[-1]] = prompt_len - (len(blocks) - 1) * B
            self._token_states += prompt_len
            self._tables[s] = blocks
            self._kv[s] = prompt_len - self._clock
            self._final[s] = final_len if isinstance(final_len, int) else final_len[0]
            self._enter(s)
            return 0
        keys = self._keys(prefix) if self.prefix_caching and prefix else []
        hits = self._hits(keys)
        self._hold_hits(hits)
        if counted:
            self.prefix_lookups += len(keys)
            self.prefix_hits += len(hits)
        fresh = self._take_many(blocks_for(prompt_len, B) - len(hits))
        if fresh:  # fresh blocks read as full; only the prompt's last block may be partial
            filled[fresh[-1]] = prompt_len - (len(hits) + len(fresh) - 1) * B
            self._token_states += prompt_len - len(hits) * B
        h = len(hits)
        for i in range(h, min(len(keys), h + len(fresh))):
            if keys[i] not in self._cached:  # (still cached, but its parent was evicted: keep that copy)
                self._cache_block(keys[i], fresh[i - h], keys[i - 1] if i else None, priority)
        blocks = hits + fresh
        if len(seq_ids) > 1:
            self._share()
        for k, (s, final) in enumerate(zip(seq_ids, final_lengths(final_len, len(seq_ids)))):
            if k:
                for b in blocks:
                    pool.share(b)
            self._tables[s] = list(blocks)
            self._kv[s] = prompt_len - self._clock
            self._final[s] = final
            self._enter(s)
        # Prefill must compute at least the last prompt token to sample the first output.
        return min(len(hits) * B, prompt_len - 1)

    # --- growth and sharing ---------------------------------------------------------
    def try_append(self, seq_ids: Sequence[int]) -> bool:
        """One slot for each of ``seq_ids`` (the per-sequence path: group by group under
        memory pressure, after a swap-in, or past a sequence's final length)."""
        B, clock, kv, tables = self.block_size, self._clock, self._kv, self._tables
        filled, final, refcount = self._filled, self._final, self.pool.refcounts
        # Blocks one more token takes for each: a new block when its last is full, else a
        # private copy when its partly filled last block is shared.
        takes = 0
        for s in seq_ids:
            if blocks_to_grow(kv[s] + clock, 1, B) or refcount[tables[s][-1]] > 1:
                takes += 1
        if takes > self.num_free_blocks:
            return False
        for s in seq_ids:
            self._fill_in(s)
            self._leave(s)
            n = kv[s] + clock
            off = n % B
            table = tables[s]
            if off == 0:
                block = self._take()
                self._grow(s, block)
            else:
                block = table[-1]
                if refcount[block] > 1:
                    block = self._copy_last(table, off)
            filled[block] = off + 1
            kv[s] += 1
            if n + 1 > final[s]:  # outgrew the length it was admitted with: its final is its length
                final[s] = n + 1
            self._enter(s)
        self._token_states += len(seq_ids)
        return True

    # --- chunked prefill (vLLM v1): sequences grow by any number of tokens --------------
    def open_seq(self, seq_id: int, cached: list[int], tokens: int, final_len: int) -> None:
        """Make ``seq_id`` resident holding ``tokens`` slots of KV: the blocks in ``cached``
        (prefix hits the caller already took, full), then fresh blocks for the rest (the
        caller checked there are enough). ``tokens`` reaches past ``cached``: at least one
        token is computed, so the last block is always the sequence's own."""
        B = self.block_size
        fresh = self._take_many(-(-tokens // B) - len(cached))
        assert fresh, "a sequence computes at least one token past its cached blocks"
        self._filled[fresh[-1]] = tokens - (len(cached) + len(fresh) - 1) * B
        self._token_states += tokens - len(cached) * B
        self._tables[seq_id] = cached + fresh if cached else fresh  # (a v1 cache's: arrays, policies.accel.int_runs)
        self._kv[seq_id] = tokens - self._clock
        self._final[seq_id] = final_len
        self._enter(seq_id)

    def blocks_to_extend(self, seq_id: int, tokens: int) -> int:
        """Blocks ``extend(seq_id, tokens)`` would take."""
        return blocks_to_grow(self._kv[seq_id] + self._clock, tokens, self.block_size)

    def extend(self, seq_id: int, tokens: int) -> bool:
        """Add ``tokens`` slots to a resident sequence, all or nothing; False if memory is
        short. (A v1 sequence's last block is never shared, so nothing is copied.)"""
        need = self.blocks_to_extend(seq_id, tokens)
        if need > self.num_free_blocks:
            return False
        self._fill_in(seq_id)
        self._leave(seq_id)
        B, table = self.block_size, self._tables[seq_id]
        if need:
            self._filled[table[-1]] = B  # full now: fresh blocks follow it
            table.extend(self._take_many(need))
        self._kv[seq_id] += tokens
        self._filled[table[-1]] = self._kv[seq_id] + self._clock - (len(table) - 1) * B
        self._token_states += tokens
        self._enter(seq_id)
        return True

    def extend_all(self, chunks: Sequence[tuple[int, int]] = ()) -> bool:
        """One slot for every resident sequence, and for each ``(seq, tokens)`` of ``chunks``
        ``tokens`` in all (a prefill chunk), all or nothing: False, and nothing done, when
        the free blocks do not hold it all. The lockstep path does the one slot each; only
        the chunks' sequences are touched one by one."""
        B, clock, kv = self.block_size, self._clock, self._kv
        crossing = self._due[-clock % B]
        need = len(crossing) + len(self._pending_copies())
        for s, tokens in chunks:  # blocks beyond the one slot's
            need += blocks_to_grow(kv[s] + clock, tokens, B) - (s in crossing)
        if need > self.num_free_blocks:
            return False
        appended = self.try_append_all()
        assert appended, "the free blocks were counted"
        for s, tokens in chunks:
            if tokens > 1:
                grown = self.extend(s, tokens - 1)
                assert grown, "the free blocks were counted"
        return True

    def _copy_last(self, table: list[int], off: int) -> int:
        """Copy-on-write: replace a shared, partly filled (``off`` slots) last block by a private copy."""
        copy = self._take()
        self._filled[copy] = off
        self._token_states += off
        self.pool.release(table[-1])  # others still hold it
        table[-1] = copy
        self.copied_blocks += 1
        return copy

    def _grow(self, s: int, block: int) -> int:
        """Append a fresh block to a resident sequence's table (its old last block is full
        now); return the slots past its final length it brings."""
        table = self._tables[s]
        self._filled[table[-1]] = self.block_size
        table.append(block)
        return max(0, len(table) * self.block_size - self._final[s])

    def _pending_copies(self) -> list[int]:
        """Resident sequences whose next append copies their shared, partly filled last block."""
        return self._tables_mode.pending_copies()

    def try_append_all(self) -> bool:
        room = self._room
        if not room:
            return True
        if self._least_room() - self._clock < 1:  # someone outgrows its final length
            return self.try_append(list(room))
        crossing = self._due[-self._clock % self.block_size]
        if not self._tables_mode.append_all(crossing):
            return False
        self._res_blocks += len(crossing)
        self._clock += 1
        self._token_states += self._res_seqs
        return True

    def fork(self, parent: int, child: int, child_final_len: int) -> None:
        self._share()
        table = self._tables[parent]
        for b in table:
            self.pool.share(b)
        self._tables[child] = list(table)
        self._kv[child] = self._kv[parent]  # both resident: same base
        self._final[child] = child_final_len
        self._enter(child)

    def fork_into(self, parent: int, target: int, target_final_len: int) -> None:
        """Beams share their history: only the blocks after the tables' common prefix
        change hands (the prefix keeps its references), not the whole table."""
        if self._tables_mode.lazy:  # (beams fork every step: no call once tables are exact)
            self._share()
        kv, final = self._kv, self._final
        old, new = self._tables[target], self._tables[parent]
        same = common_prefix(old, new)
        # Beams have one length and one target: then the resident totals do not move.
        moves = kv[target] != kv[parent] or final[target] != target_final_len
        if moves:
            self._leave(target)
        self._refresh_fill(target)
        self._release_gpu(old[same:])
        share = self.pool.share
        for b in new[same:]:
            share(b)
        old[same:] = new[same:]  # the target's table becomes a copy of the parent's
        if moves:
            kv[target] = kv[parent]  # both resident: same base
            final[target] = target_final_len
            self._enter(target)

    def free(self, seq_id: int) -> None:
        if seq_id in self._swapped:
            self._swapped.discard(seq_id)
            for b in self._tables.pop(seq_id):
                if self.cpu_pool.release(b):
                    self._cpu_filled[b] = self.block_size
        else:
            self._leave(seq_id)
            self._tables_mode.free_resident(seq_id)
        del self._kv[seq_id], self._final[seq_id]

    # --- swapping -------------------------------------------------------------------
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return self._tables_mode.distinct_blocks(seq_ids) <= self.cpu_pool.num_free

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult:
        for s in seq_ids:
            self._fill_in(s)
            self._leave(s)
            self._refresh_fill(s)
            self._kv[s] += self._clock  # frozen while swapped: store its length
        moved = self._move(seq_ids, self.pool, self.cpu_pool, self._filled, self._cpu_filled)
        self._swapped.update(seq_ids)
        return moved

    def check_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> Admission:
        need = self._tables_mode.distinct_blocks(seq_ids)
        wm = watermark_slots // self.block_size
        if need > self.pool.num_blocks - wm:
            return Admission.NEVER
        if self.num_free_blocks - need < wm:
            return Admission.NO_SPACE
        return Admission.OK

    def swap_in(self, seq_ids: Sequence[int]) -> SwapResult:
        moved = self._move(seq_ids, self.cpu_pool, self.pool, self._cpu_filled, self._filled)
        self._swapped.difference_update(seq_ids)
        for s in seq_ids:
            self._kv[s] -= self._clock
            self._enter(s)
        return moved

    def _move(self, seq_ids, src: BlockPool, dst: BlockPool, src_filled, dst_filled) -> SwapResult:
        """Copy a group's distinct blocks from ``src`` to ``dst``, keeping their sharing."""
        mapping: dict[int, int] = {}
        slots = 0
        to_gpu = dst is self.pool
        for s in seq_ids:
            table = self._tables[s]
            for i, b in enumerate(table):
                new = mapping.get(b)
                if new is None:
                    new = mapping[b] = self._take() if to_gpu else dst.allocate()
                    dst_filled[new] = src_filled[b]
                    slots += src_filled[b]
                    if to_gpu:
                        self._token_states += src_filled[b]
                else:
                    dst.share(new)
                table[i] = new
                if to_gpu:
                    if src.release(b):
                        src_filled[b] = self.block_size
                else:
                    self._release_gpu((b,))
        return SwapResult(blocks=len(mapping), slots=slots)

    # --- runs of identical decode steps ------------------------------------------------
    def max_advance_all(self, limit: int) -> int:
        """Largest k <= limit: enough free blocks for k lockstep appends, no sequence
        past its final length, and no copy-on-write pending (else 0)."""
        room = self._room
        if limit <= 0 or not room:
            return 0
        B, c0 = self.block_size, self._clock
        k_max = self._least_room() - c0
        if limit < k_max:
            k_max = limit
        if k_max <= 0 or (not self._tables_mode.lazy and self._pending_copies()):  # lazy: nothing shared
            return 0
        # B consecutive appends take exactly one block per sequence.
        free, n, due = self.num_free_blocks, self._res_seqs, self._due
        full = min(k_max // B, free // n)
        k, used = full * B, full * n
        stop = k + B if k + B < k_max else k_max
        if used + n <= free:  # fewer than B more appends take at most one block each
            return stop
        while k < stop:
            crossing = len(due[-(c0 + k) % B])
            if used + crossing > free:
                break
            used += crossing
            k += 1
        return k

    def advance_all(self, run: RunWeights, now: MemoryUsage | None = None) -> MemoryUsage:
        """Apply ``run.steps`` lockstep appends; integrate the classes in closed form.

        The strategy grows the tables (lazy: counts blocks from the buckets' sizes,
        O(block_size); exact: visits only sequences that cross a block boundary). Each
        new block adds ``block_size`` allocated slots from its iteration on; a sequence
        entering the block that holds its final length turns the slots past it into
        internal fragmentation. ``now``: ``usage()``, if the caller already has it.
        """
        k, B = run.steps, self.block_size
        start = now if now is not None else self.usage()
        D = run.total
        block_seconds, taken, over_added, over_seconds = self._tables_mode.grow_run(run)
        n = self._res_seqs
        self._clock += k
        self._token_states += n * k
        self._res_blocks += taken
        self._res_over += over_added
        ramp = run.ramp
        token_states = start.token_states * D + n * ramp
        reserved = start.reserved * D + B * block_seconds - n * ramp - over_seconds
        free = start.free * D - B * block_seconds
        # (capacity, token_states, reserved, internal_frag, free, unshared): positional, as
        # one is built per run
        return MemoryUsage(self.capacity * D, token_states, reserved,
                           self.capacity * D - token_states - reserved - free, free,
                           start.unshared * D + B * block_seconds)

    def _refresh_fill(self, s: int) -> None:
        """Write the fill of a resident sequence's last block (lockstep appends leave it stale)."""
        table = self._tables[s]
        if table:
            self._filled[table[-1]] = self._kv[s] + self._clock - (len(table) - 1) * self.block_size

    # --- observation -----------------------------------------------------------------
    def kv_len(self, seq_id: int) -> int:
        kv = self._kv[seq_id]
        return kv if seq_id in self._swapped else kv + self._clock

    def free_slots(self) -> int:
        return self.num_free_blocks * self.block_size

    def usage(self) -> MemoryUsage:
        u = self._tables_mode.usage()
        if self._loading_blocks:  # held for loads from a cache tier: unshared slots, as in a table
            u.unshared += self._loading_blocks * self.block_size
        return u

    def _usage_totals(self, free_blocks: int) -> MemoryUsage:
        """Usage from the running totals, in O(1): right whenever every allocated slot past
        a sequence's tokens is its own (its reservation, or past its final length), i.e.
        no partly filled last block is shared. ``free_blocks``: ``num_free_blocks``, which
        the caller may know more cheaply (this runs every step)."""
        B = self.block_size
        free = free_blocks * B
        reserved = self._res_blocks * B - self._res_base - self._res_seqs * self._clock - self._res_over
        return MemoryUsage(self.capacity, self._token_states, reserved,
                           self.capacity - free - self._token_states - reserved, free, self._res_blocks * B)

    def _usage_walk(self) -> MemoryUsage:
        """Usage from every block table: exact with shared blocks (a shared partial last
        block is filled by a copy, so its empty slots are nobody's reservation)."""
        B = self.block_size
        rc, key_of = self.pool.refcounts, self._key_of
        reserved = unshared = 0
        tables, final, kv, clock = self._tables, self._final, self._kv, self._clock
        for s in self._room:  # the GPU-resident sequences
            table = tables[s]
            n = len(table)
            unshared += n
            # Only an exclusively held last block will be filled by this sequence itself.
            last = table[-1]
            if rc[last] == 1 or (rc[last] == 2 and last in key_of):
                f = final[s]
                ahead = (n * B if n * B < f else f) - kv[s] - clock
                if ahead > 0:
                    reserved += ahead
        free = self.num_free_blocks * B
        allocated = self.capacity - free
        return MemoryUsage(
            capacity=self.capacity,
            token_states=self._token_states,
            reserved=reserved,
            internal_frag=allocated - self._token_states - reserved,
            free=free,
            unshared=unshared * B,
        )

    def check(self) -> None:
        resident = [s for s in self._tables if s not in self._swapped]
        owed = {s: self._held(s) - len(self._tables[s]) for s in resident}
        assert min(owed.values(), default=0) >= 0, "a table lists more blocks than its sequence holds"
        assert self._tables_mode.owed == sum(owed.values()), "owed block total drifted"
        self._tables_mode.check(resident)
        if self._tables_mode.owed:  # check the books block by block on a twin whose owed blocks are taken
            twin = copy.deepcopy(self)
            for s in resident:
                twin._fill_in(s)
            twin._check_blocks(resident)
        else:
            self._check_blocks(resident)

    def _check_blocks(self, resident: list[int]) -> None:
        for s in resident:
            self._refresh_fill(s)
        self.pool.check()
        self.cpu_pool.check()
        gpu_refs = [0] * self.pool.num_blocks
        cpu_refs = [0] * self.cpu_pool.num_blocks
        for s, table in self._tables.items():
            refs = cpu_refs if s in self._swapped else gpu_refs
            for b in table:
                refs[b] += 1
            assert blocks_for(self.kv_len(s), self.block_size) == len(table), f"seq {s}: table length"
            assert self.kv_len(s) <= self._final[s], f"seq {s}: longer than its final length"
        for key, b in self._cached.items():
            assert self._key_of[b] == key, f"cache index of block {b} is inconsistent"
            gpu_refs[b] += 1  # the cache's own reference
        assert len(self._key_of) == len(self._cached)
        for table, _ in self._loading.values():  # held by requests loading from a cache tier
            for b in table:
                gpu_refs[b] += 1
        assert self._loading_blocks == sum(len(t) for t, _ in self._loading.values()), "loading block count drifted"
        if self.on_evict is not None:
            assert self._meta.keys() == self._cached.keys(), "a cached key's parent and priority are not kept"
        for b in self._evictable:
            assert b in self._key_of and self.pool.refcount(b) == 1, f"evictable block {b} is still held"
        if self._cache_order is not None:
            self._cache_order.check()
            assert set(self._cache_order.entries) == set(self._cached), "the eviction order's keys are not the cache's"
            filed = {self._cached[k] for k, e in self._cache_order.entries.items() if e.filed}
            assert filed == set(self._evictable), "the eviction order's evictable blocks are not the cache's"
        for b in range(self.pool.num_blocks):
            assert gpu_refs[b] == self.pool.refcount(b), f"GPU block {b}: refcount is not exact"
        for b in range(self.cpu_pool.num_blocks):
            assert cpu_refs[b] == self.cpu_pool.refcount(b), f"CPU block {b}: refcount is not exact"
        held = [gpu_refs[b] - (b in self._key_of) for b in range(self.pool.num_blocks)]
        assert sum(1 for b, h in enumerate(held) if h == 0 and b in self._key_of) == len(self._evictable)
        in_use = sum(self._filled[b] for b in range(self.pool.num_blocks) if held[b] > 0)
        assert in_use == self._token_states, "token_states drifted from the blocks' contents"
        assert self._res_seqs == len(resident), "resident sequence count drifted"
        assert self._res_base == sum(self._kv[s] for s in resident), "resident kv total drifted"
        for s in resident:
            base = self._kv[s]
            assert s in self._due[base % self.block_size], f"seq {s} is not due where its length says"
            assert self._room[s] == self._final[s] - base, f"seq {s}: room drifted"
        heaped = {(s, r) for r, s in self._room_heap}
        assert all(entry in heaped for entry in self._room.items()), "a resident sequence's room is not in the heap"
        assert not self._room or self._least_room() == min(self._room.values()), "least room drifted"
        assert sum(map(len, self._due)) == len(self._room) == len(resident), "due buckets drifted"
        assert self._res_blocks == sum(len(self._tables[s]) for s in resident), "resident block total drifted"
        assert self._res_over == sum(self._over(s) for s in resident), "over-final total drifted"
        walk = self._usage_walk()
        walk.unshared += self._loading_blocks * self.block_size
        assert self.usage() == walk, "incremental usage disagrees with the tables"
        self.usage().check()


class ExactTables:
    """Every table lists every block its sequence holds: the plain ledger's way, used
    from the first share on (and from the start with a prefix cache)."""

    lazy = False
    owed = 0  # blocks held beyond the listed tables: none, ever

    def __init__(self, alloc: PagedAllocator):
        self.alloc = alloc

    def exact(self) -> ExactTables:
        return self

    def entered(self, s: int, held: int, base: int, final: int) -> None:
        """A sequence became resident (totals already counted): nothing more to keep."""

    def left(self, s: int, held: int) -> None:
        """A sequence stopped being resident: nothing more to keep."""

    def pending_copies(self) -> list[int]:
        a = self.alloc
        B, clock, kv, rc, tables = a.block_size, a._clock, a._kv, a.pool.refcounts, a._tables
        return [s for s in a._room if (kv[s] + clock) % B and rc[tables[s][-1]] > 1]

    def append_all(self, crossing: dict[int, None]) -> bool:
        """The lockstep append's blocks: copies of shared partial last blocks, then a new
        block for each sequence of ``crossing`` (the due bucket); False if too few are free."""
        a = self.alloc
        copies = a._pending_copies()
        if len(crossing) + len(copies) > a.num_free_blocks:
            return False
        tables, rc, B = a._tables, a.pool.refcounts, a.block_size
        for s in copies:
            table = tables[s]
            if rc[table[-1]] > 1:  # the last holder of a shared block keeps it
                a._copy_last(table, (a._kv[s] + a._clock) % B)
        # A crossing sequence had no slots past its final length: its last block was full.
        a._res_over += sum(map(a._grow, crossing, a._take_many(len(crossing))))
        return True

    def grow_run(self, run: RunWeights) -> tuple[float, int, int, float]:
        """Extend the tables of the sequences a run's appends take blocks for; return
        the blocks' block-seconds (s), how many, and the slots past final lengths they
        bring with those slots' seconds."""
        a = self.alloc
        k, B, D, due = run.steps, a.block_size, run.total, a._due
        # Iteration j (and j + B, ...) takes a block for each sequence of bucket (c0 + j - 1) % B
        # counted backwards: the buckets in the order the run reaches them.
        r0 = -a._clock % B
        order = (due[r0::-1] + due[:r0:-1])[:min(k, B)]
        crossing = [(j, bucket) for j, bucket in enumerate(order, 1) if bucket]
        taken = sum(len(bucket) * ((k - j) // B + 1) for j, bucket in crossing)
        fresh = a._take_many(taken)  # fresh blocks read as full
        at = 0
        block_seconds = 0.0  # sum over new blocks of how long they are held during the run (s)
        over_seconds = 0.0  # sum over slots past final lengths of how long (s)
        over_added = 0
        # The hot loop: it does what _grow does, inline (a call per crossing costs ~75% here).
        tables, filled, final = a._tables, a._filled, a._final
        for j, bucket in crossing:
            m = (k - j) // B + 1  # blocks each sequence of the bucket takes
            if m == 1:
                last_tail = D - run.elapsed(j - 1)  # = run.tail(j) = run.tails(j, B, 1)
                block_seconds += len(bucket) * last_tail
            else:
                block_seconds += len(bucket) * run.tails(j, B, m)
                last_tail = run.tail(j + (m - 1) * B)
            for s in bucket:
                table = tables[s]
                filled[table[-1]] = B  # the old last block is full now
                if m == 1:
                    table.append(fresh[at])
                else:
                    table.extend(fresh[at:at + m])
                at += m
                over = len(table) * B - final[s]
                if over > 0:  # only its last crossing can reach past the final length
                    over_added += over
                    over_seconds += over * last_tail
        return block_seconds, taken, over_added, over_seconds

    def free_resident(self, s: int) -> None:
        """Release a resident sequence's blocks (it has left the totals)."""
        a = self.alloc
        a._refresh_fill(s)
        a._release_gpu(a._tables.pop(s))

    def distinct_blocks(self, seq_ids: Sequence[int]) -> int:
        """Blocks a group holds, each shared block once (what a swap moves)."""
        tables = self.alloc._tables
        return len({b for s in seq_ids for b in tables[s]})

    def usage(self) -> MemoryUsage:
        return self.alloc._usage_walk()

    def check(self, resident: list[int]) -> None:
        assert not self.owed, "exact tables owe no blocks"


class LazyTables:
    """While nothing is shared: tables may lag behind, and the lockstep path counts the
    blocks it takes (``owed``) instead of listing them (see the module docstring)."""

    lazy = True

    def __init__(self, alloc: PagedAllocator):
        self.alloc = alloc
        self.owed = 0  # blocks resident sequences hold beyond their listed tables
        self.heap: list[tuple[int, int]] = []  # (clock of the append taking its last block, seq)
        self.last_block_at: dict[int, int] = {}  # seq -> that clock, for the heap's live entries
        self.squares = [r * r for r in range(alloc.block_size)]

    def exact(self) -> ExactTables:
        """Blocks are about to be shared: fill in every table and hand over."""
        a = self.alloc
        for s in a._room:
            a._fill_in(s)
        return ExactTables(a)

    def entered(self, s: int, held: int, base: int, final: int) -> None:
        a = self.alloc
        B = a.block_size
        self.owed += held - len(a._tables[s])
        last = -(-final // B)  # blocks at its final length
        at = (last - 1) * B - base  # the append from this clock takes the last of them
        if at >= a._clock and last * B > final:
            self.last_block_at[s] = at
            heapq.heappush(self.heap, (at, s))

    def left(self, s: int, held: int) -> None:
        self.owed -= held - len(self.alloc._tables[s])
        self.last_block_at.pop(s, None)

    def pending_copies(self) -> list[int]:
        return []  # nothing is shared

    def append_all(self, crossing: dict[int, None]) -> bool:
        a = self.alloc
        if len(crossing) > len(a.pool.free_list) - self.owed:  # (no evictable blocks without a prefix cache)
            return False
        self.owed += len(crossing)
        heap = self.heap
        if heap and heap[0][0] <= a._clock:
            a._res_over += self.enter_last_blocks(a._clock + 1)[0]
        return True

    def enter_last_blocks(self, end: int, run: RunWeights | None = None) -> tuple[int, float]:
        """Sequences whose append from a clock before ``end`` takes the block holding their
        final length; return the slots past final lengths that brings and (for a ``run``
        starting at the current clock) their slot-seconds in it."""
        a = self.alloc
        heap, at_of, final, B, c0 = self.heap, self.last_block_at, a._final, a.block_size, a._clock
        over_added, over_seconds = 0, 0.0
        while heap and heap[0][0] < end:
            at, s = heapq.heappop(heap)
            if at_of.get(s) != at:  # stale: it left (and maybe came back) since
                continue
            del at_of[s]
            over = -(-final[s] // B) * B - final[s]
            over_added += over
            if run is not None:
                over_seconds += over * run.tail(at - c0 + 1)
        return over_added, over_seconds

    def grow_run(self, run: RunWeights) -> tuple[float, int, int, float]:
        """What ``ExactTables.grow_run`` returns, from the buckets' sizes alone.

        Iteration j + 1 (and j + 1 + B, ...) takes a block for each sequence of bucket
        ``(clock + j) % B`` counted backwards, i.e. ``due[-clock % B - j]``; that block
        is held for ``total - elapsed(j)`` seconds. With ``steps = q B + r``, the
        buckets reached at j < r take q + 1 blocks each and the others q.
        """
        a = self.alloc
        B, due, c0 = a.block_size, a._due, a._clock
        r0 = -c0 % B
        q, r = divmod(run.steps, B)
        if not q:  # the usual short run: a block per sequence of each bucket reached
            n0 = n1 = n2 = 0  # sums of c, c j and c j (j - 1) over buckets of c sequences
            for j in range(r):
                c = len(due[r0 - j])
                if c:
                    n0 += c
                    n1 += c * j
                    n2 += c * j * (j - 1)
            block_seconds, taken = run.total * n0 - run.first * n1 - run.slope / 2 * n2, n0
        else:
            sizes = [len(due[r0 - j]) for j in range(B)]
            early, late = sizes[:r], sizes[r:]
            squares = self.squares
            block_seconds = run.tails_sum(B, q + 1, sum(early), sum(map(mul, early, range(r))),
                                          sum(map(mul, early, squares)))
            if late:
                block_seconds += run.tails_sum(B, q, sum(late), sum(map(mul, late, range(r, B))),
                                               sum(map(mul, late, squares[r:])))
            taken = (q + 1) * sum(early) + q * sum(late)
        heap, end = self.heap, c0 + run.steps
        over_added, over_seconds = self.enter_last_blocks(end, run) if heap and heap[0][0] < end else (0, 0.0)
        self.owed += taken
        return block_seconds, taken, over_added, over_seconds

    def free_resident(self, s: int) -> None:
        """Every block has this one holder: free the listed ones at once (owed blocks
        were never taken), with the sequence's ``kv_len`` tokens."""
        a = self.alloc
        table = a._tables.pop(s)
        a._token_states -= a._kv[s] + a._clock
        a.pool.free_exclusive(table)
        a._filled[table[-1]] = a.block_size

    def distinct_blocks(self, seq_ids: Sequence[int]) -> int:
        a = self.alloc  # each holds its own blocks: listed, or owed while resident
        return sum(len(a._tables[s]) if s in a._swapped else a._held(s) for s in seq_ids)

    def usage(self) -> MemoryUsage:
        # Every block has one holder: the totals say it all (and no prefix cache: nothing evictable).
        a = self.alloc
        return a._usage_totals(len(a.pool.free_list) - self.owed)

    def check(self, resident: list[int]) -> None:
        a = self.alloc
        B = a.block_size
        for s in resident:
            last, base = -(-a._final[s] // B), a._kv[s]
            at = (last - 1) * B - base
            due = at >= a._clock and last * B > a._final[s]
            assert self.last_block_at.get(s) == (at if due else None), f"seq {s}: last-block clock"
        assert a.usage().token_states == sum(a.kv_len(s) for s in resident), "token_states drifted"
