"""Rules of the tier stack (``policies.tiers.tier_stack.TierStack``) that two tiers cannot show:
with three tiers, what a tier stores or evicts goes to the tier *below* it (with two, the
tier below the top is also the last one, so "below" and "the last" agree), and a load from
tier ``i`` counts toward tier ``i + 1``'s after-hits store with each block's chain parent.
Also ``chain_parents`` of an empty run.

Written for the survivors of the module's mutation campaign (mutation/README.md); each test
fails under the mutants named in its docstring. Links: 1000 B/s, 1 s per transfer; blocks of
100 bytes, so a transfer of k blocks takes 1 + k / 10 s."""

from __future__ import annotations

import pytest

from kvsim.policies.tiers.cache_tier import CacheTier
from kvsim.policies.tiers.tier_stack import Level, TierLink, TierStack, chain_parents

B = 4


def stack(*levels: tuple[int, str, int, str]) -> TierStack:
    """Tiers t0, t1, ... of (capacity blocks, write policy, after-hits N, eviction)."""
    return TierStack([Level(CacheTier(f"t{i}", cap, ev), TierLink(1000.0, 1.0), write, n)
                      for i, (cap, write, n, ev) in enumerate(levels)], B, 100.0)


def held(s: TierStack) -> list[list[str]]:
    """Each tier's keys, sorted."""
    return [sorted(level.tier.ready_s) for level in s.levels]


def test_chain_parents_of_an_empty_run_is_empty():
    """No blocks, no parents (``x_chain_parents`` mutant 2 gave ``[parent]``)."""
    assert chain_parents([], "p") == []
    assert chain_parents(["a", "b", "c"], "p") == ["p", "a", "b"]


def test_a_write_through_tier_takes_what_the_tier_above_stored_not_the_last_tiers_choice():
    """t0 (write-through, 1 block) stores a then b, evicting a; t1 (write-through) stores
    both, as t0 stored both; t2 (write-back) stores what t1 evicted: nothing. Reading the
    write policy of the tier above instead of below (``_flush`` mutant 16: t2's write-back
    sends t0's eviction a alone) or sending t0's stores to the last tier (mutant 22) differ."""
    s = stack((1, "write-through", 0, "lru"), (5, "write-through", 0, "lru"), (5, "write-back", 0, "lru"))
    s.write_through(["a", "b"], [None, "a"], [0, 0], now=0.0)
    assert held(s) == [["b"], ["a", "b"], []]
    assert s.levels[1].tier.ready_s == {"a": pytest.approx(1.2), "b": pytest.approx(1.2)}
    assert s.stats()["t1"]["stored_blocks"] == 2 and s.stats()["t2"]["stored_blocks"] == 0


def test_a_write_back_tier_takes_what_the_tier_above_evicted():
    """Three write-back tiers of 1, 1 and 5 blocks; the GPU evicts a, b, c. t0 keeps c and
    evicts a, b into t1, which keeps b and evicts a into t2 (``_flush`` mutant 39 sent t0's
    evictions to the last tier, skipping t1)."""
    s = stack((1, "write-back", 0, "lru"), (1, "write-back", 0, "lru"), (5, "write-back", 0, "lru"))
    s.gpu_evicted(["a", "b", "c"], [None, "a", "b"], [0, 1, 2])
    s.flush_scheduling(0.0)
    assert held(s) == [["c"], ["b"], ["a"]]
    assert s.levels[1].tier.meta == {"b": ("a", 1)} and s.levels[2].tier.meta == {"a": (None, 0)}
    assert [s.stats()[f"t{i}"]["evictions"] for i in range(3)] == [2, 1, 0]


def test_a_load_counts_toward_the_after_hits_store_of_the_tier_below_with_parents():
    """t0 holds the chain a -> b; t1 stores a block at its first load from t0
    (write-through-after-hits, N = 1; eviction ``priority``, so it keeps parents). A load of
    a, b from t0 at priority 2 queues them for t1 with their chain parents, stored at the
    next scheduling's end (2 s; ready at 2 + 1.2 s). Counting the load toward the last tier
    (``start_load`` mutant 40) stores nothing in t1; passing priorities as parents (mutant
    42) gives b the parent 0."""
    s = stack((5, "write-through", 0, "lru"), (5, "write-through-after-hits", 1, "priority"),
              (5, "write-back", 0, "lru"))
    s.levels[0].tier.store(["a", "b"], [None, "a"], 0.0, [0, 0])
    assert s.lookup(["a", "b", "c"], now=1.0) == [0, 0]
    assert s.start_load(["a", "b"], [0, 0], now=1.0, priority=2) == pytest.approx(2.2)
    s.flush_scheduling(2.0)
    t1 = s.levels[1].tier
    assert t1.meta == {"a": (None, 2), "b": ("a", 2)} and t1.children == {"a": 1}
    assert t1.ready_s == {"a": pytest.approx(3.2), "b": pytest.approx(3.2)}
    assert held(s)[2] == []
    s.start_load(["a"], [0], now=4.0, priority=0)  # a second load is no first hit: nothing more
    s.flush_scheduling(5.0)
    assert s.stats()["t1"]["stored_blocks"] == 2 and s.levels[1].store_bytes == 200
