"""The one door between a scheduler's GPU cache and the cache tiers below it.

vLLM puts external KV behind a *connector* that its scheduler asks, at admission, how many
more tokens of a request's prompt external storage can give, and then tells to load them
(``KVConnectorBase_V1.get_num_new_matched_tokens`` / ``update_state_after_alloc``, vLLM
docs "KV connector"). kvsim's schedulers talk to their tiers (``policies.tiers.tier_stack``)
the same way, through this class, so a new tier or a new way to move KV (a remote pool, a
prefill replica) is a new connector, not a branch in three admission loops.

A scheduler gives the connector one thing it alone knows: how to name a request's blocks
(``names(group, start, stop)``: the identities of blocks ``start .. stop - 1`` of its
prompt, lazily: a lookup that misses early reads no further). vllm-v0 names blocks by its
prefix cache's chain keys, vllm-v1 by its block identities, SGLang by its radix pages.
Everything else is the same for all three:

- ``found``: at admission, which tier gives each block after the GPU hit, up to the first
  block no tier holds ready (the tokens a tier can give: ``len(found) * block_size``);
- ``load``: start loading them; when the last transfer ends (s);
- ``gpu_hits``: an admission or a load hit these blocks on the GPU (write-through-after-hits
  counts them);
- ``computed``: a prefill chunk filled these prompt blocks; they are written through when
  its step ends (``step_ended``), in one batch per step;
- ``scheduled``: a scheduling ended: its write-back and after-hits stores go out.

Where a request waits while it loads is :mod:`simulator.sched.tier_loads`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from kvsim.policies.tiers.tier_stack import TierStack, chain_parents

#: names(group, start, stop): identities of blocks ``start .. stop - 1`` of a request's prompt
BlockNames = Callable[[Any, int, int], Iterable[Hashable]]


class TierConnector:
    """A scheduler's connector to the ``tiers`` below its GPU cache; ``names`` says what a
    request's blocks are called there (module docstring)."""

    def __init__(self, tiers: TierStack, names: BlockNames):
        self.tiers = tiers
        self.names = names
        #: does the top tier store what the GPU evicts? (the GPU cache then reports evictions)
        self.stores_gpu_evictions = tiers.stores_gpu_evictions
        self._counts_gpu_hits = tiers.counts_gpu_hits
        self._stores: tuple[list, list, list] = ([], [], [])  # this step's prompt blocks: keys, parents, priorities

    # --- admission: what the tiers can give, and loading it ---------------------------------
    def found(self, group: Any, first: int, stop: int, now: float) -> list[int]:
        """Which tier gives each of ``group``'s blocks ``first, first + 1, ...`` (below
        ``stop``), up to the first no tier holds ready at ``now`` (s)."""
        return self.tiers.lookup(self.names(group, first, stop), now) if first < stop else []

    def load(self, group: Any, first: int, found: Sequence[int], now: float, priority: int) -> tuple[float, list]:
        """Start loading ``group``'s blocks from ``first`` on, each from the tier ``found``
        names, at ``now`` (s): (when the last transfer ends (s), the loaded blocks' names)."""
        keys = list(self.names(group, first, first + len(found)))
        return self.tiers.start_load(keys, found, now, priority), keys

    # --- stores ------------------------------------------------------------------------------
    def gpu_hits(self, group: Any, blocks: int, priority: int) -> None:
        """``group`` hit its first ``blocks`` blocks in the GPU cache (counted by after-hits)."""
        if blocks and self._counts_gpu_hits:
            keys = list(self.names(group, 0, blocks))
            self.tiers.gpu_hits(keys, chain_parents(keys, None), priority)

    def computed(self, group: Any, first: int, stop: int, priority: int) -> None:
        """A prefill chunk filled ``group``'s prompt blocks ``first .. stop - 1``: written
        through when the step ends."""
        if stop <= first:
            return
        keys = list(self.names(group, first - 1 if first else 0, stop))
        parent = keys.pop(0) if first else None
        out, parents, priorities = self._stores
        out += keys
        parents += chain_parents(keys, parent)
        priorities += [priority] * len(keys)

    def step_ended(self, now: float) -> None:
        """The step ended at ``now`` (s): write its prefills' prompt blocks through."""
        if self._stores[0]:
            stores, self._stores = self._stores, ([], [], [])
            self.tiers.write_through(*stores, now)

    def scheduled(self, now: float) -> None:
        """A scheduling ended at ``now`` (s): its write-back and after-hits stores go out."""
        self.tiers.flush_scheduling(now)
