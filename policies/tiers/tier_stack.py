"""Cache tiers below the GPU pool: when blocks are stored and loaded, and what it costs.

Serving engines keep prefix KV beyond the GPU (vLLM's offloading connector and LMCache in
CPU memory, SGLang's HiCache with host and storage tiers, TensorRT-LLM's host offload). A
:class:`TierStack` is one replica's tiers (``allocator.tiers``, top first: CPU, then disk),
each a :class:`~policies.tiers.cache_tier.CacheTier` (which contents, which goes) behind a
:class:`TierLink` (what a transfer costs). Modelled with ``scheduler.policy: vllm-v1`` (the rules below; blocks),
``vllm-v0`` (the same over v0's prefix cache, adapted in ``simulator.sched.scheduler``) and ``sglang``
(pages of the radix cache, adapted in ``simulator.sched.sglang``).

**Loads.** When the head of the waiting queue is considered for admission, the GPU prefix
hit (``h`` blocks) is extended by the blocks found, position after position, in some tier
(the top one that has it ready first) up to the first position no tier has. If ``k > 0``
blocks are found, the request *loads* instead of being admitted: it needs free GPU blocks
for them (and for hit blocks nobody holds), holds its hit blocks, takes ``k`` fresh ones,
and leaves the waiting queue; one transfer per tier involved starts at the scheduling
time. It takes no batch slot and no token budget meanwhile. When its last transfer ends,
the loaded blocks are cached on the GPU under their identities, the request releases all
its blocks (they stay cached, most recently freed) and goes to the *front* of the waiting
queue, where its next admission finds them as a GPU hit (not counted again as a hit).
vLLM keeps the blocks allocated to the request instead; releasing them means two loaded
requests can never wait on each other's blocks, and changes nothing unless the free queue
runs dry in between.

**Stores** (``write_policy``; tier 0 relative to the GPU, tier ``i`` to tier ``i - 1``):

- ``write-through`` (default): the prompt blocks prefill chunks fill, when their step ends
  (decode-filled blocks are not stored: vLLM's connector stores prompt blocks by default);
  a lower tier stores what the tier above stored.
- ``write-through-after-hits`` (``write_after_hits: N``): a block at its ``N``-th GPU hit
  (a lower tier: at its ``N``-th load from the tier above), as HiCache's selective policy.
- ``write-back``: a block when the tier above evicts it (the GPU: a cached free block taken
  for reuse).

A stored block carries its chain parent (leaf-only eviction) and a priority: the priority
of the request whose chunk filled it or whose hit counted (write-through, after-hits), or
of the request that first named it on the GPU (write-back).

A step's stores go out in at most two batches, one transfer per tier each: at the end of its
scheduling (write-back and after-hits, after the loads it started) and at its end
(write-through). A batch is stored into tier ``i`` first, then yields tier ``i + 1``'s.

**Links.** Each tier has its own link (PCIe for host memory, NVMe for a disk); loads from
and stores into a tier share it and are served one at a time in order, so contention
delays loads. A transfer of ``k`` blocks takes ``latency + k * block_bytes / bandwidth``.
The link is a FIFO clock, which is what a capacity-1 ``simpy.Resource`` serving transfers
in order does (the reference engine uses one), kept as a clock so a load's end is known
when it starts and the engine can plan runs of steps up to it.

Counters per tier: ``hit_blocks`` (loaded from it), ``loaded_tokens``, ``load_bytes``,
``store_bytes``, ``link_busy_s``, ``stored_blocks``, ``dropped_blocks`` (a full tier where
nothing may go), ``evictions``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvsim.policies.tiers.cache_tier import CacheTier

Key = Hashable
Parent = Hashable | None
INF = float("inf")

TIER_COUNTERS = ("hit_blocks", "loaded_tokens", "load_bytes", "store_bytes", "link_busy_s", "stored_blocks",
                 "dropped_blocks", "evictions")
"""What each tier counts (``TierStack.stats``; summary keys ``tier_<name>_<counter>``)."""


@dataclass(slots=True)
class TierLink:
    """A first-come-first-served link: ``bandwidth`` bytes/s, ``latency`` s per transfer."""

    bandwidth: float
    latency: float
    free_at: float = 0.0  # when the last transfer queued on it ends (s)
    busy_s: float = 0.0  # seconds it has transferred

    def transfer(self, nbytes: float, at: float) -> float:
        """Queue a transfer of ``nbytes`` submitted at ``at`` (s); returns when it ends (s)."""
        duration = self.latency + nbytes / self.bandwidth
        start = at if at > self.free_at else self.free_at
        self.free_at = start + duration
        self.busy_s += duration
        return self.free_at


@dataclass(slots=True)
class Level:
    """One tier of the stack: its contents, its link and its write policy."""

    tier: CacheTier
    link: TierLink
    write: str  # write-through | write-through-after-hits | write-back
    after_hits: int = 0  # N of write-through-after-hits
    load_bytes: float = 0.0
    store_bytes: float = 0.0


@dataclass(slots=True)
class Batch:
    """Keys on their way into one tier, in order, with their parents and priorities."""

    keys: list[Key]
    parents: list[Parent]
    priorities: list[int]

    @classmethod
    def empty(cls) -> Batch:
        return cls([], [], [])

    def add(self, keys: Sequence[Key], parents: Sequence[Parent], priority: int | Sequence[int]) -> None:
        self.keys += keys
        self.parents += parents
        self.priorities += [priority] * len(keys) if isinstance(priority, int) else priority


def chain_parents(keys: Sequence[Key], parent: Parent) -> list[Parent]:
    """The parents of a run of consecutive blocks whose first block's parent is ``parent``."""
    return [parent, *keys[:-1]] if keys else []


