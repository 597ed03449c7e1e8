"""What ``kvsim run`` tells a newcomer on the console: why requests were rejected (by kind,
with counts), a summary whose labels do not repeat their keys, progress without a terminal
(a plain line every few seconds) and ETAs that end at 0."""

from __future__ import annotations

import io
import re

import yaml
from rich.console import Console

from kvsim.simulator.app.cli import HEADLINE, label_says, main, reason_lines, summary_table
from kvsim.simulator.app.display import group_reasons

TINY = {
    "name": "tiny",
    "model": {"name": "llama-2-7b"},
    "hardware": {"gpu": "a100-80gb"},
    "workload": {"arrivals": {"kind": "poisson", "rate": 50.0},
                 "lengths": {"kind": "fixed", "prompt_tokens": 64, "output_tokens": 16}, "num_requests": 400},
}


def _config(num_requests: int = 400):
    from kvsim.simulator.config import validate_config

    raw = {**TINY, "workload": {**TINY["workload"], "num_requests": num_requests}}
    return validate_config(yaml.safe_load(yaml.safe_dump(raw)))


# --- why requests were rejected -----------------------------------------------------------------

def test_the_quickstart_says_why_it_rejects_what_it_rejects(tmp_path, capsys):
    assert main(["run", "quickstart", "--no-plot", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = re.search(r"^(\d+) rejected:$", out, re.M)
    assert head, out
    lines = re.findall(r"^  +(\d+)  (.+)$", out[head.end():].split("results:")[0], re.M)
    # Every rejected request is counted under a reason, and the reasons come by kind (the
    # prompt alone too long; prompt + output too long), not one line per request's length.
    assert sum(int(n) for n, _ in lines) == int(head.group(1)) > 0
    assert 1 <= len(lines) <= 2 and all("exceeds the context window" in why for _, why in lines), lines
    assert any(re.search(r"prompt of \d+-\d+ tokens", why) for _, why in lines)


def test_reasons_that_differ_only_in_their_numbers_are_one_line_with_ranges():
    reasons = {"prompt of 5000 tokens exceeds the context window (model.context_len_tokens) 4096": 2,
               "prompt of 4100 tokens exceeds the context window (model.context_len_tokens) 4096": 1,
               "needs more KV slots than the whole cache (512)": 7}
    assert group_reasons(reasons) == [
        "7  needs more KV slots than the whole cache (512)",
        "3  prompt of 4100-5000 tokens exceeds the context window (model.context_len_tokens) 4096",
    ]
    many = {f"reason {chr(97 + i)} of 1": i + 1 for i in range(7)}
    lines = group_reasons(many, most=3)
    assert lines[:3] == ["7  reason g of 1", "6  reason f of 1", "5  reason e of 1"]
    assert lines[3] == "10  for 4 other reasons (summary.json)"  # 1 + 2 + 3 + 4


def test_reason_lines_cover_rejected_and_aborted_and_say_nothing_when_none():
    summary = {"rejected": 2, "reject_reasons": {"x 1": 1, "x 2": 1}, "aborted": 1,
               "abort_reasons": {"swapped-out group can no longer fit in GPU memory": 1}}
    assert reason_lines(summary) == ["2 rejected:", "  2  x 1-2", "1 aborted:",
                                     "  1  swapped-out group can no longer fit in GPU memory"]
    assert reason_lines({"rejected": 0, "aborted": 0, "reject_reasons": {}}) == []


# --- summary labels --------------------------------------------------------------------------

def test_summary_labels_do_not_repeat_their_keys():
    summary = {key: 1.0 for key, _, _ in HEADLINE}
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_table(summary, "t"))
    rows = buf.getvalue().splitlines()
    for key, label, _ in HEADLINE:
        row = next(r for r in rows if f"│ {label.strip()} " in r or f"│   {label.strip()} " in r)
        after = row.split(label.strip(), 1)[1]
        if label_says(label, key):
            assert key not in after, row  # "requests completed completed" reads as a stutter
        else:
            assert key in after, row  # a key the label does not say is shown (summary.json's name)
    assert sum(not label_says(label, key) for key, label, _ in HEADLINE) <= 3  # keys shown only where needed


def test_label_says_its_key_word_by_word():
    assert label_says("requests completed", "completed")
    assert label_says("normalized latency (s/token)", "normalized_latency_s_per_token")
    assert label_says("  internal fragmentation (%)", "mem_internal_frag_perc")
    assert not label_says("  free while a request waits (%)", "mem_stranded_free_perc")
    assert not label_says("KV blocks per replica", "kv_num_gpu_blocks")


# --- progress without a terminal, and ETAs that end at 0 -----------------------------------------

def test_without_a_terminal_progress_is_a_plain_line_every_few_seconds_ending_at_eta_0():
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.engine.runner import expected_requests, run_experiment

    cfg = _config(400)
    buf = io.StringIO()
    console = Console(file=buf)  # a log file, a pipe, CI
    assert not console.is_terminal
    with RunProgress(cfg.name, expected_requests(cfg), console=console, line_every_s=0.001) as progress:
        run_experiment(cfg, progress=progress)
    lines = buf.getvalue().splitlines()
    assert progress.lines and not progress.enabled and len(lines) >= 2, lines
    assert all(re.fullmatch(r"simulating tiny: [\d,]+/400 requests, [\d,.]+ s simulated, [\d,]+ req/s, "
                            r"\d:\d\d:\d\d elapsed, ETA (\d:\d\d:\d\d|-:--:--)", line) for line in lines), lines
    assert lines[-1].startswith("simulating tiny: 400/400 requests") and lines[-1].endswith("ETA 0:00:00")


def test_a_short_run_prints_no_line_and_quiet_prints_none():
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.engine.runner import run_experiment

    for console in (Console(file=io.StringIO()), Console(file=io.StringIO(), quiet=True)):
        with RunProgress("tiny", 20, console=console, line_every_s=60) as progress:
            run_experiment(_config(20), progress=progress)
        assert console.file.getvalue() == "" and progress.lines_printed == 0
    quiet = RunProgress("tiny", 20, console=Console(file=io.StringIO(), quiet=True), line_every_s=0.001)
    assert not quiet.lines and not quiet.enabled


def test_the_bar_ends_at_eta_0():
    from kvsim.simulator.app.run_progress import RunProgress
    from kvsim.simulator.engine.runner import expected_duration_s, run_experiment

    # By the clock: arrivals over 20 s, the last one early enough that the run ends before
    # 20 s of simulated time; done is done all the same.
    raw = {**TINY, "workload": {**TINY["workload"], "num_requests": None, "duration_s": 20.0,
                                "arrivals": {"kind": "poisson", "rate": 0.5}}}
    from kvsim.simulator.config import validate_config

    for cfg, total in ((_config(400), 400), (validate_config(yaml.safe_load(yaml.safe_dump(raw))), None)):
        console = Console(file=io.StringIO(), force_terminal=True, width=200)
        with RunProgress(cfg.name, total, console=console, total_sim_s=expected_duration_s(cfg),
                         interval_s=0.001) as bar:
            run_experiment(cfg, progress=bar)
        task = bar.bar.tasks[0]
        assert task.finished and task.time_remaining == 0, (task.completed, task.total)
    assert bar.by_clock and bar._sim.env.now < 20.0  # the clock alone would have stopped short


def test_a_run_on_the_command_line_without_a_terminal_prints_lines(tmp_path, capsys, monkeypatch):
    import kvsim.simulator.app.run_progress as rp

    real = rp.RunProgress.__init__
    monkeypatch.setattr(rp.RunProgress, "__init__",
                        lambda self, *a, **k: real(self, *a, **{**k, "line_every_s": 0.001}))
    assert main(["run", "quickstart", "--no-plot", "--out", str(tmp_path), "--set",
                 "workload.window.num_requests=200"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("simulating quickstart: ") for line in err), err
    assert err[-1].endswith("ETA 0:00:00")
    assert main(["run", "quickstart", "--no-plot", "--quiet", "--out", str(tmp_path / "q"), "--set",
                 "workload.window.num_requests=200"]) == 0
    assert capsys.readouterr().err == ""


def test_a_sweep_without_a_terminal_prints_lines_ending_at_eta_0(tmp_path, capsys, monkeypatch):
    import kvsim.simulator.app.sweep as sw

    monkeypatch.setattr(sw, "PROGRESS_LINE_S", 0.0)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workload": {**TINY["workload"], "num_requests": 20}}))
    spec = sw.load_sweep(config, grid=["allocator.block_size=8,16,32"], output_dir=str(tmp_path / "out"))
    sw.run_sweep(spec, workers=1, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) >= 2 and all(re.fullmatch(r"sweep \S+: \d/3 runs, 0 failed, \d:\d\d:\d\d elapsed, "
                                              r"ETA (\d:\d\d:\d\d|-:--:--)", line) for line in err), err
    assert err[-1].startswith(f"sweep {spec.name}: 3/3 runs") and err[-1].endswith("ETA 0:00:00")
    sw.run_sweep(spec, workers=1, progress=False)  # --no-progress: nothing
    assert capsys.readouterr().err == ""


def test_reproduce_dry_run_checks_every_section_as_quick_builds_it_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import dataclasses

    import kvsim.simulator.app.reproduce as rp

    out = tmp_path / "paper"
    assert main(["reproduce", "vllm-paper", "--quick", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert all(f"{e.key}: " in text for e in rp.EXPERIMENTS if e.in_quick) and not out.exists()
    # A --quick override that names no key is found without running anything.
    bad = dataclasses.replace(rp.EXPERIMENTS[0], quick_set=("workload.no_such_key=1",))
    monkeypatch.setattr(rp, "EXPERIMENTS", (bad, *rp.EXPERIMENTS[1:]))
    assert main(["reproduce", "vllm-paper", "--quick", "--dry-run", "--out", str(out)]) == 2
    assert "no_such_key" in capsys.readouterr().err and not out.exists()
