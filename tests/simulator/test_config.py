"""Configuration: validated on load; every error names the file, line and key."""

import textwrap
from pathlib import Path

import pytest
import yaml

from kvsim.simulator.app.cli import main
from kvsim.simulator.config import (
    RENAMED,
    CalibratedCostConfig,
    ConfigError,
    ContiguousAllocatorConfig,
    ExperimentConfig,
    PagedAllocatorConfig,
    ProfiledCostConfig,
    RooflineCostConfig,
    SGLangSchedulerConfig,
    VllmV0SchedulerConfig,
    VllmV1SchedulerConfig,
    load_config,
    validate_config,
)

GOOD = """\
name: t
model:
  name: llama-2-7b
hardware:
  gpu: a100-80gb
workload:
  arrivals: {kind: poisson, rate: 2.0}
  lengths: {kind: fixed, prompt_tokens: 100, output_tokens: 20}
  num_requests: 30
allocator:
  kind: paged
  block_size: 16
"""


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(path, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    return str(e.value)


def test_good_config_loads_with_defaults(tmp_path):
    cfg, base = load_config(write(tmp_path, GOOD))
    assert cfg.allocator.watermark == 0.01 and cfg.scheduler.max_num_seqs == 256
    assert cfg.preemption.mode == "auto" and cfg.hardware.swap_space_gib == 4.0
    assert base == tmp_path


def test_block_size_must_be_power_of_two(tmp_path):
    p = write(tmp_path, GOOD.replace("block_size: 16", "block_size: 3"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:12: allocator.block_size:") and "power of two from 1 to 256" in msg


def test_block_size_zero(tmp_path):
    assert "allocator.block_size" in error_of(write(tmp_path, GOOD.replace("block_size: 16", "block_size: 0")))


def test_unknown_key_lists_allowed_keys(tmp_path):
    p = write(tmp_path, GOOD.replace("  block_size: 16", "  block_sise: 16"))
    msg = error_of(p)
    assert f"{p}:12: allocator.block_sise: unknown key" in msg and "block_size" in msg


def test_wrong_type_names_the_value(tmp_path):
    msg = error_of(write(tmp_path, GOOD.replace("block_size: 16", "block_size: big")))
    assert "allocator.block_size" in msg and "'big'" in msg


def test_negative_rate(tmp_path):
    p = write(tmp_path, GOOD.replace("rate: 2.0", "rate: -1"))
    msg = error_of(p)
    assert f"{p}:7: workload.arrivals" in msg and "rate" in msg


def test_model_that_does_not_fit(tmp_path):
    p = write(tmp_path, GOOD.replace("llama-2-7b", "opt-175b").replace("a100-80gb", "a100-40gb"))
    msg = error_of(p)
    assert "leaves no KV memory" in msg and "tensor_parallel" in msg


def test_unknown_model_lists_catalogue(tmp_path):
    msg = error_of(write(tmp_path, GOOD.replace("llama-2-7b", "gpt-5")))
    assert "model.name" in msg and "opt-13b" in msg


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, GOOD + "scheduler: [unclosed\n")
    msg = error_of(p)
    assert msg.startswith(f"{p}:") and "not valid YAML" in msg


def test_override_sets_any_key_and_is_validated(tmp_path):
    p = write(tmp_path, GOOD)
    cfg, _ = load_config(p, ["allocator.block_size=32", "scheduler.max_num_seqs=8"])
    assert cfg.allocator.block_size == 32 and cfg.scheduler.max_num_seqs == 8
    msg = error_of(p, ["allocator.block_size=5"])
    assert msg.startswith("--set: allocator.block_size")
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        load_config(p, ["allocator.block_size"])


def test_cli_reports_one_line_without_traceback(tmp_path, capsys):
    p = write(tmp_path, GOOD.replace("block_size: 16", "block_size: 3"))
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_run_writes_results(tmp_path, capsys):
    import json

    import pandas as pd

    p = write(tmp_path, GOOD)
    assert main(["run", str(p), "--out", str(tmp_path / "res"), "--run", "r1"]) == 0
    run = tmp_path / "res" / "t" / "r1"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 30
    assert len(pd.read_parquet(run / "requests.parquet")) == 30
    assert (run / "steps.parquet").exists() and (run / "memory_timeline.png").stat().st_size > 10_000
    resolved = (run / "config.yaml").read_text()
    assert "watermark: 0.01" in resolved  # defaults are written out
    out = capsys.readouterr().out
    assert "request throughput (req/s)" in out and "mean TTFT (ms)" in out
    assert f"{summary['request_throughput']:.3f}" in out and f"{summary['mean_ttft_ms']:.1f}" in out


# --- variants, units in names, renamed keys ------------------------------------------

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def raw_good() -> dict:
    return yaml.safe_load(GOOD)


def reloaded(cfg: ExperimentConfig) -> ExperimentConfig:
    """The resolved config as a run folder writes it, loaded again."""
    return validate_config(yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json"))))


def test_defaults_are_paged_vllm_v0_roofline_with_an_engine_section():
    raw = raw_good()
    del raw["allocator"]
    cfg = validate_config(raw)
    assert type(cfg.allocator) is PagedAllocatorConfig and cfg.allocator.block_size == 16
    assert type(cfg.scheduler) is VllmV0SchedulerConfig and cfg.scheduler.batching == "iteration"
    assert type(cfg.cost_model) is RooflineCostConfig
    assert cfg.engine.macro_steps is True and cfg.preemption.overlap_swap is False
    assert cfg.hardware.kv_cache_gib is None and cfg.hardware.swap_space_gib == 4.0
    assert cfg.model.context_len_tokens is None and cfg.model.context_len == 4096  # llama-2-7b's window


@pytest.mark.parametrize(("sets", "cls", "absent"), [
    ({"allocator": {"kind": "paged", "block_size": 32, "prefix_caching": True}}, PagedAllocatorConfig,
     ["placement", "reservation", "reserve_tokens", "preset"]),
    ({"allocator": {"kind": "contiguous", "preset": "orca-pow2", "reserve_tokens": 1024}}, ContiguousAllocatorConfig,
     ["block_size", "prefix_caching"]),
    ({"scheduler": {"policy": "vllm-v1", "long_prefill_token_threshold": 64}}, VllmV1SchedulerConfig,
     ["batching", "schedule_policy", "eviction_policy"]),
    ({"scheduler": {"policy": "sglang", "schedule_policy": "fcfs"}}, SGLangSchedulerConfig,
     ["batching", "long_prefill_token_threshold", "reserve_full_isl"]),
    ({"cost_model": {"kind": "calibrated", "profile": "p.yaml", "step_overhead_s": 0.001}}, CalibratedCostConfig,
     ["compute_efficiency", "memory_efficiency", "efficiencies"]),
    ({"cost_model": {"kind": "profiled", "profile": "rtx4090-llama-3.1-8b"}}, ProfiledCostConfig,
     ["compute_efficiency", "efficiencies"]),
])
def test_the_resolved_config_holds_only_its_variants_keys_and_loads_again(sets, cls, absent):
    raw = {**raw_good(), **sets}
    cfg = validate_config(raw)
    section = next(iter(sets))
    assert type(getattr(cfg, section)) is cls
    written = cfg.model_dump(mode="json")[section]
    assert not set(absent) & set(written), written
    assert list(written)[0] in ("kind", "policy")  # the key that picks the variant comes first
    assert reloaded(cfg) == cfg


def test_contiguous_capacity_counts_16_token_blocks_without_a_block_size_key():
    raw = {**raw_good(), "allocator": {"kind": "contiguous", "preset": "orca-max"}}
    raw["hardware"] = {"gpu": "a100-80gb", "num_gpu_blocks": 100}
    cfg = validate_config(raw)
    assert cfg.allocator.block_size == 16 and cfg.allocator.prefix_caching is False
    assert cfg.kv_slots == 1600


def test_profiled_overhead_left_unset_stays_zero_when_the_resolved_config_is_reloaded():
    """Before: the resolved config wrote the roofline's default overhead, and reloading it
    set that overhead on a profiled run (which runs with none unless asked)."""
    from kvsim.simulator.engine.runner import make_cost_factory

    raw = {**raw_good(), "cost_model": {"kind": "profiled", "profile": "rtx4090-llama-3.1-8b"}}
    raw["model"] = {"name": "llama-3.1-8b", "context_len_tokens": 4096}
    raw["hardware"] = {"gpu": "rtx4090"}
    raw["scheduler"] = {"max_num_batched_tokens": 4096}
    cfg = validate_config(raw)
    again = reloaded(cfg)
    assert again.cost_model.step_overhead_s is None
    assert make_cost_factory(again, Path("."))().step_overhead_s == 0.0
    set_ = validate_config({**raw, "cost_model": {**raw["cost_model"], "step_overhead_s": 0.002}})
    assert make_cost_factory(reloaded(set_), Path("."))().step_overhead_s == 0.002


@pytest.mark.parametrize(("section", "text", "key", "reader"), [
    ("allocator", "kind: contiguous\n  block_size: 16", "allocator.block_size", "kind paged (allocator.kind is "
     "contiguous)"),
    ("allocator", "kind: paged\n  placement: first_fit", "allocator.placement", "kind contiguous (allocator.kind "
     "is paged)"),
    ("scheduler", "policy: vllm-v1\n  batching: request", "scheduler.batching", "policy vllm-v0 (scheduler.policy "
     "is vllm-v1)"),
    ("scheduler", "policy: sglang\n  reserve_full_isl: false", "scheduler.reserve_full_isl", "policy vllm-v1"),
    ("cost_model", "kind: profiled\n  profile: x\n  efficiencies: measured-rtx4090", "cost_model.efficiencies",
     "kind roofline (cost_model.kind is profiled)"),
    ("cost_model", "kind: roofline\n  profile: x", "cost_model.profile", "kind calibrated or profiled"),
])
def test_a_key_the_chosen_variant_ignores_names_its_line_and_the_variant_that_reads_it(
        tmp_path, section, text, key, reader):
    p = write(tmp_path, GOOD.replace("allocator:\n  kind: paged\n  block_size: 16\n", "") + f"{section}:\n  {text}\n")
    line = len(GOOD.replace("allocator:\n  kind: paged\n  block_size: 16\n", "").splitlines()) + 2 + text.count("\n")
    assert error_of(p).startswith(f"{p}:{line}: {key}: allowed only with {reader}")


def test_a_null_key_of_another_variant_is_unset_so_sweeps_can_zip_it(tmp_path):
    raw = {**raw_good(), "allocator": {"kind": "paged", "preset": None, "reserve_tokens": None}}
    assert validate_config(raw).allocator == PagedAllocatorConfig()
    raw = {**raw_good(), "allocator": {"kind": "contiguous", "block_size": None}}
    assert validate_config(raw).allocator == ContiguousAllocatorConfig()
    with pytest.raises(ConfigError, match="allocator.block_size: allowed only with kind paged"):
        validate_config({**raw_good(), "allocator": {"kind": "contiguous", "block_size": 16}})
    with pytest.raises(ConfigError, match="allocator.block_size: Input should be a valid integer"):  # its own key
        validate_config({**raw_good(), "allocator": {"kind": "paged", "block_size": None}})


def test_an_unknown_variant_names_the_choices(tmp_path):
    p = write(tmp_path, GOOD.replace("kind: paged", "kind: slab"))
    assert error_of(p) == f"{p}:11: allocator.kind: must be one of paged, contiguous (got slab)"
    msg = error_of(write(tmp_path, GOOD + "cost_model: {kind: measured}\n"))
    assert "cost_model.kind: must be one of roofline, calibrated, profiled (got measured)" in msg


def test_an_unknown_key_of_no_variant_lists_the_keys_of_the_chosen_one(tmp_path):
    msg = error_of(write(tmp_path, GOOD + "scheduler:\n  policy: vllm-v1\n  budget: 3\n"))
    assert msg.endswith("scheduler.budget: unknown key; allowed here: policy, max_num_seqs, max_num_batched_tokens, "
                        "router, long_prefill_token_threshold, max_num_partial_prefills, reserve_full_isl")


OLD_KEYS = {  # each renamed key as an old config wrote it, and its line in GOOD + that text
    ("hardware", "kv_cache_gb"): ("hardware:\n  kv_cache_gb: 12\n", 2),
    ("hardware", "swap_space_gb"): ("hardware:\n  swap_space_gb: 8\n", 2),
    ("model", "max_seq_len"): ("model:\n  max_seq_len: 2048\n", 2),
    ("model", "shape", "max_seq_len"): ("model:\n  shape:\n    max_seq_len: 2048\n", 3),
    ("allocator", "max_seq_len"): ("allocator:\n  kind: contiguous\n  max_seq_len: 2048\n", 3),
    ("scheduler", "macro_steps"): ("scheduler:\n  macro_steps: false\n", 2),
    ("scheduler", "eviction_policy"): ("scheduler:\n  policy: sglang\n  eviction_policy: lfu\n", 3),
}


def test_every_renamed_key_is_in_the_table():
    assert set(OLD_KEYS) == set(RENAMED)


@pytest.mark.parametrize("old", list(OLD_KEYS), ids=".".join)
def test_an_old_key_names_its_new_name_and_line(tmp_path, old):
    text, offset = OLD_KEYS[old]
    base = "\n".join(line for line in GOOD.splitlines() if not line.startswith(old[0] + ":")
                     and not (old[0] == "hardware" and line.startswith("  gpu"))
                     and not (old[0] == "model" and line.startswith("  name"))
                     and not (old[0] == "allocator" and line.startswith(("  kind", "  block_size")))) + "\n"
    p = write(tmp_path, base + text)
    line = len(base.splitlines()) + offset
    assert error_of(p) == f"{p}:{line}: {'.'.join(old)} was renamed {RENAMED[old]}"
    assert error_of(write(tmp_path, GOOD, "ok.yaml"), [f"{'.'.join(old)}=1"]) == \
        f"--set: {'.'.join(old)} was renamed {RENAMED[old]}"


def test_an_old_key_validated_directly_names_its_new_name():
    from pydantic import ValidationError

    raw = raw_good()
    raw["hardware"]["kv_cache_gb"] = 12
    with pytest.raises(ValidationError, match="hardware.kv_cache_gb was renamed hardware.kv_cache_gib"):
        ExperimentConfig.model_validate(raw)


def test_new_names_carry_the_values_the_old_ones_did(tmp_path):
    raw = raw_good()
    raw["hardware"] = {"gpu": "a100-80gb", "kv_cache_gib": 2, "swap_space_gib": 1}
    raw["model"] = {"name": "llama-2-7b", "context_len_tokens": 1024}
    raw["allocator"] = {"kind": "contiguous", "reserve_tokens": 512}
    raw["engine"] = {"macro_steps": False}
    cfg = validate_config(raw)
    assert cfg.kv_slots == 2 * 2048  # llama-2-7b: 0.5 MiB per token
    assert cfg.model.context_len == 1024 and cfg.allocator.reserve_tokens == 512
    assert cfg.max_num_batched_tokens == 2048 and cfg.engine.macro_steps is False
    with pytest.raises(ConfigError, match="allocator.reserve_tokens .5000. is larger than the KV cache"):
        validate_config({**raw, "allocator": {"kind": "contiguous", "reserve_tokens": 5000}})


def test_every_shipped_config_and_sweep_loads():
    """Every config under configs/ uses today's names (a sweep: every point of it)."""
    from kvsim.simulator.app.sweep import expand_points, load_sweep, validate_points

    paths = sorted(CONFIGS.rglob("*.yaml"))
    assert len(paths) >= 20
    for path in paths:
        raw = yaml.safe_load(path.read_text())
        if {"grid", "zip", "base", "base_config"} & set(raw):
            spec = load_sweep(path)
            validate_points(spec, expand_points(spec))
        else:
            load_config(path)
