"""One entry per ``scheduler.policy``, looked up once per run: what the fast engine needs for
that policy.

- ``scheduler``: the scheduler class (its rules);
- ``settings``: the settings class it reads (the shared limits, plus the policy's own keys);
- ``paged_cache``: the allocator a paged config gets, whose cache index the rules call
  (None: the plain ``PagedAllocator``, with vLLM v0's prefix cache when asked for);
- ``kernel_block``: the block size its attention kernel is costed at, from the config's;
- ``tier_hit_unit``: the tier counter its cache's lookups are counted in (vLLM's caches
  count them in blocks, the radix cache in tokens), for the tiers' hit ratios.

Each entry imports its policy's modules only when it is looked up, so a run loads the code of
its own policy alone (a vllm-v0 run starts without the v1 and SGLang schedulers, their caches
and the radix tree: ``benchmarks.startup``). The reference engine picks its own rules
(``simulator.reference.simulation``): it shares no code with this one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from kvsim.policies.kv_allocator import KVAllocator
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings

#: ``paged_cache(blocks, block_size, eviction_policy)``: one replica's allocator
PagedCache = Callable[[int, int, str], KVAllocator]


@dataclass(frozen=True)
class PolicyEntry:
    scheduler: type[Scheduler]
    settings: type[SchedulerSettings]
    paged_cache: PagedCache | None  # with prefix caching (vllm-v1) or always (sglang)
    cache_needs_prefix_caching: bool  # vllm-v1: its cache only when prefix caching is on
    kernel_block: Callable[[int], int]  # config block size -> costed block size
    tier_hit_unit: str = "hit_blocks"  # or "loaded_tokens"


def _same(block: int) -> int:
    return block


def _vllm_v0() -> PolicyEntry:
    return PolicyEntry(Scheduler, SchedulerSettings, None, False, _same)


def _vllm_v1() -> PolicyEntry:
    from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
    from kvsim.simulator.sched.vllm_v1 import SchedulerV1

    return PolicyEntry(SchedulerV1, SchedulerSettings, V1PrefixCacheAllocator, True, _same)


def _sglang_kernel_block(block: int) -> int:
    """SGLang's attention kernels (FlashInfer, FA3) read KV through a token index table, not
    vLLM's per-block gather: costed as vLLM's at 16 tokens when its pages are smaller."""
    return max(block, 16)


def _sglang() -> PolicyEntry:
    from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
    from kvsim.simulator.sched.sglang import SchedulerSGLang, SGLangSettings

    # the radix cache holds slots (pages of block_size tokens), not blocks
    return PolicyEntry(SchedulerSGLang, SGLangSettings,
                       lambda blocks, block_size, eviction: RadixCacheAllocator(blocks * block_size, block_size, eviction),
                       False, _sglang_kernel_block, "loaded_tokens")


_LOADERS: dict[str, Callable[[], PolicyEntry]] = {"vllm-v0": _vllm_v0, "vllm-v1": _vllm_v1, "sglang": _sglang}
POLICY_NAMES = tuple(_LOADERS)


@functools.cache
def policy_entry(policy: str) -> PolicyEntry:
    """The entry of ``scheduler.policy`` (its modules imported on the first look-up)."""
    try:
        load = _LOADERS[policy]
    except KeyError:
        raise ValueError(f"scheduler.policy {policy!r}: expected one of {', '.join(POLICY_NAMES)}") from None
    return load()
