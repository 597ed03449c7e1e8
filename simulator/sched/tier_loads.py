"""The one rule every scheduler with cache tiers follows while a request loads from them.

vllm-v0 (``simulator.sched.scheduler``), vllm-v1 and sglang (``simulator.sched.one_sequence``)
each decide on their own when a request loads (``policies.tiers.tier_stack``) and what its
load's end does to their GPU cache (``_load_done``). The rest is the same for all three:
the request waits outside the queues and the batch, by when its load ends (s); the engine
is told to wake then; and at the end it goes back to the *front* of the waiting queue,
where a GPU cache hit awaits it. Every call to the tiers goes through one connector
(``simulator.sched.tier_connector``), built here from how the scheduler names its blocks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING

from kvsim.simulator.sched.tier_connector import TierConnector

if TYPE_CHECKING:
    from collections import deque

    from kvsim.policies.tiers.tier_stack import TierStack
    from kvsim.simulator.sched.sequence import SequenceGroup

INF = float("inf")


class TierLoads:
    """Base of a scheduler whose requests may load from cache tiers. The scheduler keeps
    ``now`` (s) and ``waiting`` (a deque or a list: both take ``insert(0, g)``), names its
    blocks for the tiers by ``_block_names``, starts a load by ``_await_load`` and says what
    its end caches by ``_load_done``. ``connector``: its door to the tiers (None: no tiers)."""

    now: float  # the scheduler's clock (s)
    waiting: deque[SequenceGroup] | list[SequenceGroup]

    def __init__(self, tiers: TierStack | None) -> None:
        self.tiers = tiers  # (their counters: the engine reads ``tiers.stats()``)
        self.connector = TierConnector(tiers, self._block_names) if tiers is not None else None
        # Requests loading, by when their load ends:
        # (end s, seq, group, start s, what ``_load_done`` needs)
        self.loading: list[tuple] = []
        self.on_load: Callable[[float], None] | None = None  # the engine's wake-up at a load's end
        #: When the next load ends (s; inf: none in flight). A plain attribute kept on each
        #: push and pop, not a property: the fast path reads it for every run it plans.
        self.next_load_s = INF

    def _await_load(self, done: float, s: int, g: SequenceGroup, *facts) -> None:
        """``g`` (sequence ``s``) waits outside the queues for its load, which ends at ``done``
        (s); the engine is told to wake then."""
        heapq.heappush(self.loading, (done, s, g, self.now, *facts))
        self.next_load_s = self.loading[0][0]
        if self.on_load is not None:
            self.on_load(done)

    def finish_loads(self, now: float) -> None:
        """Loads that ended by ``now`` (s): the scheduler caches what each loaded, and each
        request goes back to the front of the waiting queue (a GPU cache hit awaits it)."""
        loading = self.loading
        while loading and loading[0][0] <= now:
            done, s, g, start, *facts = heapq.heappop(loading)
            g.back_from_load(self._load_done(s, g, *facts), start, done)
            self.waiting.insert(0, g)
        self.next_load_s = loading[0][0] if loading else INF

    def _block_names(self, g: SequenceGroup, start: int, stop: int) -> Iterable[Hashable]:
        """What blocks ``start .. stop - 1`` of ``g``'s prompt are called in the tiers."""
        raise NotImplementedError

    def _load_done(self, s: int, g: SequenceGroup, *facts) -> int:
        """Cache what sequence ``s``'s load brought (``facts``: what ``_await_load`` was
        given after ``g``); return the tokens it loaded."""
        raise NotImplementedError
