"""The decode kernel compiled for sm_90 (H100/H200) without a GPU: what the interpreter
cannot show. Runs in a subprocess because this test session interprets the kernels."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = """
import json
from dataclasses import asdict
from kvsim.gpu_validation.ahead_of_time import compile_decode, facts
from kvsim.gpu_validation.paged_attention import DecodeConfig
out = {}
for name, cfg, kw in [
    ("paged", DecodeConfig(64, 4, 3), dict(paged=True)),
    ("contiguous", DecodeConfig(64, 4, 3), dict(paged=False)),
    ("paged_bs1_bf16", DecodeConfig(64, 4, 3), dict(paged=True, block_size=1, dtype="bf16")),
    ("paged_split_deep", DecodeConfig(32, 4, 4), dict(paged=True, split=True, block_size=256)),
]:
    out[name] = asdict(facts(compile_decode(cfg, **kw)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).parents[2]
    env["PYTHONPATH"] = str(repo) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=repo
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_kv_loads_are_16_byte_vectors(compiled):
    for name, f in compiled.items():
        assert f["vector_bytes"] == 16, name


def test_paging_keeps_the_pipeline_as_deep_as_contiguous(compiled):
    """Block numbers fetched a tile ahead: num_stages - 1 K/V tiles in flight either way."""
    assert compiled["paged"]["kv_buffers"] == compiled["contiguous"]["kv_buffers"] == 2
    assert compiled["paged"]["shared_bytes"] == compiled["contiguous"]["shared_bytes"]
    assert compiled["paged_split_deep"]["kv_buffers"] == 3


def test_no_register_spills_and_room_for_several_programs_per_sm(compiled):
    for name, f in compiled.items():
        assert f["spill_bytes"] == 0, name
        # sm_90: 64K registers and 228 KB shared memory per SM; at least 2 programs fit
        assert f["registers"] * 128 * 2 <= 65536, name
        assert 2 * f["shared_bytes"] <= 228 * 1024, name
