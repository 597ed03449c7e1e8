"""One naming rule for operator profiles (``kvsim calibrate --import`` writes the name
``kvsim validate`` looks up), and the importer's search for the bundle's licence, which walks
up to the top of the repository the bundle is in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvsim.simulator.app.validate import default_profile
from kvsim.simulator.cost_model import operator_profile
from kvsim.simulator.cost_model.import_files import DEFAULT_OUT_DIR
from kvsim.simulator.cost_model.profile_import import convert, default_name, import_bundle
from kvsim.simulator.cost_model.profile_names import gpu_key, profile_name

SHARED = Path(__file__).resolve().parents[4] / "shared" / "validation" / "profiles-rtxpro6000"

META = {
    "profiler_version": "1.0.0", "vllm_version": "0.19.0", "gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "hardware": "RTXPRO6000", "profiled_at": "2026-01-02T03:04:05+00:00", "architecture": "llama",
    "model": "meta-llama/Llama-3.1-8B", "variant": "bf16", "tp_degrees": [1],
    "engine_effective": {"enforce_eager": True, "block_size": 16, "hf_overrides": {
        "num_hidden_layers": 1, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256}},
    "measurement_iterations": 3,
}
DENSE_OPS = ("embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn",
             "down_proj", "final_layernorm")


def write_bundle(folder: Path, meta: dict = META) -> Path:
    """A small bundle in the upstream layout (no licence of its own)."""
    (folder / "tp1").mkdir(parents=True)
    (folder / "meta.yaml").write_text(yaml.safe_dump(meta))
    rows = ["layer,tokens,time_us"] + [f"{op},{t},{t + i}" for i, op in enumerate(DENSE_OPS) for t in (1, 2, 4)]
    (folder / "tp1" / "dense.csv").write_text("\n".join(rows) + "\n")
    (folder / "tp1" / "per_sequence.csv").write_text("layer,sequences,time_us\nlm_head,1,100\nlm_head,4,110\n")
    (folder / "tp1" / "attention.csv").write_text(
        "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,8.0\n0,0,2,16,10.0\n16,0,0,0,9.5\n"
        "32,0,0,0,11.0\n16,16,0,0,9.75\n")
    return folder


def test_one_rule_names_a_profile():
    assert gpu_key("RTXPRO6000") == gpu_key("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "rtx-pro-6000"
    assert profile_name("rtx-pro-6000", "llama-3.1-8b") == "rtx-pro-6000-llama-3.1-8b"
    assert profile_name("NVIDIA GeForce RTX 4090", "meta-llama/Llama-3.1-8B") == "rtx4090-llama-3.1-8b"
    assert profile_name("RTXPRO6000", "Qwen/Qwen3-32B") == "rtx-pro-6000-qwen3-32b"
    assert profile_name("Some GPU", "org/New Model") == "some-gpu-new-model"  # unknown: its own name
    assert default_name(META) == profile_name("rtx-pro-6000", "llama-3.1-8b")
    assert default_name({**META, "gpu": "NVIDIA Test GPU", "hardware": "TESTGPU", "model": "org/Tiny-1B"}) \
        == "testgpu-tiny-1b"


def test_validate_finds_the_profile_the_importer_wrote(tmp_path, monkeypatch):
    bundle = write_bundle(tmp_path / "bundle")
    out = tmp_path / "profiles"
    path = import_bundle(bundle, out)
    monkeypatch.setattr(operator_profile, "PROFILES_DIR", out)  # as if shipped
    assert default_profile("rtx-pro-6000", "llama-3.1-8b") == path.stem == "rtx-pro-6000-llama-3.1-8b"


def test_validate_finds_a_profile_imported_into_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(operator_profile, "PROFILES_DIR", tmp_path / "none-shipped")
    path = import_bundle(write_bundle(tmp_path / "bundle"), DEFAULT_OUT_DIR)
    assert default_profile("rtx-pro-6000", "llama-3.1-8b") == str(DEFAULT_OUT_DIR / path.name)


def test_the_licence_is_found_at_the_top_of_the_repository(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "LICENSE").write_text("MIT License\n\nCopyright (c) 2024, Upstream Lab\n")
    (repo / "SOURCES.md").write_text("# Sources\nCopied from org/repo at commit abc.\n")
    bundle = write_bundle(repo / "a" / "b" / "c" / "d" / "llama-3.1-8b")  # five folders below the licence
    profile, licence, sources = convert(bundle)
    assert licence == repo / "LICENSE" and sources == repo / "SOURCES.md"
    assert profile.provenance["licence"].startswith("MIT License, Copyright (c) 2024, Upstream Lab")
    # ... but not beyond it: a licence above the repository is someone else's
    (repo / "LICENSE").unlink()
    (tmp_path / "LICENSE").write_text("Another licence\n")
    assert convert(bundle)[0].provenance["licence"] == "unknown"


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/validation/profiles-rtxpro6000 is not here")
@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-32b"])
def test_the_rtx_pro_6000_bundles_import(tmp_path, model):
    path = import_bundle(SHARED / model, tmp_path)
    assert path.name == f"rtx-pro-6000-{model}.yaml"
    profile = operator_profile.read_operator_profile(path)
    assert profile.provenance["licence"].startswith("MIT License")
    assert (tmp_path / f"rtx-pro-6000-{model}.LICENSE").is_file()
    assert sorted(profile.tp) == [1, 2]
    assert (tmp_path / f"{path.name}.kvsim-cache").is_file()  # the importer left its binary copy
    listed = (tmp_path / ".kvsim-files").read_text()
    assert f"{path.name}.kvsim-cache" in listed and json.dumps(path.name)[1:-1] in listed
