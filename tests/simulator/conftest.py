"""Fixtures for the simulator tests; also makes this folder's helper module
(``scheduler_cases``) importable by its tests, as tests/reference/conftest.py does."""

import sys
from pathlib import Path

import pytest

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.cost_model import GPUS, MODELS, RooflineCostModel
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings

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
