"""Cache tiers (``allocator.tiers``) for the tier differential tests of vllm-v1, sglang and v0: a
tier of an exact block count, one or two tiers drawn by hypothesis or from a seeded
``random.Random``, and the measure of what seeded cases reach (loads, a second tier's
loads, load waits, tier evictions, transfers queued for a link) that tells the
comparison is not vacuous.

A tier's capacity is given in blocks of ``B`` tokens of Llama-2-7B (0.5 MiB per token), a
dyadic GiB count, so the simulator's rounding never moves it."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ref_cases import SLOTS_PER_GIB, base_config
from ref_compare import case_source, check_case, differences, differential_settings
from reuse_cases import seeded_reuse_requests

from kvsim.policies.indexes.eviction_order import EVICTION_POLICIES
from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference.simulation import ReferenceSimulation

WRITES = ("write-through", "write-through-after-hits", "write-back")
BYTES_PER_TOKEN = 2**30 // SLOTS_PER_GIB  # Llama-2-7B: 0.5 MiB of KV per token
TIER_NAMES = ("cpu", "disk")
#: hypothesis cases per write policy (KVSIM_HYPOTHESIS_PROFILE=long: many more)
EXAMPLES = {"default": 8, "long": 400}[os.environ.get("KVSIM_HYPOTHESIS_PROFILE", "default")]


def tier(name: str, blocks: int, B: int, eviction: str, write: str, hits: int,
         gb_s: float, latency_s: float) -> dict:
    """A tier of exactly ``blocks`` blocks of ``B`` tokens behind a link of ``gb_s`` GB/s and
    ``latency_s`` s a transfer; ``hits`` is read by ``write-through-after-hits`` only."""
    t = {"name": name, "capacity_gib": blocks * B * BYTES_PER_TOKEN / 2**30,
         "link": {"bandwidth_gb_s": gb_s, "latency_s": latency_s},
         "eviction_policy": eviction, "write_policy": write}
    if write == "write-through-after-hits":
        t["write_after_hits"] = hits
    return t


@st.composite
def tier_lists(draw, B: int, top_write: str, blocks: st.SearchStrategy[int],
               gb_s: list[float], latency_s: list[float]) -> list[dict]:
    """One or two tiers of ``blocks`` blocks of ``B`` tokens each, the top one with
    ``top_write``; links from ``gb_s`` x ``latency_s`` (list the likelier ones first)."""
    tiers = []
    for i, name in enumerate(TIER_NAMES[: draw(st.integers(1, 2))]):
        tiers.append(tier(
            name, draw(blocks), B, draw(st.sampled_from(EVICTION_POLICIES)),
            top_write if i == 0 else draw(st.sampled_from(WRITES)), draw(st.integers(1, 3)),
            draw(st.sampled_from(gb_s)), draw(st.sampled_from(latency_s)),
        ))
    return tiers


def tier_differential_test(name: str, cases: Callable[[str], st.SearchStrategy[tuple[dict, list]]]):
    """The test ``name``: per top-tier write policy, the fast engine equals the reference on
    ``EXAMPLES`` cases drawn from ``cases(write)`` (a failing case is noted as its source).
    Named before hypothesis wraps it, so each test keeps its own example database."""
    def test(write, data):
        config, requests = data.draw(cases(write))
        check_case(config, requests)

    test.__name__ = test.__qualname__ = name
    test = given(data=st.data())(test)
    test = differential_settings(EXAMPLES)(test)
    return pytest.mark.parametrize("write", WRITES)(test)


def seeded_tiers(rng: random.Random, B: int, top_write: str) -> list[dict]:
    """One or two tiers of 64-512 tokens from ``rng`` (the top one with ``top_write``)."""
    tiers = []
    for i, name in enumerate(TIER_NAMES[: rng.randint(1, 2)]):
        blocks = rng.choice([4, 8, 16, 32]) * 16 // B
        tiers.append(tier(name, blocks, B, rng.choice(EVICTION_POLICIES),
                          top_write if i == 0 else rng.choice(WRITES), rng.randint(1, 2),
                          rng.choice([0.25, 1.0, 4.0]), rng.choice([0.0, 1e-3])))
    return tiers


def seeded_tier_case(seed: int, block_sizes: list[int],
                     engine: Callable[[random.Random, int], tuple[dict, dict]],
                     ) -> tuple[dict, list]:
    """A tier case from ``random.Random(seed)`` (the same case in every run: a measured count
    must not move): a GPU cache of one or two 256-token prompts (so it evicts), the
    ``allocator`` and ``scheduler`` settings ``engine(rng, block_size)`` draws, one or two
    tiers (the top one writing by ``WRITES[seed % 3]``) and 16-24 requests reusing three
    prefixes."""
    rng = random.Random(seed)
    B = rng.choice(block_sizes)
    cfg = base_config(256, rng.randint(256, 384), 0)
    cfg["allocator"], cfg["scheduler"] = engine(rng, B)
    cfg["allocator"]["tiers"] = seeded_tiers(rng, B, WRITES[seed % 3])
    return cfg, seeded_reuse_requests(rng, 16, 24, min_prompt=33)


@dataclass
class TierReach:
    """How many seeded cases reach each thing the tier differential tests are for."""

    loading: int = 0  # a request loads from a tier
    second: int = 0  # ... from the second tier ("disk")
    waiting: int = 0  # a request waits for its load before its first token
    evicting: int = 0  # a tier evicts
    contended: int = 0  # a transfer waits for its link
    per_write: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WRITES, 0))  # loading
    disagree: dict[int, tuple] = field(default_factory=dict)  # seed -> (first differences, case)


def tier_reach(seeded_case, seeds: int) -> TierReach:
    """Runs ``seeded_case(seed)`` for ``seed < seeds`` (top-tier write ``WRITES[seed % 3]``) in
    both engines, records where they disagree, checks the reference's books balance, and
    counts what the cases reach."""
    reach = TierReach()
    for seed in range(seeds):
        config, requests = seeded_case(seed)
        if diffs := differences(config, requests):
            reach.disagree[seed] = (diffs[:3], case_source(config, requests))
        sim = ReferenceSimulation(ExperimentConfig.model_validate(config), requests)
        ref = sim.run()
        stats = ref.tier_stats
        loads = sum(s["hit_blocks"] for s in stats.values()) > 0
        reach.loading += loads
        reach.per_write[WRITES[seed % 3]] += loads
        reach.second += stats.get("disk", {}).get("hit_blocks", 0) > 0
        reach.waiting += (ref.requests["load_wait_s"] > 0).any()
        reach.evicting += sum(s["evictions"] for s in stats.values()) > 0
        reach.contended += sum(sum(r.tiers.queued) for r in sim.replicas) > 0
        for replica in sim.replicas:  # the books balance at the end
            replica.alloc.check()
            for t in replica.tiers.tiers:
                t.check()
        loaded = sum(s["loaded_tokens"] for s in stats.values())
        assert ref.requests["loaded_tokens"].sum() == loaded
    return reach


def assert_agree(reach: TierReach) -> None:
    """The engines agreed on every seeded case (else: the seeds, and the first case's source)."""
    first = next(iter(reach.disagree.values()), None)
    assert not reach.disagree, f"the engines disagree on seeds {sorted(reach.disagree)}: {first}"

