"""The policy registry: one entry per ``scheduler.policy`` binds the fast engine's scheduler,
its settings, the paged allocator whose cache index the rules call and the block size its
attention is costed at; each policy's modules load only when it is chosen."""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_configs import TINY

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.v1_prefix_cache import V1PrefixCacheAllocator
from kvsim.simulator.config import SCHEDULER_POLICIES, validate_config
from kvsim.simulator.engine.runner import (
    make_allocator_factory,
    make_cost_factory,
    scheduler_settings,
)
from kvsim.simulator.sched.policy_registry import POLICY_NAMES, policy_entry
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.simulator.sched.sglang import SchedulerSGLang, SGLangSettings
from kvsim.simulator.sched.vllm_v1 import SchedulerV1


def config(policy: str, block_size: int = 8, prefix_caching: bool = False):
    raw = {**TINY, "allocator": {"kind": "paged", "block_size": block_size, "prefix_caching": prefix_caching},
           "scheduler": {"policy": policy}}
    return validate_config(raw, source="test")


def test_each_policy_binds_its_scheduler_settings_and_cache():
    assert POLICY_NAMES == SCHEDULER_POLICIES == ("vllm-v0", "vllm-v1", "sglang")  # the config's, no more
    got = {p: (policy_entry(p).scheduler, policy_entry(p).settings) for p in POLICY_NAMES}
    assert got == {"vllm-v0": (Scheduler, SchedulerSettings), "vllm-v1": (SchedulerV1, SchedulerSettings),
                   "sglang": (SchedulerSGLang, SGLangSettings)}
    for policy, caching, kind in [("vllm-v0", False, PagedAllocator), ("vllm-v0", True, PagedAllocator),
                                  ("vllm-v1", False, PagedAllocator), ("vllm-v1", True, V1PrefixCacheAllocator),
                                  ("sglang", True, RadixCacheAllocator)]:
        cfg = config(policy, prefix_caching=caching)
        alloc = make_allocator_factory(cfg)()
        assert type(alloc) is kind, (policy, caching)
        assert alloc.capacity == cfg.kv_slots // 8 * 8  # whole blocks (pages) of the config's slots
        assert type(scheduler_settings(cfg)) is policy_entry(policy).settings


def test_the_costed_block_and_the_tier_hit_unit_follow_the_policy():
    assert [policy_entry("sglang").kernel_block(b) for b in (1, 16, 64)] == [16, 16, 64]
    assert [policy_entry(p).kernel_block(1) for p in ("vllm-v0", "vllm-v1")] == [1, 1]
    assert make_cost_factory(config("sglang", block_size=1, prefix_caching=True), None)().block_size == 16
    assert make_cost_factory(config("vllm-v1", block_size=1), None)().block_size == 1
    assert {p: policy_entry(p).tier_hit_unit for p in POLICY_NAMES} == {
        "vllm-v0": "hit_blocks", "vllm-v1": "hit_blocks", "sglang": "loaded_tokens"}


def test_an_unknown_policy_is_one_line_naming_the_policies():
    with pytest.raises(ValueError, match=r"^scheduler.policy 'orca': expected one of vllm-v0, vllm-v1, sglang$"):
        policy_entry("orca")


def test_a_vllm_v0_run_loads_no_other_policys_modules():
    """The v1 and SGLang schedulers, their caches and the radix tree stay unimported."""
    code = ("import sys, json\nfrom kvsim.simulator.config import validate_config\n"
            "from kvsim.simulator.engine.runner import run_experiment\n"
            f"run_experiment(validate_config({TINY!r}, source='t'))\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.rsplit('.', 1)[-1] in "
            "('vllm_v1', 'sglang', 'one_sequence', 'radix_cache', 'v1_prefix_cache'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