class TierStack:
    """One replica's cache tiers, top first (module docstring). ``block_bytes``: bytes of
    one block's KV (all layers, K and V, the whole replica)."""

    def __init__(self, levels: list[Level], block_size: int, block_bytes: float):
        self.levels = levels
        self.block_size = block_size
        self.block_bytes = block_bytes
        self._hits: list[dict[Key, int]] = [{} for _ in levels]  # uses of a key in the tier above, per tier
        self._pending = [Batch.empty() for _ in levels]  # the scheduling batch being collected, per tier

    @property
    def stores_gpu_evictions(self) -> bool:
        """Does the top tier store what the GPU evicts (write-back)?"""
        return self.levels[0].write == "write-back"

    @property
    def counts_gpu_hits(self) -> bool:
        """Does the top tier store a block at its N-th GPU hit (write-through-after-hits)?"""
        return self.levels[0].write == "write-through-after-hits"

    # --- loads -----------------------------------------------------------------------------
    def lookup(self, keys: Sequence[Key], now: float) -> list[int]:
        """Which tier provides each of ``keys`` from the first, up to the first that no tier
        holds ready at ``now``: the tier's index per found key."""
        levels, found = self.levels, []
        for key in keys:
            for i, level in enumerate(levels):
                if level.tier.ready(key, now):
                    found.append(i)
                    break
            else:
                break
        return found

    def start_load(self, keys: Sequence[Key], providers: Sequence[int], now: float, priority: int) -> float:
        """Load ``keys`` (each from the tier ``providers`` names) starting at ``now`` (s):
        one transfer per tier; returns when the last ends (s)."""
        done = now
        for i, level in enumerate(self.levels):
            mine = [k for k, p in zip(keys, providers) if p == i]
            if not mine:
                continue
            level.tier.use(mine, priority)
            nbytes = len(mine) * self.block_bytes
            level.load_bytes += nbytes
            done = max(done, level.link.transfer(nbytes, now))
            if i + 1 < len(self.levels):  # a use of tier i counts toward tier i + 1's after-hits
                meta = level.tier.meta
                self._count_hits(i + 1, mine, [meta[k][0] for k in mine], priority)
        return done

    # --- stores ----------------------------------------------------------------------------
    def gpu_hits(self, keys: Sequence[Key], parents: Sequence[Parent], priority: int) -> None:
        """An admission (or a load) hit ``keys`` in the GPU cache."""
        self._count_hits(0, keys, parents, priority)

    def gpu_evicted(self, keys: Sequence[Key], parents: Sequence[Parent], priorities: Sequence[int]) -> None:
        """The GPU evicted ``keys`` (cached free blocks taken for reuse)."""
        if self.stores_gpu_evictions:
            self._pending[0].add(keys, parents, priorities)

    def flush_scheduling(self, now: float) -> None:
        """The end of a step's scheduling at ``now`` (s): send its write-back and after-hits batch."""
        pending, self._pending = self._pending, [Batch.empty() for _ in self.levels]
        self._flush(pending, now)

    def write_through(self, keys: Sequence[Key], parents: Sequence[Parent], priorities: Sequence[int],
                      now: float) -> None:
        """A step ended at ``now`` (s) and its prefill chunks filled these prompt blocks."""
        batches = [Batch.empty() for _ in self.levels]
        if self.levels[0].write == "write-through":
            batches[0].add(keys, parents, priorities)
        self._flush(batches, now)

    def _count_hits(self, i: int, keys: Sequence[Key], parents: Sequence[Parent], priority: int) -> None:
        level = self.levels[i]
        if level.write != "write-through-after-hits":
            return
        hits, n, batch = self._hits[i], level.after_hits, self._pending[i]
        for key, parent in zip(keys, parents):
            h = hits.get(key, 0) + 1
            hits[key] = h
            if h == n:
                batch.add((key,), (parent,), priority)

    def _flush(self, batches: list[Batch], now: float) -> None:
        """Store each tier's batch, top first; what a tier stores or evicts feeds the next."""
        for i, level in enumerate(self.levels):
            batch = batches[i]
            if not batch.keys:
                continue
            stored, evicted = self._store(level, batch, now)
            if i + 1 < len(self.levels):
                below = self.levels[i + 1].write
                if below == "write-through" and stored:
                    batches[i + 1].add(*_select(batch, stored))
                elif below == "write-back" and evicted:
                    keys, parents, priorities = zip(*evicted)
                    batches[i + 1].add(keys, parents, priorities)

    def _store(self, level: Level, batch: Batch, now: float) -> tuple[list[Key], list]:
        """One transfer into ``level`` of the batch's keys it does not hold (entries take
        room at once and become readable when the transfer ends)."""
        tier = level.tier
        stored, evicted = tier.store(batch.keys, batch.parents, INF, batch.priorities)
        if stored:
            nbytes = len(stored) * self.block_bytes
            end = level.link.transfer(nbytes, now)
            ready = tier.ready_s
            for k in stored:
                if k in ready:  # (not evicted again by a later key of the same batch)
                    ready[k] = end
            level.store_bytes += nbytes
        return stored, evicted

    # --- totals ----------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, float]]:
        """Per tier name: the counters of ``TIER_COUNTERS``."""
        out = {}
        for level in self.levels:
            t = level.tier
            out[t.name] = {
                "hit_blocks": t.hit_blocks,
                "loaded_tokens": t.hit_blocks * self.block_size,
                "load_bytes": level.load_bytes,
                "store_bytes": level.store_bytes,
                "link_busy_s": level.link.busy_s,
                "stored_blocks": t.stored_blocks,
                "dropped_blocks": t.dropped_blocks,
                "evictions": t.evictions,
            }
        return out


def _select(batch: Batch, keys: list[Key]) -> tuple[list[Key], list[Parent], list[int]]:
    """The entries of ``batch`` for ``keys`` (a subset, in batch order)."""
    want = set(keys)
    picked = [j for j, k in enumerate(batch.keys) if k in want]
    return ([batch.keys[j] for j in picked], [batch.parents[j] for j in picked],
            [batch.priorities[j] for j in picked])
