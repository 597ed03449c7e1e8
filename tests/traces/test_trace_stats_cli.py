"""trace_stats on hand-computed examples, and the `kvsim trace` commands."""

from __future__ import annotations

import argparse
import json

import pytest

from kvsim.simulator.app.trace_cli import add_trace_commands, main
from kvsim.traces import Request, trace_stats
from kvsim.traces.plots import trace_figure


def test_stats_of_a_small_trace():
    # Gaps 1, 1, 4: mean 2, population std sqrt(2) -> CV 0.707; rate 1 / mean gap = 0.5/s.
    requests = [
        Request(i, t, p, o)
        for i, (t, p, o) in enumerate([(0, 1, 10), (1, 2, 20), (2, 3, 30), (6, 100, 40)])
    ]
    stats = trace_stats(requests)
    assert stats["count"] == 4 and stats["time_span_s"] == 6.0
    assert stats["mean_rate_per_s"] == pytest.approx(0.5)
    assert stats["interarrival_cv"] == pytest.approx(2**0.5 / 2)
    assert stats["prompt_mean"] == 26.5 and stats["prompt_median"] == 2.5
    assert stats["output_mean"] == 25.0 and stats["output_max"] == 40
    # numpy's linear p99 of [1, 2, 3, 100]: 3 + 0.97 * 97.
    assert stats["prompt_p99"] == pytest.approx(97.09)
    assert stats["ideal_prefix_hit_ratio"] is None


def test_ideal_prefix_hit_ratio_counts_blocks_seen_in_earlier_requests():
    requests = [
        Request(0, 0.0, 1536, 1, hash_ids=(1, 2, 3)),  # 3 misses
        Request(1, 1.0, 1024, 1, hash_ids=(1, 2)),  # 2 hits
        Request(2, 2.0, 1536, 1, hash_ids=(1, 9, 9)),  # 1 hit; 9 twice in one request: misses
    ]
    stats = trace_stats(requests)
    assert stats["hash_blocks"] == 8
    assert stats["ideal_prefix_hit_ratio"] == pytest.approx(3 / 8)


def test_stats_of_nothing_and_of_simultaneous_arrivals():
    assert trace_stats([])["count"] == 0 and trace_stats([])["prompt_mean"] is None
    stats = trace_stats([Request(0, 0.0, 5, 5), Request(1, 0.0, 7, 5)])
    assert stats["mean_rate_per_s"] is None and stats["interarrival_cv"] is None


def test_figure_axes_have_units():
    requests = [Request(i, i * 0.5, 10 + i, 5) for i in range(50)]
    fig = trace_figure(requests)
    labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]
    assert labels[0][0] == "time since first request (s)" and "requests/s" in labels[0][1]
    assert labels[1][0] == "prompt length (tokens)" and labels[2][0] == "output length (tokens)"


# --- the CLI -------------------------------------------------------------------------------------


def test_commands_register_on_a_parser():
    parser = argparse.ArgumentParser()
    add_trace_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["trace", "stats", "x.csv", "--format", "azure"])
    assert (args.command, args.trace_command, args.file, args.format) == (
        "trace",
        "stats",
        "x.csv",
        "azure",
    )
    assert callable(args.func)


def test_stats_json_on_a_shipped_trace(capsys):
    assert main(["trace", "stats", "synthetic_trace.jsonl", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 3993 and round(stats["ideal_prefix_hit_ratio"], 2) == 0.64


def test_stats_table(capsys):
    assert main(["trace", "stats", "AzureLLMInferenceTrace_code.csv"]) == 0
    out = capsys.readouterr().out
    assert "inter-arrival CV" in out and "8,819" in out and "n/a" in out  # no hash ids


def test_stats_of_a_lengths_file_has_no_rate(capsys):
    assert (
        main(["trace", "stats", "sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "--json"]) == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 30731 and stats["mean_rate_per_s"] is None


def test_stats_generic_columns(tmp_path, capsys):
    path = tmp_path / "g.csv"
    path.write_text("when,in,out\n0,5,6\n2000,7,8\n")
    assert (
        main(
            [
                "trace",
                "stats",
                str(path),
                "--format",
                "generic",
                "--columns",
                "when,in,out",
                "--time-unit",
                "ms",
                "--json",
            ]
        )
        == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["time_span_s"] == 2.0 and stats["prompt_mean"] == 6.0


def test_bad_file_gives_one_line_error(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,abc,1\n")
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}:3: column 'num_prefill_tokens' is not an integer: 'abc'"


def test_unsorted_file_warns_on_stderr(tmp_path, capsys):
    path = tmp_path / "u.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1,1,1\n0,1,1\n")
    assert main(["trace", "stats", str(path), "--json"]) == 0
    assert "warning:" in capsys.readouterr().err
    assert main(["trace", "stats", str(path), "--on-unsorted", "error"]) == 2


def test_missing_file(capsys):
    assert main(["trace", "stats", "no_such_trace.csv"]) == 2
    assert "not found; looked in" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "trace.png"
    assert main(["trace", "plot", "AzureLLMInferenceTrace_conv.csv", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
