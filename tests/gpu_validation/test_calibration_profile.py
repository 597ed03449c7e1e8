"""Profile format: reading, writing, validation messages, formula evaluation (no torch)."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvsim.gpu_validation.synthetic_profile import EXAMPLE_PATH, synthetic_profile
from kvsim.simulator.cost_model.calibration_profile import (
    GemmTable,
    ProfileError,
    read_profile,
    write_profile,
)


def test_example_profile_is_marked_synthetic_and_complete():
    p = read_profile(EXAMPLE_PATH)
    assert p.metadata.synthetic is True
    assert "NOT MEASURED" in p.metadata.notes
    assert sorted(p.decode_paged) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert sorted(p.block_copy) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # A100-80GB datasheet peak; every implied bandwidth must stay below it
    assert p.metadata.hbm_peak_bytes_per_s == 2.039e12
    assert 1 / p.decode_contiguous.b < 2.039e12
    for fit in p.decode_paged.values():
        assert fit.b > p.decode_contiguous.b  # paging never makes reads cheaper


def test_committed_example_matches_its_generator():
    """The example must be reproducible: `python -m kvsim.gpu_validation.synthetic_profile`."""
    assert read_profile(EXAMPLE_PATH) == synthetic_profile()


def test_round_trip(tmp_path):
    p = read_profile(EXAMPLE_PATH)
    again = read_profile(write_profile(p, tmp_path / "p.yaml"))
    assert again == p
    assert again.to_dict() == p.to_dict()


def test_profile_reader_needs_neither_torch_nor_numpy():
    code = (
        "import sys, kvsim.simulator.cost_model.calibration_profile as m; m.read_profile(sys.argv[1]);"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE_PATH)], check=True, cwd=Path(__file__).parents[2]
    )


def write_yaml(tmp_path, data):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("swap"), r"bad.yaml: swap: missing"),
        (lambda d: d.update(kvsim_profile=2), r"kvsim_profile: expected 1, got 2"),
        (
            lambda d: d["metadata"].update(synthetic="yes"),
            r"metadata.synthetic: expected true or false",
        ),
        (
            lambda d: d["decode_attention"]["paged"][16].update(b="fast"),
            r"decode_attention.paged.16.b: expected a finite number",
        ),
        (
            lambda d: d["decode_attention"]["paged"][16].update(a=-1.0),
            r"decode_attention.paged.16.a: expected a number >= 0",
        ),
        (
            lambda d: d["swap"]["batched"]["in"].update(bytes_per_s=0),
            r"swap.batched.in.bytes_per_s: expected a number > 0",
        ),
        (
            lambda d: d["gemm"]["tables"][0].update(m=[8, 1] + d["gemm"]["tables"][0]["m"][2:]),
            r"gemm.tables\[0\].m: must be increasing",
        ),
        (
            lambda d: d["block_copy"].update(by_block_size={0: {"a": 0, "b": 1}}),
            r"block_copy.by_block_size.0: block sizes must be",
        ),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, mutate, message):
    data = copy.deepcopy(synthetic_profile().to_dict())
    mutate(data)
    with pytest.raises(ProfileError, match=message):
        read_profile(write_yaml(tmp_path, data))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ProfileError, match="no such profile file"):
        read_profile(tmp_path / "nope.yaml")
    bad = tmp_path / "broken.yaml"
    bad.write_text("kvsim_profile: [1,\n")
    with pytest.raises(ProfileError, match="broken.yaml: not valid YAML"):
        read_profile(bad)


def test_unmeasured_block_size_lists_the_measured_ones():
    p = synthetic_profile()
    with pytest.raises(ProfileError, match=r"no block size 12; measured: \[1, 2, 4"):
        p.decode_fit("paged", 12)
    assert p.decode_fit("contiguous", 12) == p.decode_contiguous


def test_gemm_table_interpolation():
    t = GemmTable(n=64, k=32, m=(1, 8, 64), seconds=(1e-5, 2e-5, 1e-4))
    assert t.seconds_at(1) == 1e-5
    assert t.seconds_at(0.5) == 1e-5  # below the table: its first point
    assert t.seconds_at(36) == pytest.approx(2e-5 + (1e-4 - 2e-5) * (36 - 8) / (64 - 8))
    assert t.seconds_at(128) == pytest.approx(2e-4)  # beyond: proportional to m


def test_gemm_lookup_prefers_table_and_falls_back_to_roofline():
    p = synthetic_profile()
    n, k = next(iter(p.gemm_tables))
    assert p.gemm_seconds(8, n, k) == p.gemm_tables[(n, k)].seconds[1]  # m=8 is a table point
    fb = p.gemm_fallback
    m, n2, k2 = 100, 1000, 3000  # not a catalogue shape
    assert (n2, k2) not in p.gemm_tables
    expected = fb.a + max(
        2 * m * n2 * k2 / fb.flops_per_s, (m * k2 + k2 * n2 + m * n2) * 2 / fb.bytes_per_s
    )
    assert p.gemm_seconds(m, n2, k2) == pytest.approx(expected)
    assert p.gemm_seconds(0, n, k) == 0.0
