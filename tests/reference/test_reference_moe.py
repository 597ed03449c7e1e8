"""A mixture-of-experts deployment (two data-parallel engines, expert parallel: the shipped
``configs/moe/qwen3-30b-a3b.yaml``) under memory pressure: the reference engine and the fast
one agree, step for step, with the MoE block and its collectives in every step's time."""

from __future__ import annotations

from pathlib import Path

from ref_compare import assert_same

from kvsim.simulator.config import load_config
from kvsim.simulator.reference.simulation import simulate
from kvsim.simulator.workload import build_requests

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "moe" / "qwen3-30b-a3b.yaml"


def test_data_parallel_expert_parallel_moe_under_memory_pressure():
    cfg, base_dir = load_config(CONFIG, ["workload.num_requests=80", "workload.arrivals.rate=40",
                                         "model.context_len_tokens=2048", "hardware.num_gpu_blocks=160"])
    requests = list(build_requests(cfg.workload, base_dir=base_dir, seed=cfg.seed, max_seq_len=cfg.model.context_len))
    result = simulate(cfg, requests)
    assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
    assert set(result.requests["replica"]) == {0, 1}, "both engines must serve requests"
    assert_same(cfg, requests)
