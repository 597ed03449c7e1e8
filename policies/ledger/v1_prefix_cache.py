"""Paged allocation with vLLM v1's prefix cache (``scheduler.policy: vllm-v1`` with
``allocator.prefix_caching: true``).

What differs from the paged allocator's own (v0-style) cache, after vLLM 0.19's
``vllm/v1/core/block_pool.py`` and ``kv_cache_manager.py``:

- Every *full* block of a sequence has an identity: the blocks the request's shared prefix
  names (``prefix_contents``: hash ids, a prefix id or token ids, chained; with
  ``output_token_ids``, the generated tokens too) use it; every other full block (the rest
  of the prompt, generated tokens) is named ``("u", request_id, block_index)``, so only the
  request itself can hit it, after a preemption. A block's identity is fixed by its
  position and content, so a chain is implied. A partly filled block has none.
- The cache holds no reference: a block no sequence holds is *free*, cached or not, and
  waits in one FIFO free queue (:class:`~policies.ledger.block_pool.QueuedBlockPool`). A sequence
  frees its blocks last-to-first to the tail; allocation takes the head and forgets the
  identity of a cached block it takes (lazy eviction, counted in ``evictions``); a hit on a
  free block takes it out of the queue.
- A hit is the longest run of leading full blocks whose identities are cached, capped at
  ``(num_tokens - 1) // block_size`` blocks (the last token is always computed).
- If two sequences compute the same identity, the first registration stays the cached
  block; the other is an uncached duplicate.

When blocks are named: the blocks a prefill chunk fills are registered when its step
completes (:meth:`register_full`); blocks filled by decode steps are named when their
sequence frees them. The two are the same thing: a generated-token block's identity is
unique to its request, no other request can look it up, and its own request looks up
only after it has freed it; and no older cached copy of such a block can exist when it
fills (a request's cached blocks from before a preemption end before the tokens it had
then, and it computes those again in prefill chunks). So runs of decode steps (macro
steps) register nothing, as they must to stay O(events). A request that knows its answer
(``output_token_ids``) names its generated blocks by their tokens, and another request can
hit them: from when it frees them (vLLM: as they fill; the reference engine follows this
cache, ``simulator.reference.vllm.ReferenceV1Replica.cache_full_blocks``).

Eviction policy (``allocator.eviction_policy``): ``lru`` (the default) is vLLM's single free
queue above, exactly. Any other policy (``lfu``, ``fifo``, ``arc``, ``priority``: see
``policies.indexes.eviction_order``) splits the free blocks in two
(:class:`~policies.indexes.free_block_queue.UncachedFirstQueue`): blocks with no cached content are
taken first, in freed order, and free cached blocks only when none is left, in the policy's
order. The facts the policies read are kept per cached content key, on this cache's logical
clock (one tick per hit or release of a cached block):

- an entry is created the first time its block is hit or released (registration time
  differs between this cache and the reference, which registers decode blocks as they fill;
  hits and releases happen at the same moments in both);
- a hit (a new request takes the cached block) is a *use*: LFU counts it, ARC moves the
  entry to T2, the entry's priority rises to the request's ``priority``;
- a release by any holder refreshes recency (vLLM's LRU is "freed last, evicted last") and
  raises the priority to the holder's.

Leaf-first comes from the keys, not from a check, for ``lfu`` and ``priority``: a request
releases its blocks last-to-first, and every request that used a block used its parent
too, so along a chain that is still reachable a parent is never less recently released,
less used or of lower priority than its child. ``fifo`` and ``arc`` may evict a chain's
interior; its descendants stay cached (unreachable: a lookup stops at the first miss)
until evicted in turn, as in any chain-blind policy.

Memory classes: a cached free block is free (reusable), as in the v0 cache.

Cost: the work a request's arrival, admission and finish do is one call each on
whole runs of blocks, not a Python call per block: identities are interned a run of
consecutive keys at a time (``policies.indexes.key_chain``); the cache index, both ways, is two
arrays indexed by key and by block (``policies.accel.dense_map``: 8 bytes an entry instead of
two dict entries and two int objects), so a lookup reads a prompt's keys, a registration
stores a run and a take forgets a run with C-level ``map`` calls or numpy; a hit is held
with one ``QueuedBlockPool.hold`` and a finished table released with one ``release_table``
(numpy on the refcounts for long tables, one queue update); blocks never used yet stay a
``range`` in the free queue. The runs handed between these steps (a prompt's keys, a hit,
fresh blocks, a block table) are typed ``array``s, not lists (``policies.accel.int_runs``):
numpy reads them in place, so no step builds an int object per block or converts a list
(that conversion was the largest per-block cost left: ~25 ns a block, several times per
request). What is still per block at C speed: the refcount and index entries of each
block (numpy gathers and scatters; a request's own blocks' identities are tuples, entered
with one ``dict.update`` per run); in Python: under eviction policies other than ``lru``,
the eviction order's entries.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import chain, repeat

from kvsim.policies.accel.dense_map import DenseMap
from kvsim.policies.indexes.eviction_order import EvictionOrder
from kvsim.policies.indexes.free_block_queue import UncachedFirstQueue
from kvsim.policies.indexes.key_chain import KeyChain
from kvsim.policies.kv_allocator import MemoryUsage
from kvsim.policies.ledger.block_pool import QueuedBlockPool
from kvsim.policies.ledger.paged_allocator import PagedAllocator


def own_identities(request_id: int, start: int, stop: int) -> Iterator[tuple[str, int, int]]:
    """``("u", request_id, i)`` for blocks ``start .. stop - 1`` that only the request itself
    names (lazy; the tuples are built by ``zip``, at C speed)."""
    return zip(repeat("u"), repeat(request_id), range(start, stop))


def block_identities(keys: Sequence[int], request_id: int, start: int, stop: int) -> Iterator[Hashable]:
    """What blocks ``start .. stop - 1`` of a request hold: its chained key where the request
    names its contents, else its own identity (:func:`own_identities`; lazy: a lookup that
    misses early builds nothing more)."""
    named = keys[start:stop]
    return chain(named, own_identities(request_id, start + len(named), stop))


def identity_before(keys: Sequence[int], request_id: int, start: int) -> Hashable | None:
    """What block ``start - 1`` of a request holds: the parent of block ``start`` (None for
    the first block)."""
    return next(block_identities(keys, request_id, start - 1, start)) if start else None


class V1PrefixCacheAllocator(PagedAllocator):
    """``num_blocks`` GPU blocks of ``block_size`` slots, vLLM v1's free queue and prefix
    cache; driven by :class:`simulator.sched.vllm_v1.SchedulerV1` (``open_seq``,
    ``extend``, ``free``). No swapping (v1 preempts by recompute only). ``eviction``: the
    order free cached blocks are evicted in (module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, eviction: str = "lru"):
        super().__init__(num_blocks, block_size, 0, prefix_caching=True)  # a QueuedBlockPool (_new_pool)
        self.eviction = eviction
        self._order: EvictionOrder | None = None  # None: vLLM's single free queue (lru)
        # The cache index both ways, in arrays (policies.accel.dense_map): key -> block, block -> key.
        self._cached: DenseMap = DenseMap()  # type: ignore[assignment]
        self._key_of: DenseMap = DenseMap(num_blocks)  # type: ignore[assignment]
        if eviction != "lru":
            self._order = EvictionOrder(eviction, num_blocks)
            queue = UncachedFirstQueue(range(num_blocks), self._order, self._key_of, self._cached)
            self.pool = QueuedBlockPool(num_blocks, block_size, queue)
        self._key_chain = KeyChain()  # identities of named blocks (replaces the base's _chain dict)
        self._now = 0  # the eviction order's logical clock: one tick per hit or release of a cached block
        self._names: dict[int, tuple[Sequence[int], int]] = {}  # seq -> (shared prefix keys, request id)
        self._named: dict[int, int] = {}  # seq -> leading blocks already named (registered or duplicate)
        self._priority: dict[int, int] = {}  # seq -> its request's priority (read by the eviction order)
        # (Cache tiers: the loading tables, ``on_evict`` and ``_meta`` are the base class's.)

    def _new_pool(self, num_blocks: int, block_size: int) -> QueuedBlockPool:
        """vLLM's FIFO free queue (another eviction policy replaces it once the cache index
        exists: its queue reads it)."""
        return QueuedBlockPool(num_blocks, block_size)

    # --- identities ----------------------------------------------------------------------
    def prefix_keys(self, prefix: Sequence[Hashable]) -> array:
        """Chained identities of the blocks a request's shared prefix names (walked a run of
        consecutive keys at a time: ``policies.indexes.key_chain``), as an ``array`` of 64-bit ints."""
        return self._key_chain.keys(prefix)

    def lookup(self, keys: Sequence[int], request_id: int, num_tokens: int) -> array:
        """Cached blocks of the longest leading run of a request's full blocks, at most
        ``(num_tokens - 1) // block_size`` of them (an ``array`` of block numbers)."""
        limit = (num_tokens - 1) // self.block_size
        cached = self._cached
        # The shared keys at once in the index's array, then, past them, the request's own
        # blocks one by one.
        named = min(limit, len(keys))
        hits = cached.leading(keys[:named])
        if len(hits) < named:
            return hits
        get = cached.get
        for key in block_identities(keys, request_id, named, limit):
            b = get(key)
            if b is None:
                break
            hits.append(b)
        return hits

    def in_use(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` some sequence holds (the rest wait in the free queue)."""
        return self.pool.in_use(blocks)

    def held(self, block: int) -> bool:
        """Does some sequence hold ``block`` (else it waits in the free queue)?"""
        return self.pool.refcounts[block] > 0

    def take_hits(self, blocks: Sequence[int], priority: int = 0) -> None:
        """Hold the hit blocks (a free one leaves the queue), before fresh blocks are taken;
        each is a use of its cached content by a request of ``priority``."""
        pool, order = self.pool, self._order
        if order is not None:
            for b in blocks:
                self._now += 1
                key = self._key_of[b]
                if key not in order:
                    order.insert(key, self._now, priority)
                order.hit(key, self._now, priority)
        # the free ones come back to the sequences' blocks (cached blocks are full)
        self._token_states += pool.hold(blocks) * self.block_size
        self.prefix_hits += len(blocks)

    def name(self, seq_id: int, keys: Sequence[int], request_id: int, hit_blocks: int, lookups: int,
             priority: int = 0) -> None:
        """Say what a newly resident sequence's blocks hold (its first ``hit_blocks`` are
        cached already; ``lookups``: full blocks it looked up, for the hit ratio)."""
        self._names[seq_id] = (keys, request_id)
        self._named[seq_id] = hit_blocks
        self._priority[seq_id] = priority
        self.prefix_lookups += lookups

    def named_blocks(self, seq_id: int) -> int:
        """How many leading blocks of the sequence are named (cached, or duplicates of cached ones)."""
        return self._named[seq_id]

    def register_full(self, seq_id: int) -> None:
        """Cache the sequence's blocks that are full now and not yet named (the first
        block computed with an identity stays its cached copy)."""
        full = (self._kv[seq_id] + self._clock) // self.block_size
        start = self._named[seq_id]
        if full <= start:
            return
        keys, rid = self._names[seq_id]
        table = self._tables[seq_id]
        own = max(start, min(full, len(keys)))  # the first of the request's own blocks
        private = list(own_identities(rid, own, full)) if full > own else []
        if self.on_evict is not None:
            self._remember([*keys[start:own], *private], identity_before(keys, rid, start), self._priority[seq_id])
        if own > start:  # shared keys: distinct ints, one chain's positions
            self._register_run(keys[start:own], table[start:own], own=False)
        if private:
            self._register_run(private, table[own:full], own=True)
        self._named[seq_id] = full

    def _register_run(self, keys: Sequence[Hashable], blocks: Sequence[int], own: bool) -> None:
        """Cache a run of just filled blocks under ``keys`` (all shared chain keys, or all the
        request's ``own`` identities): both index entries of the whole run at once when none
        is cached yet (the usual case), else block by block."""
        cached, key_of = self._cached, self._key_of
        put, put_back = ((cached.put_others, key_of.put_absent_boxed) if own
                         else (cached.put_ints, key_of.put_absent_ints))
        if put(keys, blocks):  # and a block just filled names nothing yet
            put_back(blocks, keys)
        else:
            self._register(keys, blocks)

    def _register(self, keys: Iterable[Hashable], blocks: Iterable[int]) -> None:
        """Cache each block under its key unless the key is cached already (that first copy stays)."""
        cached, key_of = self._cached, self._key_of
        for key, b in zip(keys, blocks):
            if key not in cached:
                cached[key] = b
                key_of[b] = key

    # --- taking and freeing blocks ---------------------------------------------------------
    def _forget(self, blocks: Sequence[int]) -> None:
        """Forget the cached contents of blocks just taken from the free queue (lazy
        eviction), at C speed for a whole run."""
        key_of = self._key_of
        if key_of:
            evicted = key_of.pop_many(blocks)
            self._cached.delete_many(evicted)
            self.evictions += len(evicted)
            if evicted and self.on_evict is not None:
                meta = [self._meta.pop(k) for k in evicted]
                self.on_evict(evicted, [m[0] for m in meta], [m[1] for m in meta])

    def _take(self) -> int:
        block = self.pool.allocate()
        self._forget((block,))
        return block

    def _take_many(self, count: int) -> array:  # type: ignore[override]
        unused = self.pool.never_used  # taken first, and they name nothing: nothing to forget
        blocks = self.pool.allocate_many(count)
        if count > unused:
            self._forget(blocks[unused:])
        return blocks

    def _release_gpu(self, table: Sequence[int]) -> None:
        """Last block first to the tail of the free queue (vLLM frees in reverse order, so
        a request's tail is evicted before its head)."""
        if not table:
            return
        freed = self.pool.release_table(table[::-1])
        if freed:
            # only the last block can have room (every other one is full): the slots freed
            # follow from the count; a free block counts as full
            B, last, filled = self.block_size, table[-1], self._filled
            if self.pool.refcounts[last]:  # someone else holds it (a hit: full)
                self._token_states -= freed * B
            else:
                self._token_states -= (freed - 1) * B + filled[last]
                filled[last] = B

    def free(self, seq_id: int) -> None:
        self.register_full(seq_id)
        if self._order is not None:
            self._note_release(self._tables[seq_id], self._priority[seq_id])
        super().free(seq_id)
        del self._names[seq_id], self._named[seq_id], self._priority[seq_id]

    def _note_release(self, table: Sequence[int], prio: int) -> None:
        """Tell the eviction order that a holder of ``table`` lets go of its cached blocks
        (last block first, as they are released): recency and priority; the block a
        release frees is filed as evictable by the queue."""
        order, key_of = self._order, self._key_of
        for b in reversed(table):
            key = key_of.get(b)
            if key is None:
                continue
            self._now += 1
            if key in order:
                order.touch(key, self._now, prio)
            else:
                order.insert(key, self._now, prio)

    # --- loads from a lower cache tier (policies.tiers.tier_stack) ------------------------------
    def _remember(self, keys: list[Hashable], parent: Hashable | None, priority: int) -> None:
        """Keep the parent and priority of newly named keys (the first namer's), for a tier
        that stores what the GPU evicts."""
        meta = self._meta
        for key in keys:
            if key not in meta:
                meta[key] = (parent, priority)
            parent = key

    def start_load(self, seq_id: int, hits: Sequence[int], count: int, priority: int = 0) -> None:
        """A request loads ``count`` blocks from a lower tier: hold its hit blocks (a hit, as
        at admission) and take ``count`` fresh blocks for the load (full: their KV is
        arriving). The caller checked that enough blocks are free."""
        self.take_hits(hits, priority)
        self._hold_for_load(seq_id, hits, count)

    def finish_load(self, seq_id: int, keys: list[Hashable], parent: Hashable | None, priority: int = 0) -> None:
        """The load of ``seq_id`` ended: cache its loaded blocks under ``keys`` (a key cached
        meanwhile keeps its block; the loaded copy stays uncached), then release all its
        blocks last to first, as a finished request does: they wait in the free queue, cached."""
        table, nhits = self._loading.pop(seq_id)
        self._loading_blocks -= len(table)
        self._register(keys, table[nhits:])
        if self.on_evict is not None:
            self._remember(keys, parent, priority)
        if self._order is not None:
            self._note_release(table, priority)
        self._release_gpu(table)

    def _pending_copies(self) -> list[int]:
        """None: a hit covers whole blocks and a sequence computes at least one token past
        it, so its partly filled last block is always its own (nothing to copy on write)."""
        return []

    def usage(self) -> MemoryUsage:
        """The classes from running totals, in O(1): a sequence's last block, the only one
        with room in it, is always its own (see ``_pending_copies``), so every allocated
        slot past a sequence's tokens is its own reservation or beyond its final length,
        however its full blocks are shared. (``check`` compares with the table walk.)
        A request loading from a cache tier holds its blocks without a sequence: they
        count as unshared slots too (the reference counts every held table)."""
        u = self._usage_totals(self.pool.num_free)  # no lazy tables, no cache references
        if self._loading_blocks:
            u.unshared += self._loading_blocks * self.block_size
        return u

    # --- the v0 entry points do not apply ----------------------------------------------
    def check_admit(self, *args, **kwargs):
        raise NotImplementedError("the v1 prefix cache is driven by SchedulerV1 (lookup, open_seq, extend)")

    def admit(self, *args, **kwargs):
        raise NotImplementedError("the v1 prefix cache is driven by SchedulerV1 (lookup, open_seq, extend)")

    # --- invariants -------------------------------------------------------------------
    def _check_blocks(self, resident: list[int]) -> None:
        for s in resident:
            self._refresh_fill(s)
        self.pool.check()
        n = self.pool.num_blocks
        refs = [0] * n
        for s in resident:
            table = self._tables[s]
            for b in table:
                refs[b] += 1
            assert -(-self.kv_len(s) // self.block_size) == len(table), f"seq {s}: table length"
            assert self.kv_len(s) <= self._final[s], f"seq {s}: longer than its final length"
            assert self._named[s] <= len(table), f"seq {s}: named past its table"
        for table, _ in self._loading.values():  # blocks of requests loading from a lower tier
            for b in table:
                refs[b] += 1
        for b in range(n):
            assert refs[b] == self.pool.refcount(b), f"GPU block {b}: refcount is not exact"
        assert len(self._key_of) == len(self._cached), "cache index sizes differ"
        if self.on_evict is not None:
            assert self._meta.keys() == self._cached.keys(), "a cached key's parent and priority are not kept"
        for key, b in self._cached.items():
            assert self._key_of[b] == key, f"cache index of block {b} is inconsistent"
            assert self._filled[b] == self.block_size, f"cached block {b} is not full"
        in_use = sum(self._filled[b] for b in range(n) if refs[b])
        assert in_use == self._token_states, "token_states drifted from the blocks' contents"
        assert self._res_seqs == len(resident), "resident sequence count drifted"
        assert self._res_base == sum(self._kv[s] for s in resident), "resident kv total drifted"
        assert self._res_blocks == sum(len(self._tables[s]) for s in resident), "resident block total drifted"
        assert self._res_over == sum(self._over(s) for s in resident), "over-final total drifted"
        walk = self._usage_walk()
        walk.unshared += self._loading_blocks * self.block_size
        assert self.usage() == walk
        assert self._loading_blocks == sum(len(t) for t, _ in self._loading.values()), "loading block count drifted"
        self.usage().check()
        if self._order is not None:
            self._order.check()
            free_cached = {b for b in self._key_of if not refs[b]}
            assert {self._cached[k] for k, e in self._order.entries.items() if e.filed} == free_cached, (
                "the eviction order's evictable entries are not the free cached blocks")
            assert all(k in self._cached for k in self._order.entries), "the eviction order holds an evicted key"
            assert all(self._key_of.get(b) is None for b in self.pool.free_list.uncached), "a cached block is uncached"

