"""The token-ids workload format (input_toks, output_toks, arrival_time_ns, input_tok_ids):
requests carry their prompt's token ids; every bad row is one TraceError naming file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.simulator.config import ConfigError, validate_config
from kvsim.simulator.workload import WorkloadConfig, build_requests
from kvsim.traces import TOKEN_IDS, TraceError, detect_format, load_trace, read_token_ids
from kvsim.traces.transforms import apply_sharing, clip_to_max_len

SHIPPED = (Path(__file__).resolve().parents[2] / "gpu_validation" / "runs"
           / "vllm-0.19-rtx4090-llama-3.1-8b" / "workload" / "sharegpt-llama-3.1-8b-300-sps10.jsonl")


def row(prompt=3, output=2, t=0, ids=None, **extra) -> str:
    obj = {"input_toks": prompt, "output_toks": output, "arrival_time_ns": t,
           "input_tok_ids": list(range(prompt)) if ids is None else ids, **extra}
    return json.dumps(obj)


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_good_file_gives_requests_with_token_ids(tmp_path):
    path = write(tmp_path / "w.jsonl", row(3, 2, 500_000_000, [7, 8, 9]), "",
                 row(2, 5, 1_750_000_000, [1, 2]))
    assert detect_format(path) is TOKEN_IDS
    requests = list(load_trace(path))
    assert [r.request_id for r in requests] == [0, 1]
    assert [r.arrival_time for r in requests] == pytest.approx([0.0, 1.25])  # ns, rebased to the first
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(3, 2), (2, 5)]
    assert [r.token_ids for r in requests] == [(7, 8, 9), (1, 2)]
    assert requests[0].hash_ids is None
    assert list(read_token_ids(path)) == requests


def test_the_shipped_workload_loads():
    requests = list(load_trace(SHIPPED))
    assert len(requests) == 300
    assert all(len(r.token_ids) == r.prompt_tokens for r in requests)
    assert requests[0].prompt_tokens == 2358 and requests[0].token_ids[:3] == (5971, 2927, 220)
    assert requests[-1].arrival_time == pytest.approx(29.136836395)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (row(3, 2, ids=[1, 2]), "column 'input_tok_ids' has 2 token ids but column 'input_toks' says the prompt "
                                "has 3 tokens"),
        (row(2, 2, ids=[1, 2, 3]), "column 'input_tok_ids' has 3 token ids but column 'input_toks' says"),
        (row(2, 2, ids=[1, "a"]), "column 'input_tok_ids' holds a non-integer id: 'a'"),
        (row(2, 2, ids=[1, -4]), "column 'input_tok_ids' holds a token id out of range: -4"),
        (row(2, 2, ids=[1, 2**40]), "column 'input_tok_ids' holds a token id out of range"),
        (row(2, 2, ids=7), "column 'input_tok_ids' is not a list of integers: 7"),
        (row(2, 2, ids=[1.5, 2]), "column 'input_tok_ids' holds a non-integer id: 1.5"),
        (json.dumps({"input_toks": 2, "output_toks": 2, "arrival_time_ns": 5, "input_tok_ids": None}),
         "column 'input_tok_ids' is empty"),
        (row(0, 2, ids=[]), "column 'input_toks' is zero"),
        (row(2, -1, ids=[1, 2]), "column 'output_toks' is negative"),
        (row(2, 2, t=-5, ids=[1, 2]), "column 'arrival_time_ns' is negative"),
        (json.dumps({"input_toks": 2, "output_toks": 2, "input_tok_ids": [1, 2]}), "missing key 'arrival_time_ns'"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_each_bad_row_is_one_line_naming_file_and_line(tmp_path, bad, problem):
    path = write(tmp_path / "w.jsonl", row(2, 2, 0, [4, 5]), bad)
    with pytest.raises(TraceError) as info:
        list(load_trace(path, "token-ids"))
    message = str(info.value)
    assert message.startswith(f"{path}:2: {problem}"), message
    assert "\n" not in message and info.value.line == 2


def test_clip_cuts_the_ids_with_the_prompt_and_a_shared_prefix_is_refused(tmp_path):
    path = write(tmp_path / "w.jsonl", row(6, 4, 0, [1, 2, 3, 4, 5, 6]))
    (clipped,) = clip_to_max_len(load_trace(path), 5)
    assert (clipped.prompt_tokens, clipped.output_tokens, clipped.token_ids) == (4, 1, (1, 2, 3, 4))
    with pytest.raises(ValueError, match="has token_ids"):
        list(apply_sharing(load_trace(path), prefix_id="sys", prefix_tokens=4))


def test_a_config_names_the_format(tmp_path):
    path = write(tmp_path / "w.jsonl", row(3, 2, 0, [7, 8, 9]))
    cfg = WorkloadConfig.model_validate({"trace": {"format": "token-ids", "path": str(path)}})
    (r,) = build_requests(cfg, base_dir=tmp_path, seed=0)
    assert r.token_ids == (7, 8, 9)
    with pytest.raises(ConfigError, match="shared_prefix cannot be added to a trace with token ids"):
        validate_config({"workload": {"trace": {"format": "token-ids", "path": str(path)},
                                      "shared_prefix": {"tokens": 4}}})
