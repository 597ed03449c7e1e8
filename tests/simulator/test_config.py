"""Configuration: validated on load; every error names the file, line and key."""

import textwrap

import pytest

from simulator.cli import main
from simulator.config import ConfigError, load_config

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
    assert cfg.preemption.mode == "auto" and cfg.hardware.swap_space_gb == 4.0
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
    assert "request_throughput" in out and "mean_ttft_ms" in out
