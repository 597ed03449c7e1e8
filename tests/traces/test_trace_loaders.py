"""Loaders: the shipped traces, every format, ordering and streaming."""

from __future__ import annotations

import itertools
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvsim.traces import (
    AZURE,
    LENGTHS,
    MOONCAKE,
    TraceError,
    TraceWarning,
    data_path,
    detect_format,
    load_length_pool,
    load_trace,
    read_azure,
    read_generic,
    read_lengths,
    read_mooncake,
    read_vidur,
    shipped_files,
    trace_stats,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the shipped traces: known values from the issue and traces/data/SOURCES.md ---------------


@pytest.fixture(scope="module")
def azure_conv():
    return list(read_azure(data_path("AzureLLMInferenceTrace_conv.csv")))


@pytest.fixture(scope="module")
def mooncake():
    return list(read_mooncake(data_path("synthetic_trace.jsonl")))


def test_azure_conv_rows_and_means(azure_conv):
    stats = trace_stats(azure_conv)
    assert stats["count"] == 19_366
    assert round(stats["output_mean"], 1) == 211.1
    # SOURCES.md: near-Poisson (CV about 1.1), 5.5 req/s, prompt mean 1155.
    assert round(stats["prompt_mean"]) == 1155
    assert stats["interarrival_cv"] == pytest.approx(1.1, abs=0.05)
    assert stats["mean_rate_per_s"] == pytest.approx(5.5, abs=0.05)


def test_azure_conv_times_are_seconds_from_the_first_row(azure_conv):
    # First rows: 18:15:46.6805900 and 18:15:50.9951690 -> 4.314579 s apart.
    assert azure_conv[0].arrival_time == 0.0
    assert azure_conv[1].arrival_time == pytest.approx(4.314579, abs=1e-9)
    assert (azure_conv[0].prompt_tokens, azure_conv[0].output_tokens) == (374, 44)
    assert [r.request_id for r in azure_conv] == list(range(len(azure_conv)))
    times = [r.arrival_time for r in azure_conv]
    assert times == sorted(times)


def test_azure_code_rows_and_burstiness():
    stats = trace_stats(read_azure(data_path("AzureLLMInferenceTrace_code.csv")))
    assert stats["count"] == 8_819
    # SOURCES.md: very bursty (CV about 13), prompt mean 2048, output mean 28.
    assert stats["interarrival_cv"] == pytest.approx(13, abs=0.5)
    assert round(stats["prompt_mean"]) == 2048
    assert round(stats["output_mean"]) == 28


def test_mooncake_rows_hit_ratio_and_units(mooncake):
    stats = trace_stats(mooncake)
    assert stats["count"] == 3_993
    assert round(stats["ideal_prefix_hit_ratio"], 2) == 0.64
    # SOURCES.md: 17 minutes, 3.9 req/s, prompt mean 15,326, output mean 149.
    assert stats["time_span_s"] / 60 == pytest.approx(17, abs=0.1)
    assert stats["mean_rate_per_s"] == pytest.approx(3.9, abs=0.01)
    assert stats["prompt_mean"] == pytest.approx(15_326, abs=1)
    assert round(stats["output_mean"]) == 149
    # Third row: timestamp 40 ms, 23769 tokens = 47 blocks of 512, ids 151..197.
    third = mooncake[2]
    assert third.arrival_time == pytest.approx(0.040)
    assert third.hash_ids == tuple(range(151, 198))
    assert third.hash_block_tokens == 512


def test_every_mooncake_row_has_one_hash_id_per_block(mooncake):
    assert all(len(r.hash_ids) == -(-r.prompt_tokens // 512) for r in mooncake)


def test_sharegpt_lengths_pool():
    prompts, outputs = load_length_pool(
        data_path("sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    )
    assert len(prompts) == len(outputs) == 30_731
    assert round(prompts.mean()) == 2340 and round(outputs.mean()) == 439
    assert (prompts + outputs).max() <= 8192  # "filtered to at most 8k total tokens"


def test_shipped_formats_are_detected():
    expected = {
        "AzureLLMInferenceTrace_conv.csv": AZURE,
        "AzureLLMInferenceTrace_code.csv": AZURE,
        "synthetic_trace.jsonl": MOONCAKE,
        "sharegpt_8k_filtered_stats_llama2_tokenizer.csv": LENGTHS,
    }
    assert sorted(shipped_files()) == sorted(expected)
    for name, fmt in expected.items():
        assert detect_format(data_path(name)) == fmt


def test_data_path_lists_shipped_files_when_missing():
    with pytest.raises(FileNotFoundError, match="AzureLLMInferenceTrace_conv.csv"):
        data_path("nope.csv")


# --- each format on small hand-written files ----------------------------------------------------


def test_azure_timestamps_across_midnight(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.9000000,10,2\n"
        "2023-11-17 00:00:00.1000000,20,3\n"
        "2023-11-17 00:01:00.1000001,30,4",  # no trailing newline, like the real files
    )
    requests = list(read_azure(path))
    assert [r.arrival_time for r in requests] == pytest.approx([0.0, 0.2, 60.2000001], abs=1e-9)
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(10, 2), (20, 3), (30, 4)]


def test_vidur_csv_in_seconds_rebased_to_first_request(tmp_path):
    path = write(
        tmp_path,
        "v.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n5.0,100,10,x\n5.25,200,20,y\n",
    )
    requests = list(read_vidur(path))
    assert [(r.request_id, r.arrival_time) for r in requests] == [(0, 0.0), (1, 0.25)]
    assert requests[1].prompt_tokens == 200 and requests[1].output_tokens == 20


@pytest.mark.parametrize(
    ("unit", "raw", "seconds"),
    [
        ("s", ["1.5", "2.0"], 0.5),
        ("ms", ["1500", "2000"], 0.5),
        ("us", ["1500000", "2000000"], 0.5),
        ("ns", ["1500000000", "2000000000"], 0.5),
        ("datetime", ["2024-01-01T10:00:00Z", "2024-01-01T12:00:00.5+02:00"], 0.5),
    ],
)
def test_generic_csv_time_units(tmp_path, unit, raw, seconds):
    text = "t,in,out\n" + "".join(f"{value},7,8\n" for value in raw)
    path = write(tmp_path, "g.csv", text)
    requests = list(
        read_generic(
            path, arrival_time="t", prompt_tokens="in", output_tokens="out", time_unit=unit
        )
    )
    assert [r.arrival_time for r in requests] == pytest.approx([0.0, seconds])


def test_generic_jsonl_with_hash_ids_and_string_numbers(tmp_path):
    path = write(
        tmp_path,
        "g.jsonl",
        '{"ts": 0, "p": "40", "o": 3, "ids": [1, 2, 3]}\n'
        "\n"
        '{"ts": 250, "p": 20, "o": 4.0, "ids": [1]}\n',
    )
    requests = list(
        read_generic(
            path,
            arrival_time="ts",
            prompt_tokens="p",
            output_tokens="o",
            hash_ids="ids",
            time_unit="ms",
            hash_block_tokens=16,
        )
    )
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 40, 3),
        (0.25, 20, 4),
    ]
    assert requests[0].hash_ids == (1, 2, 3) and requests[0].hash_block_tokens == 16


def test_generic_csv_hash_id_lists(tmp_path):
    path = write(tmp_path, "h.csv", 't,p,o,h\n0,1024,1,"[5, 6]"\n1,600,1,7;8\n2,10,1,9\n')
    requests = list(
        read_generic(path, arrival_time="t", prompt_tokens="p", output_tokens="o", hash_ids="h")
    )
    assert [r.hash_ids for r in requests] == [(5, 6), (7, 8), (9,)]


def test_lengths_of_a_timed_trace_ignore_times(tmp_path):
    path = write(
        tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n9,3,4\n1,5,6\n"
    )
    assert list(read_lengths(path)) == [(3, 4), (5, 6)]  # unsorted times do not matter


def test_a_lengths_file_is_not_a_trace(tmp_path):
    path = write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n3,4\n")
    with pytest.raises(TraceError, match="no arrival times"):
        load_trace(path)


def test_missing_file_fails_when_called_not_when_consumed(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.csv")


# --- ordering ------------------------------------------------------------------------------------

UNSORTED = "arrived_at,num_prefill_tokens,num_decode_tokens\n1,1,1\n3,3,3\n2,2,2\n3,4,4\n0.5,5,5\n"


def test_unsorted_rows_are_sorted_stably_with_a_warning(tmp_path):
    path = write(tmp_path, "u.csv", UNSORTED)
    with pytest.warns(TraceWarning, match=r"u\.csv:4: timestamps are not sorted"):
        requests = list(read_vidur(path))
    # Sorted by time; the two rows at t=3 keep file order (prompt 3 before 4).
    assert [r.prompt_tokens for r in requests] == [5, 1, 2, 3, 4]
    assert [r.arrival_time for r in requests] == [0.0, 0.5, 1.5, 2.5, 2.5]
    assert [r.request_id for r in requests] == [0, 1, 2, 3, 4]


def test_unsorted_rows_are_an_error_on_request(tmp_path):
    path = write(tmp_path, "u.csv", UNSORTED)
    with pytest.raises(TraceError, match=r"u\.csv:4: timestamps are not sorted.*line 3"):
        list(read_vidur(path, on_unsorted="error"))


def test_sorted_file_gives_no_warning(tmp_path):
    path = write(
        tmp_path, "s.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1,1,1\n1,2,2\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(read_vidur(path))) == 2


def test_quoted_csv_fields_are_scanned_correctly(tmp_path):
    # The sortedness pre-scan switches from str.split to csv at the first quote.
    path = write(
        tmp_path,
        "q.csv",
        'arrived_at,num_prefill_tokens,num_decode_tokens,note\n1,1,1,plain\n2,2,2,"a,\nb"\n0,3,3,c\n',
    )
    with pytest.warns(TraceWarning, match=r"q\.csv:5:"):
        requests = list(read_vidur(path))
    assert [r.prompt_tokens for r in requests] == [3, 1, 2]


# --- streaming -----------------------------------------------------------------------------------


def write_vidur(path: Path, rows: int) -> Path:
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(0.01, rows))
    body = "\n".join(
        f"{t:.6f},{p},{o}"
        for t, p, o in zip(times, rng.integers(1, 4000, rows), rng.integers(1, 900, rows))
    )
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + body + "\n")
    return path


def test_loading_streams_with_bounded_memory(tmp_path):
    path = write_vidur(tmp_path / "big.csv", 100_000)
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_vidur(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 100_000
    # Holding the 100k Requests would take ~20 MB; streaming peaks near 60 kB.
    assert peak < 1_000_000


def test_rows_are_read_lazily(tmp_path):
    # A bad last row is not reached when only the first rows are consumed.
    path = write(
        tmp_path, "l.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,2,2\n2,x,3\n"
    )
    first = list(itertools.islice(read_vidur(path, on_unsorted="error"), 2))
    assert [r.prompt_tokens for r in first] == [1, 2]


def test_parse_throughput(tmp_path):
    path = write_vidur(tmp_path / "big.csv", 100_000)
    start = time.perf_counter()
    count = sum(1 for _ in read_vidur(path))
    rate = count / (time.perf_counter() - start)
    # ~350k rows/s on one core; a floor far below that catches accidental O(n^2) work.
    assert rate > 50_000
