"""`make bench` prints the README's speed table; the README shows that table and no other
timing of the same runs."""

import re
from pathlib import Path

from benchmarks.run import README_ROWS, readme_table

README = Path(__file__).resolve().parents[2] / "README.md"


def _fake(wall_s: float, rss: float, requests: int) -> dict:
    return {"wall_s": wall_s, "peak_rss_mib": rss, "requests": requests}


def test_readme_table_formats_like_the_readme():
    results = {
        "a": _fake(1.134, 156.2, 19_366), "b": _fake(0.98, 155.0, 19_366),
        "c": _fake(6.61, 141.0, 10_000), "d10k": _fake(0.563, 137.0, 10_000),
        "d100k": _fake(5.49, 190.4, 100_000), "d1m": _fake(54.3, 615.0, 1_000_000),
    }
    text = readme_table(results)
    assert text.splitlines()[:6] == [
        "| case | wall | peak RSS |",
        "| --- | --- | --- |",
        "| Azure conv trace (19,366 requests), Llama-2-70B TP2, paged-16 | 1.1 s | 156 MiB |",
        "| the same with Orca-Max | 0.98 s | 155 MiB |",
        "| beam search width 4, 10,000 Alpaca-like requests | 6.6 s | 141 MiB |",
        "| 10,000 / 100,000 / 1,000,000 Poisson ShareGPT-like requests (5 req/s, Llama-2-7B) "
        "| 0.56 s / 5.5 s / 54 s | 137 / 190 / 615 MiB |",
    ]
    assert text.endswith("wall time per request: d10k: 56 µs, d100k: 55 µs, d1m: 54 µs")
    assert "Orca-Max" not in readme_table({"a": results["a"]})  # rows not measured: left out


def test_the_readme_speed_table_is_the_commands_table():
    speed = README.read_text().split("\n## Speed\n")[1].split("\n## ")[0]
    rows = [line for line in speed.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| case | wall | peak RSS |"
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows[1:]] == [
        label for label, _ in README_ROWS
    ]
    for row, (_, cases) in zip(rows[1:], README_ROWS):
        wall, rss = row.split(" | ")[1:3]
        assert re.fullmatch(r"[0-9.]+ s( / [0-9.]+ s)*", wall) and wall.count(" s") == len(cases)
        assert re.fullmatch(r"[0-9]+( / [0-9]+)* MiB \|", rss)
    assert "wall time per request: d10k:" in speed and "make bench" in speed


def test_the_readme_quotes_the_million_request_time_once():
    # One number, in the table: the introduction points at it instead of repeating it.
    text = README.read_text()
    intro = text.split("\n## ")[0]
    assert "million requests" in intro and "Speed" in intro
    assert not re.search(r"million requests in [^(]*\b(minute|seconds?|s)\b", intro)
