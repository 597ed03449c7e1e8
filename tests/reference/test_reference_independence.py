"""The reference is an oracle only if it shares no mechanics with the fast path, and its
own books balance."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ref_cases import cases, sglang_cases, sglang_pressure_cases, v1_cases

import kvsim
from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.reference.sglang import ReferenceSGLangReplica
from kvsim.simulator.reference.simulation import simulate
from kvsim.simulator.reference.vllm import ReferenceReplica, ReferenceV1Replica

ROOT = Path(kvsim.__file__).parent  # the package's folders: the checkout's, or mutmut's copies
REFERENCE = (
    "simulator/reference/vllm.py",
    "simulator/reference/simulation.py",
    "policies/reference/paged.py",
    "policies/reference/contiguous.py",
    "simulator/reference/sglang.py",
    "policies/reference/radix.py",
    "policies/reference/eviction.py",
    "policies/reference/tier.py",
)
#: The fast path's machinery: clocks, buckets, lazy tables, closed forms, folded logs.
FAST = (
    "kvsim.simulator.engine.simulation",
    "kvsim.simulator.sched.scheduler",
    "kvsim.simulator.sched.vllm_v1",
    "kvsim.simulator.sched.sglang",
    "kvsim.simulator.engine.step_log",
    "kvsim.simulator.latency_histogram",
    "kvsim.simulator.engine.memory_classes",
    "kvsim.simulator.engine.metrics",
    "kvsim.simulator.engine.runner",
    "kvsim.simulator.sched.sequence",
    "kvsim.policies.ledger.paged_allocator",
    "kvsim.policies.ledger.contiguous_allocator",
    "kvsim.policies.ledger.slot_space",
    "kvsim.policies.ledger.block_pool",
    "kvsim.policies.kv_allocator",
    "kvsim.policies.ledger.reservation",
    "kvsim.policies.indexes.radix_cache",
    "kvsim.policies.ledger.v1_prefix_cache",
    "kvsim.policies.indexes.eviction_order",
    "kvsim.policies.indexes.free_block_queue",
    "kvsim.policies.tiers.cache_tier",
    "kvsim.policies.tiers.tier_stack",
)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_reference_imports_none_of_the_fast_machinery():
    for file in REFERENCE:
        used = imported_modules(ROOT / file)
        bad = sorted(m for m in used if any(m == f or m.startswith(f + ".") for f in FAST))
        assert not bad, f"{file} imports the fast path's {bad}"


def test_the_import_check_sees_a_forbidden_import(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text(
        "from kvsim.simulator.sched.scheduler import Scheduler\nimport kvsim.policies.ledger.paged_allocator\n"
    )
    assert {"kvsim.simulator.sched.scheduler", "kvsim.policies.ledger.paged_allocator"} <= imported_modules(planted)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(), v1_cases(), sglang_cases(), sglang_pressure_cases()))
def test_reference_allocators_balance_their_books_after_every_step(case):
    config, requests = case
    checks = []
    replica = {"vllm-v1": ReferenceV1Replica, "sglang": ReferenceSGLangReplica}.get(
        config["scheduler"].get("policy"), ReferenceReplica
    )
    real = replica.complete

    def complete_and_check(self, step, now):
        real(self, step, now)
        self.alloc.check()
        checks.append(1)

    replica.complete = complete_and_check
    try:
        result = simulate(ExperimentConfig.model_validate(config), requests)
    finally:
        replica.complete = real
    assert len(checks) == result.totals.iterations
    for alloc in result.allocators:  # everything ended: all memory is back
        m = alloc.memory()
        assert m.token_states == m.reserved == m.internal_frag == 0
        assert m.free == alloc.capacity


def test_an_sglang_config_runs_under_the_reference_sglang_rules():
    """An sglang config must not silently run under the reference's v0 rules: its replicas
    are ReferenceSGLangReplica over the reference radix cache, with the config's settings."""
    from kvsim.policies.reference.radix import ReferenceRadixCache
    from kvsim.simulator.reference.simulation import ReferenceSimulation

    cfg = ExperimentConfig.model_validate({
        "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb", "kv_cache_gib": 1},
        "workload": {"num_requests": 1, "arrivals": {"kind": "poisson", "rate": 1.0},
                     "lengths": {"kind": "fixed", "prompt_tokens": 8, "output_tokens": 4}},
        "allocator": {"block_size": 16, "eviction_policy": "lfu"},
        "scheduler": {"policy": "sglang", "schedule_policy": "fcfs"}})
    replica = ReferenceSimulation(cfg, []).replicas[0]
    assert type(replica) is ReferenceSGLangReplica
    assert isinstance(replica.alloc, ReferenceRadixCache)
    assert (replica.alloc.eviction, replica.alloc.page_size) == ("lfu", 16)
    assert replica.rules.schedule_policy == "fcfs"
