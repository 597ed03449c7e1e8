"""The workload config: validation, path lookup and the requests it builds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kvsim.simulator.workload import WorkloadConfig, build_requests, resolve_data_path
from kvsim.traces import data_path, trace_stats

AZURE_CONV = "traces/data/AzureLLMInferenceTrace_conv.csv"


def config(text: str) -> WorkloadConfig:
    return WorkloadConfig.model_validate(yaml.safe_load(text))


def build(text: str, *, seed: int = 0, base_dir: Path = Path("."), **kwargs):
    return list(build_requests(config(text), base_dir=base_dir, seed=seed, **kwargs))


# --- the documented examples ---------------------------------------------------------------------


def test_azure_trace_with_a_ten_minute_window():
    requests = build(
        f"{{trace: {{format: azure, path: {AZURE_CONV}}}, window: {{duration_s: 600}}}}"
    )
    full = trace_stats(build(f"{{trace: {{format: azure, path: {AZURE_CONV}}}}}"))
    assert full["count"] == 19_366
    assert 0 < len(requests) < full["count"]
    assert requests[-1].arrival_time < 600 and requests[0].arrival_time == 0.0
    # At the trace's ~5.5 req/s, ten minutes hold about 3300 requests.
    assert len(requests) == pytest.approx(600 * 5.5, rel=0.2)


def test_poisson_sharegpt_preset():
    requests = build(
        "{arrivals: {kind: poisson, rate: 2.0}, lengths: {kind: preset, name: sharegpt-paper},"
        " num_requests: 1000}"
    )
    stats = trace_stats(requests)
    assert stats["count"] == 1000
    assert stats["mean_rate_per_s"] == pytest.approx(2.0, rel=0.1)
    assert stats["prompt_mean"] == pytest.approx(161.31, rel=0.1)
    assert [r.request_id for r in requests] == list(range(1000))


# --- generators ------------------------------------------------------------------------------------

GAMMA_UNIFORM = (
    "{arrivals: {kind: gamma, rate: 4.0, cv: 2.0},"
    " lengths: {kind: uniform, prompt_min: 10, prompt_max: 20, output_min: 1, output_max: 5},"
    " num_requests: 2000}"
)


def test_seed_fixes_the_workload():
    assert build(GAMMA_UNIFORM, seed=3) == build(GAMMA_UNIFORM, seed=3)
    assert build(GAMMA_UNIFORM, seed=3) != build(GAMMA_UNIFORM, seed=4)


def test_rate_scale_speeds_up_a_generator():
    slow = build(GAMMA_UNIFORM)
    fast = build(GAMMA_UNIFORM[:-1] + ", rate_scale: 2.0}")
    # Same seed, rate doubled: every gap exactly halves.
    assert [f.arrival_time for f in fast] == pytest.approx([s.arrival_time / 2 for s in slow])


def test_duration_limits_a_generator():
    requests = build(
        "{arrivals: {kind: constant, rate: 10}, lengths: {kind: fixed, prompt_tokens: 5,"
        " output_tokens: 5}, duration_s: 3}"
    )
    assert len(requests) == 30 and requests[-1].arrival_time == pytest.approx(2.9)


def test_pool_lengths_from_a_shipped_file_with_the_sharegpt_filter():
    requests = build(
        "{arrivals: {kind: poisson, rate: 5}, lengths: {kind: pool,"
        " path: sharegpt_8k_filtered_stats_llama2_tokenizer.csv}, num_requests: 3000,"
        " sharegpt_filter: true}"
    )
    assert len(requests) == 3000
    assert all(
        4 <= r.prompt_tokens <= 1024 and r.prompt_tokens + r.output_tokens <= 2048 for r in requests
    )


def test_lognormal_lengths():
    requests = build(
        "{arrivals: {kind: poisson, rate: 5}, lengths: {kind: lognormal, prompt_mean: 300,"
        " prompt_std: 100, output_mean: 50, output_std: 10}, num_requests: 20000}"
    )
    assert trace_stats(requests)["prompt_mean"] == pytest.approx(300, rel=0.02)


# --- traces and transforms -------------------------------------------------------------------------


def test_mooncake_trace_rate_scale_and_count_window():
    requests = build(
        "{trace: {path: synthetic_trace.jsonl}, rate_scale: 4, window: {num_requests: 100}}"
    )
    original = build("{trace: {path: synthetic_trace.jsonl}, window: {num_requests: 100}}")
    assert len(requests) == 100 and requests[0].hash_ids is not None
    assert [r.arrival_time * 4 for r in requests] == pytest.approx(
        [r.arrival_time for r in original]
    )


def test_time_window_starting_later():
    requests = build(
        f"{{trace: {{path: {AZURE_CONV}}}, window: {{start_s: 1000, duration_s: 60}}}}"
    )
    assert requests[0].request_id == 0
    assert all(0 <= r.arrival_time < 60 for r in requests)


def test_clip_uses_max_seq_len():
    requests = build(f"{{trace: {{path: {AZURE_CONV}}}, too_long: clip}}", max_seq_len=2048)
    assert len(requests) == 19_366
    assert max(r.prompt_tokens + r.output_tokens for r in requests) == 2048


def test_reject_passes_long_requests_to_the_simulator():
    requests = build(f"{{trace: {{path: {AZURE_CONV}}}}}", max_seq_len=2048)
    assert max(r.prompt_tokens for r in requests) == 14_050  # the file's longest prompt


def test_clip_without_max_seq_len_is_an_error():
    with pytest.raises(ValueError, match="needs the model's max_seq_len"):
        build(f"{{trace: {{path: {AZURE_CONV}}}, too_long: clip}}")


def test_sharing_fields_apply_to_every_request():
    requests = build(
        "{arrivals: {kind: poisson, rate: 1}, lengths: {kind: fixed, prompt_tokens: 10,"
        " output_tokens: 5}, num_requests: 20, n: 2, beam_width: 4,"
        " shared_prefix: {prefix_id: sys, tokens: 32}}"
    )
    assert {
        (r.n, r.beam_width, r.prefix_id, r.prefix_tokens, r.prompt_tokens) for r in requests
    } == {(2, 4, "sys", 32, 42)}


def test_generic_trace(tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"t": 0, "a": 5, "b": 6}\n{"t": 1.5, "a": 7, "b": 8}\n')
    requests = build(
        "{trace: {format: generic, path: mine.jsonl, columns: {arrival_time: t,"
        " prompt_tokens: a, output_tokens: b}, time_unit: s}}",
        base_dir=tmp_path,
    )
    assert [(r.arrival_time, r.prompt_tokens) for r in requests] == [(0.0, 5), (1.5, 7)]


# --- path lookup -----------------------------------------------------------------------------------


def test_paths_resolve_against_cwd_then_config_folder_then_shipped_data(tmp_path, monkeypatch):
    config_dir, work_dir = tmp_path / "configs", tmp_path / "work"
    config_dir.mkdir()
    work_dir.mkdir()
    monkeypatch.chdir(work_dir)
    shutil.copy(data_path("synthetic_trace.jsonl"), config_dir / "t.jsonl")
    assert resolve_data_path("t.jsonl", config_dir) == config_dir / "t.jsonl"
    (work_dir / "t.jsonl").write_text("")
    assert resolve_data_path("t.jsonl", config_dir) == work_dir / "t.jsonl"  # CWD first
    # Shipped data by its repository path or bare name, from anywhere.
    assert resolve_data_path(AZURE_CONV, config_dir) == data_path("AzureLLMInferenceTrace_conv.csv")
    assert resolve_data_path("AzureLLMInferenceTrace_conv.csv") == data_path(
        "AzureLLMInferenceTrace_conv.csv"
    )


def test_missing_file_lists_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        build("{trace: {path: nowhere.csv}}", base_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("workload.trace.path: file 'nowhere.csv' not found; looked in:")
    assert str(tmp_path / "nowhere.csv") in message and "traces/data/nowhere.csv" in message


# --- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "location", "message"),
    [
        ("{trace: {path: a.csv}, arrivals: {kind: poisson, rate: 1}}", "", "remove arrivals"),
        ("{num_requests: 5}", "", "needs either trace"),
        (
            "{arrivals: {kind: poisson, rate: 1}, lengths: {kind: fixed, prompt_tokens: 1,"
            " output_tokens: 1}}",
            "",
            "num_requests and/or duration_s",
        ),
        ("{trace: {path: a.csv}, rate_scale: 0}", "rate_scale", "greater than 0"),
        ("{trace: {path: a.csv, colour: red}}", "trace.colour", "Extra inputs"),
        ("{trace: {path: a.csv}, windw: {duration_s: 5}}", "windw", "Extra inputs"),
        ("{trace: {format: excel, path: a.csv}}", "trace.format", "'azure'"),
        ("{trace: {format: generic, path: a.csv}}", "trace", "needs columns"),
        (
            "{trace: {format: azure, path: a.csv, time_unit: ms}}",
            "trace",
            "only with format 'generic'",
        ),
        ("{trace: {path: a.csv}, window: {}}", "window", "needs start_s > 0"),
        ("{trace: {path: a.csv}, window: {duration_s: -5}}", "window.duration_s", "greater than 0"),
        ("{trace: {path: a.csv}, too_long: truncate}", "too_long", "'reject' or 'clip'"),
        ("{trace: {path: a.csv}, n: 0}", "n", "greater than or equal to 1"),
        ("{trace: {path: a.csv}, n: 4, beam_width: 2}", "", "n (4) must be <= beam_width (2)"),
        ("{trace: {format: mooncake, path: a.jsonl}, shared_prefix: {tokens: 5}}", "", "hash_ids"),
        (
            "{trace: {path: a.csv}, shared_prefix: {tokens: 0}}",
            "shared_prefix.tokens",
            "greater than or equal to 1",
        ),
        (
            "{arrivals: {kind: gamma, rate: 1}, lengths: {kind: preset, name: sharegpt-paper},"
            " num_requests: 5}",
            "arrivals.gamma.cv",
            "Field required",
        ),
        (
            "{arrivals: {kind: poisson, rate: .nan}, lengths: {kind: preset, name: sharegpt-paper},"
            " num_requests: 5}",
            "arrivals.poisson.rate",
            "finite number",
        ),
        (
            "{arrivals: {kind: poisson, rate: 1}, lengths: {kind: preset, name: lmsys},"
            " num_requests: 5}",
            "lengths.preset.name",
            "'sharegpt-paper' or 'alpaca-paper'",
        ),
        (
            "{arrivals: {kind: poisson, rate: 1}, lengths: {kind: uniform, prompt_min: 9,"
            " prompt_max: 3, output_min: 1, output_max: 1}, num_requests: 5}",
            "lengths.uniform",
            "prompt_max (3) must be >= prompt_min (9)",
        ),
        (
            "{arrivals: {kind: poisson, rate: 1}, lengths: {kind: lognormal, prompt_mean: 0.5,"
            " prompt_std: 1, output_mean: 5, output_std: 1}, num_requests: 5}",
            "lengths.lognormal.prompt_mean",
            "greater than or equal to 1",
        ),
    ],
)
def test_invalid_configs_name_the_key(text, location, message):
    with pytest.raises(ValidationError) as info:
        config(text)
    errors = info.value.errors()
    assert len(errors) == 1
    assert ".".join(str(part) for part in errors[0]["loc"]) == location
    assert message in errors[0]["msg"]
