"""Fixtures for the simulator tests, and the folder's shared helper modules
(``run_configs``, ``scheduler_cases``) made importable by the tests below it, as
tests/reference/conftest.py does.

``simulate``: a small run with the roofline cost model of a 7B model on an A100.

``tiny``, ``fake_cost``, ``paged``, ``contiguous``: tiny scenarios whose every published
number can be worked out on paper (the rule tests of engine/, sched/ and cost_model/).
The cost model there is a *fake*: a step lasts a constant plus optional per-unit
terms (seconds per prefill token, per attention pair, per decode sequence, per
context token), a swap ``per_block * blocks + per_slot * slots`` and a GPU copy
``copy_per_block * blocks``. Every coefficient is a power of two, so the hand
derivations in the tests hold exactly in floating point. It also records every
``BatchShape`` it is asked about, so a test can read the step shape directly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from kvsim.policies.kv_allocator import KVAllocator
from kvsim.policies.ledger.contiguous_allocator import ContiguousAllocator
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.cost_model.base import BatchShape, CostModel
from kvsim.simulator.engine.metrics import summarize
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.latency_histogram import LatencyHistogram
from kvsim.simulator.sched.scheduler import SchedulerSettings
from kvsim.traces import Request

sys.path.insert(0, str(Path(__file__).parent))


def _simulate(requests, num_blocks=64, block_size=16, swap_blocks=0, allocator=None, **limits):
    limits.setdefault("max_seq_len", 4096)
    make_alloc = allocator or (lambda: PagedAllocator(num_blocks, block_size, swap_blocks))
    sim = Simulation(requests, make_alloc, lambda: RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"]),
                     SchedulerSettings(**limits))
    sim.run()
    return sim, sim.request_rows.frame(), sim.steps.frame()


@pytest.fixture
def simulate():
    """Run a small simulation; returns (Simulation, requests table, steps table)."""
    return _simulate


@dataclass
class FakeCost(CostModel):
    """A step's seconds are affine in its shape; transfers are affine in blocks and slots."""

    step: float = 1.0  # s per step, whatever its shape
    per_prefill_token: float = 0.0  # s per prompt token computed (cached ones excluded)
    per_pair: float = 0.0  # s per causal query-key pair of the prefill
    per_decode_seq: float = 0.0  # s per decoding sequence
    per_context: float = 0.0  # s per context token read by decoding sequences
    swap_per_block: float = 0.0  # s per block (or contiguous region) moved across the host link
    swap_per_slot: float = 0.0  # s per token slot moved
    copy_per_block: float = 0.0  # s per block copied inside GPU memory (copy-on-write)
    block_size: int = 1  # slots per block when a swap's slot count is not given
    shapes: list[BatchShape] = field(default_factory=list)  # every shape asked about, in order

    def step_time(self, shape: BatchShape) -> float:
        self.shapes.append(BatchShape(shape.prefill_seqs, shape.prefill_tokens, shape.prefill_attn_pairs,
                                      shape.decode_seqs, shape.decode_context))
        return (self.step + self.per_prefill_token * shape.prefill_tokens + self.per_pair * shape.prefill_attn_pairs
                + self.per_decode_seq * shape.decode_seqs + self.per_context * shape.decode_context)

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        return self.step + self.per_decode_seq * num_seqs, self.per_context

    def swap_time(self, num_blocks: int, num_slots: int | None = None) -> float:
        slots = num_blocks * self.block_size if num_slots is None else num_slots
        return self.swap_per_block * num_blocks + self.swap_per_slot * slots

    def copy_time(self, num_blocks: int) -> float:
        return self.copy_per_block * num_blocks


@dataclass
class Outcome:
    """A finished tiny run: tables indexed by request id, the summary, the ITL histogram."""

    sim: Simulation
    requests: pd.DataFrame  # indexed by request_id
    steps: pd.DataFrame
    summary: dict
    itl: LatencyHistogram
    cost: FakeCost

    @property
    def alloc(self) -> KVAllocator:
        return self.sim.replicas[0].scheduler.alloc


def run_tiny(requests: Sequence[Request], make_alloc: Callable[[], KVAllocator], cost: FakeCost | None = None,
             macro_steps: bool = True, **limits) -> Outcome:
    """Simulate on one replica with ``cost`` (default: 1 s per step); the watermark is 0
    unless given, so the hand derivations need not round it."""
    limits.setdefault("max_seq_len", 4096)
    limits.setdefault("watermark", 0.0)
    cost = cost or FakeCost()
    sim = Simulation(list(requests), make_alloc, lambda: cost, SchedulerSettings(**limits), macro_steps=macro_steps)
    sim.run()
    req = sim.request_rows.frame()
    itl = sim.replicas[0].scheduler.itl
    summary = summarize(req, sim.steps.totals(), itl, sim.replicas[0].scheduler.alloc.capacity)
    return Outcome(sim, req.set_index("request_id"), sim.steps.frame(), summary, itl, cost)


@pytest.fixture
def tiny():
    """``run_tiny``: simulate a tiny scenario with the fake cost model."""
    return run_tiny


@pytest.fixture
def fake_cost():
    """The ``FakeCost`` class (tests build one with the coefficients they need)."""
    return FakeCost


@pytest.fixture
def paged():
    """``paged(num_blocks, block_size, swap_blocks=0, prefix_caching=False)``: an allocator factory."""
    def make(num_blocks: int, block_size: int, swap_blocks: int = 0, prefix_caching: bool = False):
        return lambda: PagedAllocator(num_blocks, block_size, swap_blocks, prefix_caching=prefix_caching)
    return make


@pytest.fixture
def contiguous():
    """``contiguous(capacity, placement, reservation, max_seq_len=4096, swap_slots=0)``: a factory."""
    def make(capacity: int, placement: str, reservation: str, max_seq_len: int = 4096, swap_slots: int = 0):
        return lambda: ContiguousAllocator(capacity, placement, reservation, max_seq_len, swap_slots)
    return make
