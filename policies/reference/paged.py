"""The reference paged allocator: vLLM's PagedAttention memory, written to be read.

This is the oracle the fast ``PagedAllocator`` is tested against (DESIGN.md,
"Performance principle, and the reference"), and the place to learn the rules. It
keeps every block table for real and recomputes the memory classes from them; it
shares nothing with the fast allocator.

::

    GPU blocks  [ 0 ][ 1 ][ 2 ][ 3 ][ 4 ][ 5 ] ...   block_size slots each
    seq 7       -> [2, 0, 5]        kv = 2 * B + 3  (block 5 holds 3 tokens)
    seq 8       -> [2, 0, 4]        a fork of seq 7: blocks 2 and 0 have 2 holders
    free list   [1, 3, ...]         blocks nobody holds and no cache names
    prefix cache  key -> block      the cache holds one reference of its own;
    LRU         [3, ...]            cached blocks only the cache holds: free, evicted oldest first

Rules (one place each):

- A sequence takes a new block only when its last block is full.
- Appending to a partly filled last block that another sequence also holds first copies
  it (copy-on-write); the copy holds the tokens written so far.
- Prefix caching: a full prompt block is named by its content and everything in front
  of it: a chain, each name made of its parent's name and its own content (vLLM hashes
  the pair; here each new pair gets the next integer). A freed cached block stays
  reusable until a block is needed and no uncached block is free; then the least
  recently released cached block is evicted.
- Swapping moves a group's distinct blocks to a bounded CPU pool (a block shared by
  several sequences moves once) and back to fresh GPU blocks.
- Cache tiers below the GPU (``simulator.reference.vllm.ReferenceTiers``): a request loading
  from a tier holds its cached hits and fresh blocks for the load in ``loading`` (not a
  sequence: it decodes nothing); when the load ends the loaded blocks are cached under
  their names (a name cached meanwhile keeps its block) and all are released. The tiers
  read each name's chain parent (``parents``), the priority of the request that named
  the cached block (``namer``) and, with ``log_evictions``, every eviction as (name,
  parent, namer's priority) in ``evicted`` (the engine drains it).

Memory classes (slots, summing to capacity): ``token_states`` counts the tokens written
in blocks some sequence holds (a shared block once); a sequence's ``reserved`` slots are
the empty slots of its last block up to its final length, if it alone will fill them
(a shared partly filled last block will be copied: its empty slots are nobody's);
``free`` counts free blocks and cached blocks only the cache holds; the rest of the
allocated slots are ``internal_frag``.

Under ``scheduler.policy: vllm-v1`` the engine uses :class:`ReferenceFreeQueueAllocator`
instead: vLLM v1's single free queue (freed blocks join its tail last block first, allocation
takes its head and evicts a cached block lazily there), chunked growth, no swap or forks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kvsim.policies.reference.eviction import PlainEvictionOrder

OK, NO_SPACE, FRAGMENTED, NEVER = "ok", "no_space", "fragmented", "never"


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` slots."""
    return -(-tokens // block_size)


@dataclass
class Memory:
    """Slots by class at one instant (they sum to ``capacity``), and the slots the
    sequences would hold if nothing were shared (for the sharing saving)."""

    capacity: int
    token_states: int
    reserved: int
    internal_frag: int
    free: int
    unshared: int
    allocator_frag: int = 0  # slots held beyond what a sequence asked for (buddy rounding)


def table_memory(
    capacity: int, block_size: int, tables: dict[int, list[int]], tokens_in: Sequence[int],
    reserved: int, free_blocks: int,
) -> Memory:
    """The classes of a paged cache from its block tables: written tokens of held blocks
    (``tokens_in[b]``; a shared block once), the given reservation, the free blocks; the
    rest of the held slots are internal fragmentation. Both reference paged allocators."""
    held = {b for table in tables.values() for b in table}
    token_states = sum(tokens_in[b] for b in held)
    free = free_blocks * block_size
    return Memory(
        capacity,
        token_states,
        reserved,
        capacity - free - token_states - reserved,
        free,
        sum(len(t) for t in tables.values()) * block_size,
    )


def check_tables(
    tables: dict[int, list[int]], holders: list[int], kv: dict[int, int], block_size: int
) -> None:
    """Each block's holder count is the number of tables listing it, and each table is as
    long as its sequence's tokens need."""
    held = [0] * len(holders)
    for table in tables.values():
        for b in table:
            held[b] += 1
    assert held == holders, "holder counts disagree with the block tables"
    for s, table in tables.items():
        assert len(table) == blocks_for(kv[s], block_size), f"seq {s}: table length"


def leading_hits(cache: dict[int, int], keys: Iterable[int]) -> list[int]:
    """The blocks ``cache`` (key -> block) holds for the longest run of leading ``keys``: a
    prefix hit stops at the first key not cached, as the chain behind it is then unknown."""
    hits = []
    for key in keys:
        if key not in cache:
            break
        hits.append(cache[key])
    return hits


def claim(alloc: ReferencePagedAllocator | ReferenceFreeQueueAllocator, block: int) -> int:
    """Hand ``block`` to new content (one holder, no token written). A block still cached
    loses its key now: an eviction, logged as (key, parent, namer's priority) for a
    write-back tier. Both allocators evict this way; only how they pick the block differs."""
    if block in alloc.key_of:
        key = alloc.key_of.pop(block)
        del alloc.cache[key]
        priority = alloc.namer.pop(key)
        if alloc.log_evictions:
            alloc.evicted.append((key, alloc.parents[key], priority))
        alloc.evictions += 1
    alloc.holders[block] = 1
    alloc.filled[block] = 0
    return block


@dataclass
class ReferencePagedAllocator:
    """``num_blocks`` GPU blocks and ``swap_blocks`` CPU blocks of ``block_size`` slots."""

    num_blocks: int
    block_size: int
    swap_blocks: int = 0
    prefix_caching: bool = False
    eviction: str = "lru"  # which cached block only the cache holds goes first (see ``take``)
    shares_memory: bool = field(default=True, init=False)
    copied_blocks: int = field(default=0, init=False)  # copy-on-write copies so far
    prefix_lookups: int = field(default=0, init=False)
    prefix_hits: int = field(default=0, init=False)
    evictions: int = field(default=0, init=False)
    log_evictions: bool = field(default=False, init=False)  # keep ``evicted`` (a write-back tier)

    def __post_init__(self) -> None:
        self.capacity = self.num_blocks * self.block_size
        self.parents: dict[int, int | None] = {}  # name -> its parent's name (None: a chain's first)
        self.namer: dict[int, int] = {}  # cached name -> priority of the request that named it
        self.evicted: list[tuple[int, int | None, int]] = []  # (name, parent, namer's priority)
        self.loading: dict[int, list[int]] = {}  # request loading from a cache tier -> hits + fresh blocks
        self.free_list: list[int] = list(range(self.num_blocks))
        self.holders: list[int] = [0] * self.num_blocks  # sequences holding each GPU block
        self.filled: list[int] = [0] * self.num_blocks  # tokens written in each GPU block
        self.tables: dict[int, list[int]] = {}  # GPU-resident sequence -> its blocks
        self.kv: dict[int, int] = {}  # sequence -> tokens stored (GPU or CPU)
        self.final: dict[int, int] = {}  # sequence -> tokens it will finally store
        self.names: dict[tuple[int, Hashable], int] = {}  # (parent name, content) -> name
        self.cache: dict[int, int] = {}  # name -> GPU block holding that content
        self.key_of: dict[int, int] = {}  # GPU block -> its name
        self.lru: dict[
            int, None
        ] = {}  # cached blocks no sequence holds, least recently released first
        self.cpu_tables: dict[int, list[int]] = {}  # swapped-out sequence -> its CPU blocks
        self.cpu_holders: dict[int, int] = {}  # CPU block in use -> sequences holding it
        self.cpu_filled: dict[int, int] = {}
        self.cpu_free_list: list[int] = list(range(self.swap_blocks))
        # other policies than lru: their facts about each cached name; one clock tick per
        # registration, hit, and cached block left to the cache alone
        self.policy = PlainEvictionOrder(self.eviction, self.num_blocks)
        self.clock = 0

    # --- blocks ----------------------------------------------------------------
    def num_free(self) -> int:
        """Blocks a new allocation may take: free ones and cached ones nobody holds."""
        return len(self.free_list) + len(self.lru)

    def take(self) -> int:
        """A block for new content: a free one, else evict the least recently used cached
        one (another policy: the one it picks among them)."""
        if self.free_list:
            block = self.free_list.pop()
        else:
            if self.eviction == "lru":
                block = next(iter(self.lru))
            else:
                block = self.cache[self.policy.victim(self.key_of[b] for b in self.lru)]
            del self.lru[block]
        return claim(self, block)

    def hold(self, block: int) -> None:
        """One more sequence holds ``block`` (a fork, or a prefix-cache hit)."""
        if self.holders[block] == 0 and block in self.key_of:
            del self.lru[block]  # revived from the cache
        self.holders[block] += 1

    def release(self, block: int) -> None:
        """One sequence lets go of ``block``; the last one frees it, or leaves it to the cache."""
        self.holders[block] -= 1
        if self.holders[block] == 0:
            if block in self.key_of:
                self.lru[block] = None
                if self.eviction != "lru":  # left to the cache now: its recency
                    self.clock += 1
                    self.policy.touch(self.key_of[block], self.clock)
            else:
                self.free_list.append(block)

    # --- admission ---------------------------------------------------------------
    def prefix_keys(self, prefix: Sequence[Hashable]) -> list[int]:
        """Names of the leading full prompt blocks: each names (parent name, content)."""
        keys, parent = [], -1
        for content in prefix if self.prefix_caching else ():
            key = self.names.setdefault((parent, content), len(self.names))
            self.parents.setdefault(key, None if parent == -1 else parent)
            keys.append(key)
            parent = key
        return keys

    def cache_hits(self, prefix: Sequence[Hashable]) -> list[int]:
        """Blocks of the longest run of leading prompt blocks found in the cache."""
        return leading_hits(self.cache, self.prefix_keys(prefix))

    def can_admit(
        self,
        prompt_len: int,
        finals: list[int],
        watermark_slots: int,
        prefix: Sequence[Hashable] = (),
    ) -> str:
        """Could a group of ``len(finals)`` sequences sharing the prompt start now, keeping
        the watermark free? NEVER when even an empty cache could not hold it to its end."""
        B, n = self.block_size, len(finals)
        watermark = watermark_slots // B
        prompt = blocks_for(prompt_len, B)
        longest = blocks_for(max(max(finals), prompt_len), B)
        # At its peak every sequence holds the shared prompt blocks plus its own blocks past
        # them, and (several sequences) its own copy of a partly filled last prompt block.
        copies = n if n > 1 and prompt_len % B else 0
        peak = prompt + n * (longest - prompt) + copies
        if prompt > self.num_blocks - watermark or peak > self.num_blocks:
            return NEVER
        # A hit on a block some sequence holds costs nothing; one only the cache holds
        # leaves the free count like a fresh block.
        held_hits = sum(1 for b in self.cache_hits(prefix) if self.holders[b] > 0)
        if self.num_free() - (prompt - held_hits) < watermark:
            return NO_SPACE
        return OK

    def admit(
        self,
        seq_ids: list[int],
        prompt_len: int,
        finals: list[int],
        prefix: Sequence[Hashable] = (),
        priority: int = 0,
        counted: bool = True,
    ) -> int:
        """Store the prompt once for all sequences of the group; return the prompt tokens
        found in the prefix cache (at least the last prompt token is computed). ``priority``:
        the request's (the namer of the blocks it caches); ``counted`` False: its lookups and
        hits were counted when its load from a cache tier started."""
        B = self.block_size
        keys = self.prefix_keys(prefix)
        hits = self.cache_hits(prefix)
        self.hold_hits(hits)
        if counted:
            self.prefix_lookups += len(keys)
            self.prefix_hits += len(hits)
        fresh = [self.take() for _ in range(blocks_for(prompt_len, B) - len(hits))]
        blocks = hits + fresh
        for i, b in enumerate(fresh, start=len(hits)):
            self.filled[b] = min(B, prompt_len - i * B)
            if i < len(keys):  # a full block with a name: cache it
                self.cache_block(keys[i], b, priority)
        for b in blocks:  # every further sequence holds the prompt blocks too
            self.holders[b] += len(seq_ids) - 1
        for s, final in zip(seq_ids, finals):
            self.tables[s] = list(blocks)
            self.kv[s] = prompt_len
            self.final[s] = final
        return min(len(hits) * B, prompt_len - 1)

    def hold_hits(self, hits: list[int]) -> None:
        """A request takes the cached blocks it hit: a use of each cached content."""
        for b in hits:
            if self.eviction != "lru":  # a use of the cached content
                self.clock += 1
                self.policy.hit(self.key_of[b], self.clock)
            self.hold(b)

    def cache_block(self, key: int, block: int, priority: int) -> None:
        """Cache full ``block`` under ``key``, unless another block holds that content already
        (then that one stays the cached copy). ``priority``: the namer's."""
        if key in self.cache:
            return
        self.cache[key] = block
        self.key_of[block] = key
        self.namer[key] = priority
        if self.eviction != "lru":
            self.clock += 1
            self.policy.insert(key, self.clock)

    # --- loads from a cache tier below the GPU ----------------------------------------------
    def start_load(self, s: int, prefix: Sequence[Hashable], count: int) -> None:
        """Request ``s`` loads ``count`` blocks after its cached prefix from a cache tier: it
        holds its hits (looked up and counted as at admission) and ``count`` fresh blocks,
        full (their KV is arriving). The caller checked that they fit."""
        hits = self.cache_hits(prefix)
        self.hold_hits(hits)
        self.prefix_lookups += len(self.prefix_keys(prefix))
        self.prefix_hits += len(hits)
        fresh = [self.take() for _ in range(count)]
        for b in fresh:
            self.filled[b] = self.block_size
        self.loading[s] = hits + fresh

    def finish_load(self, s: int, keys: Sequence[int], priority: int) -> None:
        """The load of ``s`` ended: its loaded blocks (after its hits) are cached under
        ``keys``, then it releases every block it held, first to last."""
        table = self.loading.pop(s)
        for key, b in zip(keys, table[len(table) - len(keys):]):
            self.cache_block(key, b, priority)
        for b in table:
            self.release(b)

    # --- growth, forks, frees ----------------------------------------------------------
    def needs_block(self, s: int) -> bool:
        """Does the next token of ``s`` need a block: its last is full, or shared (a copy)?"""
        return self.kv[s] % self.block_size == 0 or self.holders[self.tables[s][-1]] > 1

    def can_append(self, seq_ids: Sequence[int]) -> bool:
        """Room for one more token in each sequence? Counted per sequence, before any copy:
        two beams sharing a partly filled last block count two blocks, although the last
        holder keeps the original (conservative, as vLLM's one block per sequence)."""
        return sum(1 for s in seq_ids if self.needs_block(s)) <= self.num_free()

    def append(self, seq_ids: Sequence[int]) -> None:
        """One slot for each sequence (the caller checked ``can_append``)."""
        B = self.block_size
        for s in seq_ids:
            table, offset = self.tables[s], self.kv[s] % B
            if offset == 0:
                table.append(self.take())
            elif self.holders[table[-1]] > 1:  # copy-on-write
                copy = self.take()
                self.filled[copy] = offset
                self.release(table[-1])
                table[-1] = copy
                self.copied_blocks += 1
            self.filled[table[-1]] = offset + 1
            self.kv[s] += 1
            self.final[s] = max(self.final[s], self.kv[s])

    def fork_into(self, parent: int, target: int, final: int) -> None:
        """Beam search: ``target`` (a dead beam) becomes a fork of ``parent``: shares its blocks."""
        for b in self.tables[target]:
            self.release(b)
        self.tables[target] = list(self.tables[parent])
        for b in self.tables[target]:
            self.hold(b)
        self.kv[target] = self.kv[parent]
        self.final[target] = final

    def free(self, s: int) -> None:
        if s in self.cpu_tables:
            for b in self.cpu_tables.pop(s):
                self.cpu_release(b)
        else:
            for b in self.tables.pop(s):
                self.release(b)
        del self.kv[s], self.final[s]

    # --- swapping ----------------------------------------------------------------------
    def distinct_blocks(self, seq_ids: Sequence[int]) -> int:
        tables = self.cpu_tables if seq_ids[0] in self.cpu_tables else self.tables
        return len({b for s in seq_ids for b in tables[s]})

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return self.distinct_blocks(seq_ids) <= len(self.cpu_free_list)

    def swap_out(self, seq_ids: Sequence[int]) -> tuple[int, int]:
        """Move the group's distinct blocks to the CPU; return (blocks moved, slots moved)."""
        moved: dict[int, int] = {}  # GPU block -> its CPU copy
        for s in seq_ids:
            cpu_table = []
            for b in self.tables.pop(s):
                if b not in moved:
                    moved[b] = self.cpu_free_list.pop()
                    self.cpu_holders[moved[b]] = 0
                    self.cpu_filled[moved[b]] = self.filled[b]
                self.cpu_holders[moved[b]] += 1
                cpu_table.append(moved[b])
                self.release(b)
            self.cpu_tables[s] = cpu_table
        return len(moved), len(moved) * self.block_size

    def cpu_release(self, b: int) -> None:
        self.cpu_holders[b] -= 1
        if self.cpu_holders[b] == 0:
            del self.cpu_holders[b], self.cpu_filled[b]
            self.cpu_free_list.append(b)

    def can_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> str:
        need, watermark = self.distinct_blocks(seq_ids), watermark_slots // self.block_size
        if need > self.num_blocks - watermark:
            return NEVER
        return OK if self.num_free() - need >= watermark else NO_SPACE

    def swap_in(self, seq_ids: Sequence[int]) -> tuple[int, int]:
        """Bring the group back into fresh GPU blocks (not cached); (blocks, slots) moved."""
        moved: dict[int, int] = {}  # CPU block -> its GPU copy
        for s in seq_ids:
            table = []
            for b in self.cpu_tables.pop(s):
                if b not in moved:
                    moved[b] = self.take()
                    self.filled[moved[b]] = self.cpu_filled[b]
                else:
                    self.holders[moved[b]] += 1
                table.append(moved[b])
                self.cpu_release(b)
            self.tables[s] = table
        return len(moved), len(moved) * self.block_size

    # --- observation -------------------------------------------------------------------
    def kv_len(self, s: int) -> int:
        return self.kv[s]

    def resident(self) -> tuple[int, int]:
        """(sequences on the GPU, their stored tokens): a decode batch's shape."""
        return len(self.tables), sum(self.kv[s] for s in self.tables)

    def memory(self) -> Memory:
        """Slots by class; the blocks of requests loading from a cache tier are held (their
        tokens written, unshared) like a table's."""
        B = self.block_size
        reserved = 0
        for s, table in self.tables.items():
            if self.holders[table[-1]] == 1:  # only its own last block will it fill itself
                reserved += max(0, min(len(table) * B, self.final[s]) - self.kv[s])
        held = {**self.tables, **{("loading", s): t for s, t in self.loading.items()}}
        return table_memory(self.capacity, B, held, self.filled, reserved, self.num_free())

    def check(self) -> None:
        """Raise AssertionError unless every block is accounted for exactly once."""
        holders = list(self.holders)  # the sequences' holds: less the loading requests'
        for table in self.loading.values():
            for b in table:
                holders[b] -= 1
        check_tables(self.tables, holders, self.kv, self.block_size)
        assert self.namer.keys() == self.cache.keys(), "a cached name's namer is not kept"
        cached_only = [b for b in self.key_of if self.holders[b] == 0]
        assert sorted(cached_only) == sorted(self.lru), "LRU list disagrees with the cache"
        free = set(self.free_list)
        assert len(free) == len(self.free_list) and not free & set(self.key_of)
        assert all(self.holders[b] == 0 for b in free)
        in_use = sum(1 for h in self.holders if h > 0)
        assert in_use + len(self.free_list) + len(self.lru) == self.num_blocks, (
            "blocks not conserved"
        )


# --- vLLM v1: one free queue, chunked growth, lazy eviction ----------------------------------
@dataclass
class ReferenceFreeQueueAllocator:
    """vLLM v1's KV cache manager, written to be read: ``num_blocks`` blocks of
    ``block_size`` slots and ONE queue of every free block, cached or not.

    ::

        free queue  head [ 5 ][ 9 ][ 2 ][ 7 ] tail     allocation pops the head,
                          cached?  .  yes   .   yes    freeing appends to the tail
        seq 3       -> [4, 0, 8]   kv = 2 * B + 1      (blocks 4 and 0 are full: cached)
        cache       key -> block   (full blocks only; a key names a block's content and
                                    everything in front of it: a chain)

    Rules (one place each):

    - A sequence holds ``ceil(kv / B)`` blocks, where ``kv`` is the tokens computed or being
      computed this step; it grows by any number of tokens (a prefill chunk, a decode).
    - Freeing a sequence appends its blocks to the tail last block first, so its tail is
      evicted before its head; a block another sequence still holds stays out of the queue.
    - Allocation pops the head; a cached block popped there loses its key then (lazy
      eviction, counted in ``evictions``).
    - Prefix caching: a full block is registered under its key once, the moment it is full;
      if another block already holds that key, the first one stays the cached one. A hit on
      a block in the free queue takes it out of the queue.

    Eviction policies other than ``lru`` (``eviction``; vLLM's rule is the queue above):
    the free queue holds only blocks with no cached content, and free cached blocks wait
    apart (``cached_free``); allocation takes the queue's head while there is one, else the
    cached block the policy picks (``policies.reference.eviction``). The policy's facts
    about a cached content key: it is entered at the first hit or release of its block; a
    hit (a request takes the block) is a use, at the request's priority; every release of
    the block by a holder refreshes its recency and raises its priority to the holder's.
    One clock tick per hit and per release of a cached block.

    Cache tiers below the GPU (``simulator.reference.vllm.ReferenceTiers``) read three more facts:
    each key's chain parent (``parents``), the priority of the request that named the cached
    block (``namer``: it computed or loaded it first), and, with ``log_evictions``, every
    eviction as (key, parent, namer's priority) in ``evicted`` (the engine drains it).

    Nothing is swapped, forked or copied: vLLM v1 preempts by recomputation and runs one
    sequence per request. Memory classes as in :class:`ReferencePagedAllocator`: every block
    in the free queue (cached or not) is free.
    """

    num_blocks: int
    block_size: int
    prefix_caching: bool = False
    eviction: str = "lru"
    log_evictions: bool = False  # keep ``evicted`` for a tier that stores what the GPU evicts
    prefix_lookups: int = field(default=0, init=False)  # full blocks looked up at admission
    prefix_hits: int = field(default=0, init=False)  # ... and found
    evictions: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.capacity = self.num_blocks * self.block_size
        self.free_queue: deque[int] = deque(range(self.num_blocks))  # index order at start
        self.holders: list[int] = [0] * self.num_blocks
        self.filled: list[int] = [0] * self.num_blocks  # tokens written in each block
        self.tables: dict[int, list[int]] = {}  # sequence -> its blocks
        self.kv: dict[int, int] = {}  # sequence -> tokens computed or being computed
        self.final: dict[int, int] = {}  # sequence -> tokens it will finally store
        self.offered: dict[int, int] = {}  # sequence -> its leading blocks already registered
        self.names: dict[tuple[int, Hashable], int] = {}  # (parent key, content) -> key
        self.parents: dict[int, int | None] = {}  # key -> its parent's key (None: a chain's first)
        self.cache: dict[int, int] = {}  # key -> the block holding that content
        self.namer: dict[int, int] = {}  # cached key -> priority of the request that named it
        self.evicted: list[tuple[int, int | None, int]] = []  # (key, parent, namer's priority)
        self.key_of: dict[int, int] = {}  # block -> its key
        self.priority: dict[int, int] = {}  # sequence -> its request's priority
        self.cached_free: set[int] = set()  # eviction policies other than lru: free cached blocks
        self.policy = PlainEvictionOrder(self.eviction, self.num_blocks)
        self.clock = 0  # one tick per hit or release of a cached block

    # --- keys ---------------------------------------------------------------------------
    def chain_key(self, parent: int, content: Hashable) -> int:
        """The key of a block with ``content`` after the block keyed ``parent`` (-1: first)."""
        if (parent, content) not in self.names:
            key = self.names[(parent, content)] = len(self.names)
            self.parents[key] = None if parent == -1 else parent
        return self.names[(parent, content)]

    def cached_blocks(self, keys: Sequence[int]) -> list[int]:
        """Blocks of the longest run of leading ``keys`` found in the cache."""
        return leading_hits(self.cache, keys)

    # --- blocks -------------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.free_queue) + len(self.cached_free)

    def take(self) -> int:
        """The head of the free queue; if it is cached, its key is dropped now (evicted).
        (Other policies: a cached block only when the queue is empty, the policy's victim.)"""
        if self.free_queue:
            block = self.free_queue.popleft()
        else:
            victim = self.policy.victim(self.key_of[b] for b in self.cached_free)
            block = self.cache[victim]
            self.cached_free.remove(block)
        return claim(self, block)

    def free_blocks_needed(self, hits: Sequence[int], tokens: int) -> int:
        """Free-queue blocks a new sequence of ``tokens`` slots starting with the cached
        ``hits`` consumes: its fresh blocks, and the hits that sit in the free queue."""
        held_hits = sum(1 for b in hits if self.holders[b] > 0)
        return blocks_for(tokens, self.block_size) - held_hits

    # --- a sequence's life --------------------------------------------------------------------
    def open(self, s: int, hits: list[int], tokens: int, final: int, looked_up: int, priority: int = 0,
             count_hits: bool = True) -> None:
        """Sequence ``s`` starts holding the cached ``hits`` (full blocks) and fresh blocks up
        to ``tokens`` slots (the caller checked ``free_blocks_needed``); ``looked_up`` full
        blocks were searched in the cache; ``priority``: its request's; ``count_hits`` False:
        the hits were counted already (when the request's load from a cache tier started)."""
        for b in hits:
            if self.eviction != "lru":  # a use of the cached content
                self.clock += 1
                if self.key_of[b] not in self.policy.facts:
                    self.policy.insert(self.key_of[b], self.clock, priority)
                self.policy.hit(self.key_of[b], self.clock, priority)
            if self.holders[b] == 0:  # a hit on a free cached block revives it
                if b in self.cached_free:
                    self.cached_free.remove(b)
                else:
                    self.free_queue.remove(b)
            self.holders[b] += 1
        self.priority[s] = priority
        self.prefix_lookups += looked_up
        self.prefix_hits += len(hits) if count_hits else 0
        self.tables[s] = list(hits)
        self.kv[s] = len(hits) * self.block_size
        self.final[s] = final
        self.offered[s] = len(hits)
        assert self.grow(s, tokens), "the caller checked that the blocks are free"

    def grow(self, s: int, tokens: int) -> bool:
        """Let ``s`` hold ``tokens`` slots: take the blocks it lacks from the free queue, all
        or nothing; False if the queue is too short."""
        B, table = self.block_size, self.tables[s]
        need = blocks_for(tokens, B) - len(table)
        if need > self.num_free():
            return False
        for _ in range(need):
            table.append(self.take())
        for i in range(self.kv[s] // B, len(table)):  # the blocks the new tokens land in
            self.filled[table[i]] = min(B, tokens - i * B)
        self.kv[s] = tokens
        return True

    def register_full_blocks(self, s: int, computed: int, keys: Sequence[int]) -> None:
        """Prefix caching: the blocks of ``s`` that ``computed`` tokens fill are named by
        ``keys`` (one per full block); each is offered to the cache once, when it fills."""
        table = self.tables[s]
        for j in range(self.offered[s], computed // self.block_size):
            if keys[j] not in self.cache:  # else another block holds that content: keep it
                self.cache[keys[j]] = table[j]
                self.key_of[table[j]] = keys[j]
                self.namer[keys[j]] = self.priority[s]
        self.offered[s] = max(self.offered[s], computed // self.block_size)

    def free(self, s: int) -> None:
        """Release every block of ``s``, last block first, to the tail of the free queue."""
        for b in reversed(self.tables.pop(s)):
            if self.eviction != "lru" and b in self.key_of:  # recency and priority of its content
                self.clock += 1
                key = self.key_of[b]
                if key in self.policy.facts:
                    self.policy.touch(key, self.clock, self.priority[s])
                else:
                    self.policy.insert(key, self.clock, self.priority[s])
            self.holders[b] -= 1
            if self.holders[b] == 0:
                if self.eviction != "lru" and b in self.key_of:
                    self.cached_free.add(b)
                else:
                    self.free_queue.append(b)
        del self.kv[s], self.final[s], self.offered[s], self.priority[s]

    # --- observation ---------------------------------------------------------------------------
    def kv_len(self, s: int) -> int:
        return self.kv[s]

    def memory(self) -> Memory:
        """Slots by class: written tokens of held blocks (a shared one once), the empty slots
        of each sequence's own last block up to its final length, the rest of the held
        slots as internal fragmentation; every queued block is free."""
        B = self.block_size
        reserved = sum(
            max(0, min(len(table) * B, self.final[s]) - self.kv[s])
            for s, table in self.tables.items()
        )
        return table_memory(self.capacity, B, self.tables, self.filled, reserved, self.num_free())

    def check(self) -> None:
        """Raise AssertionError unless every block is accounted for exactly once."""
        check_tables(self.tables, self.holders, self.kv, self.block_size)
        queued = list(self.free_queue) + sorted(self.cached_free)
        assert len(set(queued)) == len(queued), "a block is queued twice"
        assert sorted(queued) == [b for b in range(self.num_blocks) if self.holders[b] == 0], (
            "the free queue is not exactly the blocks nobody holds"
        )
        assert all(self.cache[k] == b for b, k in self.key_of.items()), "cache and keys disagree"
        assert len(self.cache) == len(self.key_of)
        assert self.namer.keys() == self.cache.keys(), "a cached key's namer is not kept"
        assert all(b in self.key_of for b in self.cached_free), "an uncached block waits with the cached"
        assert all(k in self.cache for k in self.policy.facts), "the policy remembers an evicted key"
