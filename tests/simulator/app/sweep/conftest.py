"""Tiny sweeps: a 7B model on a 2 GiB KV cache serving 40 generated requests (~30 ms a run)."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]

TINY_BASE = {
    "name": "tiny",
    "seed": 0,
    "model": {"name": "llama-2-7b"},
    "hardware": {"gpu": "a100-80gb", "kv_cache_gib": 2},
    "workload": {
        "arrivals": {"kind": "poisson", "rate": 8.0},
        "lengths": {
            "kind": "uniform",
            "prompt_min": 16,
            "prompt_max": 256,
            "output_min": 16,
            "output_max": 256,
        },
        "num_requests": 40,
    },
    "allocator": {"kind": "paged", "block_size": 16},
}


@pytest.fixture
def tiny_base() -> dict:
    return copy.deepcopy(TINY_BASE)


@pytest.fixture
def write_sweep(tmp_path):
    """Write a sweep file with an inline tiny base; return its path (results: tmp_path/results)."""

    def write(body: dict, filename: str = "sweep.yaml", base: dict | None = None) -> Path:
        doc = {
            "name": "s",
            "base_config": copy.deepcopy(base or TINY_BASE),
            "output_dir": str(tmp_path / "results"),
            **body,
        }
        path = tmp_path / filename
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write
