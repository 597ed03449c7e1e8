"""Bad input: one TraceError naming the file, the line and the problem."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.traces import TraceError, load_length_pool, load_trace, read_generic

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44"
VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens"


def trace_error(path: Path, text: str, **kwargs) -> TraceError:
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        list(load_trace(path, **kwargs))
    return info.value


@pytest.mark.parametrize(
    ("row", "line", "problem"),
    [
        ("2023-11-16 18:15:47.0,abc,4", 3, "column 'ContextTokens' is not an integer: 'abc'"),
        ("2023-11-16 18:15:47.0,-3,4", 3, "column 'ContextTokens' is negative: '-3'"),
        ("2023-11-16 18:15:47.0,0,4", 3, "column 'ContextTokens' is zero: '0'"),
        ("2023-11-16 18:15:47.0,12.5,4", 3, "column 'ContextTokens' is not an integer: '12.5'"),
        ("2023-11-16 18:15:47.0,12,", 3, "column 'GeneratedTokens' is empty"),
        ("yesterday,12,4", 3, "column 'TIMESTAMP' is not a date-time"),
        ("2023-11-16 25:15:47.0,12,4", 3, "column 'TIMESTAMP' is not a date-time"),
        ("2023-11-16 18:15:47.0,12", 3, "row has 2 fields but the header has 3"),
    ],
)
def test_bad_azure_rows(tmp_path, row, line, problem):
    error = trace_error(tmp_path / "a.csv", f"{AZURE_HEADER}\n{AZURE_ROW}\n{row}\n")
    assert str(error).startswith(f"{tmp_path / 'a.csv'}:{line}: {problem}")
    assert (error.line, error.path) == (line, str(tmp_path / "a.csv"))


def test_missing_column_names_found_and_expected(tmp_path):
    error = trace_error(
        tmp_path / "v.csv", "arrived_at,num_prefill_tokens,decode\n0,1,1\n", format="vidur"
    )
    assert error.line == 1
    assert "missing column 'num_decode_tokens'" in str(error)
    assert "found 'arrived_at', 'num_prefill_tokens', 'decode'" in str(error)
    assert "expected 'arrived_at', 'num_prefill_tokens', 'num_decode_tokens'" in str(error)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1", "column 'arrived_at' is negative: '-1'"),
        ("nan", "column 'arrived_at' is not a finite number: 'nan'"),
        ("soon", "column 'arrived_at' is not a number: 'soon'"),
        ("", "column 'arrived_at' is empty"),
    ],
)
def test_bad_times(tmp_path, value, problem):
    error = trace_error(tmp_path / "v.csv", f"{VIDUR_HEADER}\n0,1,1\n{value},1,1\n")
    assert str(error) == f"{tmp_path / 'v.csv'}:3: {problem}"


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_csv_file(tmp_path, text):
    error = trace_error(tmp_path / "e.csv", text, format="vidur")
    assert error.line is None and "file is empty" in str(error)
    assert str(tmp_path / "e.csv") in str(error)


def test_header_without_rows(tmp_path):
    error = trace_error(tmp_path / "h.csv", f"{VIDUR_HEADER}\n\n")
    assert "no rows after the header" in str(error) and error.line is not None


def test_empty_jsonl_file(tmp_path):
    error = trace_error(tmp_path / "e.jsonl", "\n", format="mooncake")
    assert "file is empty" in str(error)


def test_empty_file_with_auto_format(tmp_path):
    error = trace_error(tmp_path / "e.csv", "")
    assert "file is empty" in str(error)


MOONCAKE_ROW = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"input_length": "abc"}, "column 'input_length' is not an integer: 'abc'"),
        ({"input_length": True}, "column 'input_length' is not an integer: True"),
        ({"input_length": None}, "column 'input_length' is empty"),
        ({"output_length": -2}, "column 'output_length' is negative: -2"),
        ({"timestamp": -5}, "column 'timestamp' is negative: -5"),
        ({"hash_ids": [1, "x"]}, "column 'hash_ids' holds a non-integer id: 'x'"),
        ({"hash_ids": [1, 2, 3]}, "column 'hash_ids' has 3 ids but 600 prompt tokens fill only 2"),
        ({"input_length": 1e400}, "column 'input_length' is not an integer: inf"),
    ],
)
def test_bad_mooncake_values(tmp_path, change, problem):
    bad = json.dumps(MOONCAKE_ROW | change)
    error = trace_error(
        tmp_path / "m.jsonl", f"{json.dumps(MOONCAKE_ROW)}\n{bad}\n", format="mooncake"
    )
    assert str(error).startswith(f"{tmp_path / 'm.jsonl'}:2: {problem}")


@pytest.mark.parametrize(
    ("line_text", "problem"),
    [
        ('{"timestamp": 0, "input_length": 6', "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 6, "hash_ids": []}', "missing key 'output_length'"),
    ],
)
def test_bad_mooncake_lines(tmp_path, line_text, problem):
    error = trace_error(
        tmp_path / "m.jsonl", f"{json.dumps(MOONCAKE_ROW)}\n\n{line_text}\n", format="mooncake"
    )
    assert str(error).startswith(f"{tmp_path / 'm.jsonl'}:3: {problem}")


def test_unknown_format_names_the_known_ones(tmp_path):
    error = trace_error(tmp_path / "x.csv", "a,b\n1,2\n")
    assert "cannot tell the trace format" in str(error) and "azure" in str(error)


def test_lengths_pool_errors_too(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n3,4\n5,-6\n")
    with pytest.raises(TraceError, match=r"l\.csv:3: column 'num_decode_tokens' is negative"):
        load_length_pool(path)


# --- fuzzing: every loader, malformed rows ------------------------------------------------------

# loader name -> (file suffix, header line or None, a valid row, load function)
LOADERS = {
    "azure": (".csv", AZURE_HEADER, ["2023-11-16 18:15:46.6805900", "374", "44"]),
    "vidur": (".csv", VIDUR_HEADER, ["0.5", "374", "44"]),
    "lengths": (".csv", "num_prefill_tokens,num_decode_tokens", ["374", "44"]),
    "generic-csv": (".csv", "t,p,o", ["1500", "374", "44"]),
    "mooncake": (".jsonl", None, MOONCAKE_ROW),
    "generic-jsonl": (".jsonl", None, {"t": 3, "p": 12, "o": 1}),
}


def load(name: str, path: Path, on_unsorted: str = "sort") -> int:
    """Read the whole file with the named loader; the number of rows."""
    if name == "lengths":
        return len(load_length_pool(path, "lengths")[0])
    if name.startswith("generic"):
        requests = read_generic(
            path,
            arrival_time="t",
            prompt_tokens="p",
            output_tokens="o",
            time_unit="ms",
            on_unsorted=on_unsorted,
        )
    else:
        requests = load_trace(path, name, on_unsorted=on_unsorted)
    return sum(1 for _ in requests)


BAD_TOKENS = ["", " ", "abc", "-3", "0", "1.5", "nan", "inf", "1e400", "0x1f", "\ufffd", "--1"]
BAD_TIMES = ["", " ", "abc", "-3", "nan", "inf", "1e400", "0x1f", "\ufffd", "--1"]
BAD_DATETIMES = [
    "",
    "abc",
    "16/11/2023 18:15:46",
    "2023-13-16 18:15:46.6",
    "2023-11-16 18:61:46.6",
    "-1",
]
NAN = float("nan")
BAD_JSON = {
    "tokens": ["abc", None, True, -3, 0, 1.5, [1], {"a": 1}, "", NAN],
    "time": ["abc", None, True, -3, [1], {"a": 1}, "", NAN, "-1"],
    "hash_ids": ["abc", None, True, -3, 0, 1.5, {"a": 1}, NAN, [1.5], ["x"], [1, 2, 3]],
}


def bad_csv_values(name: str, column: int) -> list[str]:
    if column == 0 and name == "azure":
        return BAD_DATETIMES
    if column == 0 and name != "lengths":
        return BAD_TIMES
    return BAD_TOKENS


def bad_json_values(key: str) -> list:
    if key in ("timestamp", "t"):
        return BAD_JSON["time"]
    return BAD_JSON["hash_ids" if key == "hash_ids" else "tokens"]


@st.composite
def corrupted_file(draw, name: str):
    """A valid file with one corrupted row; returns (text, line of the bad row)."""
    suffix, header, row = LOADERS[name]
    good_rows = draw(st.integers(0, 5))
    if suffix == ".csv":
        column = draw(st.integers(0, len(row) - 1))
        kind = draw(st.sampled_from(["value", "fewer", "more"]))
        bad = list(row)
        if kind == "fewer":
            bad.pop(column)
        elif kind == "more":
            bad.insert(column, draw(st.sampled_from(["1", "x", ""])))
        else:
            bad[column] = draw(st.sampled_from(bad_csv_values(name, column)))
        lines = [header] + [",".join(row)] * good_rows + [",".join(bad)]
        return "\n".join(lines) + draw(st.sampled_from(["", "\n"])), good_rows + 2
    key = draw(st.sampled_from(sorted(row)))
    kind = draw(st.sampled_from(["value", "missing", "truncated", "not-object"]))
    if kind == "value":
        text = json.dumps(row | {key: draw(st.sampled_from(bad_json_values(key)))})
    elif kind == "missing":
        text = json.dumps({k: v for k, v in row.items() if k != key})
    elif kind == "truncated":
        full = json.dumps(row)
        text = full[: draw(st.integers(1, len(full) - 1))]
    else:
        text = json.dumps(list(row.values()))
    return "\n".join([json.dumps(row)] * good_rows + [text]) + "\n", good_rows + 1


@pytest.mark.parametrize("name", sorted(LOADERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_corrupted_row_is_reported_at_its_line(name, data):
    text, line = data.draw(corrupted_file(name))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzz{LOADERS[name][0]}"
        path.write_text(text)
        with pytest.raises(TraceError) as info:
            load(name, path)
    assert info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("name", sorted(LOADERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=st.lists(st.binary(max_size=60) | st.text(max_size=60), min_size=1, max_size=4))
def test_fuzz_junk_lines_load_or_raise_trace_error(name, junk):
    """Arbitrary bytes and text after valid rows: the file loads, or one TraceError
    names the file and a line - never another exception."""
    suffix, header, row = LOADERS[name]
    good = ",".join(row) if suffix == ".csv" else json.dumps(row)
    prefix = (f"{header}\n" if header else "") + f"{good}\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzz{suffix}"
        body = b"\n".join(
            j if isinstance(j, bytes) else j.encode("utf-8", "surrogatepass") for j in junk
        )
        path.write_bytes(prefix.encode() + body)
        try:
            rows = load(name, path, on_unsorted="error")
        except TraceError as e:
            assert str(e).startswith(f"{path}:") and e.line is not None and e.line >= 2
        else:
            assert rows >= 1



@pytest.mark.parametrize(
    ("value", "shown"),
    [("99999999999999999999", "'99999999999999999999'"), ("2147483648", "'2147483648'"),
     ("1e300", "'1e300'"), ("9" * 5000, "'99999")],
)
def test_token_counts_beyond_the_limit_fail_at_load(tmp_path, value, shown):
    """Above 2^31 - 1 tokens a count is refused with its line (it once ran the whole simulation
    and failed writing the tables)."""
    error = trace_error(tmp_path / "v.csv", f"{VIDUR_HEADER}\n0,1,1\n1,{value},1\n")
    assert str(error).startswith(f"{tmp_path / 'v.csv'}:3: column 'num_prefill_tokens' is too large: {shown}")
    assert "at most 2147483647" in str(error)


def test_a_json_token_count_beyond_the_limit_fails_at_load(tmp_path):
    row = '{{"timestamp": {t}, "input_length": 1, "output_length": {n}, "hash_ids": []}}\n'
    error = trace_error(tmp_path / "m.jsonl", row.format(t=0, n=1) + row.format(t=1, n=2**63), format="mooncake")
    assert str(error).startswith(f"{tmp_path / 'm.jsonl'}:2: column 'output_length' is too large")


def test_a_trace_longer_than_the_longest_workload_fails_at_its_row(tmp_path):
    error = trace_error(tmp_path / "v.csv", f"{VIDUR_HEADER}\n0,1,1\n5,1,1\n1e300,1,1\n")
    assert str(error).startswith(f"{tmp_path / 'v.csv'}:4: this row arrives 1e+300 s after the first one")
    assert "at most 1e7 s" in str(error)
    (tmp_path / "ok.csv").write_text(f"{VIDUR_HEADER}\n5,1,1\n10000005,1,1\n")  # 1e7 s: still accepted
    assert [r.arrival_time for r in load_trace(tmp_path / "ok.csv")] == [0.0, 1e7]
