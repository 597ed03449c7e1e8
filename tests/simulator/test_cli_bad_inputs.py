"""Every kvsim subcommand over a corpus of bad inputs: exit status 2, exactly one line on
stderr (``error: ...``), never a traceback; and the silent wrong answers of issue 16 are
now refused, each with its reason.

Each case is a (name, files, argv, expected words) tuple: ``files`` are written into a
temporary folder that is the current folder, ``argv`` runs through :func:`simulator.cli.main`
in-process (small inputs: the whole corpus takes seconds).
"""

from __future__ import annotations

import time

import pytest
import yaml

from kvsim.simulator.cli import main
from kvsim.simulator.config import MAX_YAML_NODES, ConfigError, load_config

TINY = {
    "name": "tiny",
    "model": {"name": "llama-2-7b"},
    "workload": {"arrivals": {"kind": "poisson", "rate": 5.0},
                 "lengths": {"kind": "fixed", "prompt_tokens": 32, "output_tokens": 8}, "num_requests": 5},
}
OK = yaml.safe_dump(TINY)
TRACE = "arrival_time,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,6\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def run_cfg(*sets: str, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["run", "ok.yaml", "--no-plot", "--quiet", *extra]
    for s in sets:
        argv += ["--set", s]
    return argv


CASES = [
    # --- section 2: formerly tracebacks
    ("not utf-8", {"bad.yaml": b"name: t\xff\n"}, ["run", "bad.yaml"], ["not UTF-8"]),
    ("negative seed", {}, run_cfg("seed=-3"), ["seed", "greater than or equal to 0"]),
    ("missing profile", {}, run_cfg("cost_model.kind=calibrated", "cost_model.profile=nope.yaml"),
     ["nope.yaml", "not found"]),
    ("unknown reproduce experiment", {}, ["reproduce", "vllm-paper", "--only", "fig99", "--out", "rp"],
     ["fig99", "choose from"]),
    ("calibrate refit missing file", {}, ["calibrate", "--refit", "nofile.yaml"], ["nofile.yaml"]),
    ("results is a file", {"results": "x"}, run_cfg(), ["cannot write results here"]),
    ("missing config", {}, ["run", "nope.yaml"], ["nope.yaml"]),
    ("config is a folder", {"d/x": ""}, ["run", "d"], ["cannot read config"]),
    ("not a mapping", {"l.yaml": "- a\n- b\n"}, ["run", "l.yaml"], ["top level must be a mapping"]),
    ("bad yaml", {"y.yaml": "a: [1, 2\n"}, ["run", "y.yaml"], ["not valid YAML"]),
    ("control character", {"c.yaml": "a: \x01\n"}, ["run", "c.yaml"], ["not valid YAML"]),
    ("unknown key", {}, run_cfg("allocator.colour=red"), ["unknown key", "allowed here"]),
    ("bad --set", {}, run_cfg("allocator.block_size"), ["expected KEY.PATH=VALUE"]),
    ("--set into a value", {}, run_cfg("model.name.x=1"), ["not a section"]),
    ("unknown option", {}, ["run", "ok.yaml", "--bogus"], ["unrecognized arguments"]),
    ("huge list under a key", {}, run_cfg("model.name=[" + ",".join(["1"] * 500) + "]"), ["model.name"]),
    # --- section 3: unbounded work
    ("alias bomb", {"bomb.yaml": BOMB}, ["run", "bomb.yaml"], ["aliases are expanded"]),
    ("huge file", {"big.yaml": "# " + "x" * (1 << 20) + "\n"}, ["run", "big.yaml"], ["larger than"]),
    ("deep nesting", {"deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n"}, ["run", "deep.yaml"], ["deep"]),
    ("absurd num_requests", {}, run_cfg("workload.num_requests=1000000000000"), ["num_requests", "at most"]),
    ("absurd rate x duration", {}, run_cfg("workload.num_requests=null", "workload.duration_s=1e12"),
     ["rate x rate_scale x duration_s"]),
    ("kv cache larger than the GPU", {}, run_cfg("hardware.kv_cache_gib=1000000"), ["does not fit"]),
    ("infinite swap", {}, run_cfg("hardware.swap_space_gib=.inf"), ["swap_space_gib"]),
    # --- section 4: formerly silent wrong answers
    ("duplicate key", {"dup.yaml": OK + "seed: 1\nseed: 2\n"}, ["run", "dup.yaml"], ["given twice"]),
    ("duplicate nested key", {"dup2.yaml": OK + "allocator:\n  block_size: 16\n  block_size: 32\n"},
     ["run", "dup2.yaml"], ["'block_size' given twice (first on line"]),
    ("complex key", {"ck.yaml": OK + "? [a, b]\n: 1\n"}, ["run", "ck.yaml"], ["plain name"]),
    ("boolean block size", {}, run_cfg("allocator.block_size=true"), ["block_size", "not true"]),
    ("boolean seed", {}, run_cfg("seed=true"), ["seed", "not true"]),
    ("boolean rate", {}, run_cfg("workload.arrivals.rate=true"), ["rate", "not true"]),
    ("window end before start", {}, run_cfg("metrics.window_start_s=10", "metrics.window_end_s=5"),
     ["window_end_s (5) must be after window_start_s (10)"]),
    ("window past the run", {}, run_cfg("metrics.window_start_s=1000"), ["holds no engine step"]),
    ("tensor parallel 3", {}, run_cfg("hardware.tensor_parallel=3"), ["does not split", "1, 2, 4, 8"]),
    ("max_seq_len 1e9 (text)", {}, run_cfg("model.context_len_tokens=1e9"), ["model.context_len_tokens"]),
    ("max_seq_len 10^9", {}, run_cfg("model.context_len_tokens=1000000000"), ["model.context_len_tokens"]),
    ("max_seq_len beyond the cache", {}, run_cfg("hardware.kv_cache_gib=1", "model.context_len_tokens=4096"),
     ["larger than the KV cache"]),
    ("paged with a contiguous key", {}, run_cfg("allocator.placement=first_fit"),
     ["placement", "only with kind contiguous"]),
    ("contiguous with prefix caching", {}, run_cfg("allocator.kind=contiguous", "allocator.prefix_caching=true"),
     ["prefix_caching", "only with kind paged"]),
    ("contiguous with a block size", {}, run_cfg("allocator.kind=contiguous", "allocator.block_size=32"),
     ["allocator.block_size: allowed only with kind paged (allocator.kind is contiguous)"]),
    ("contiguous with the default block size", {}, run_cfg("allocator.kind=contiguous", "allocator.block_size=16"),
     ["allocator.block_size: allowed only with kind paged"]),
    ("paged with a preset", {}, run_cfg("allocator.preset=orca-max"),
     ["allocator.preset: allowed only with kind contiguous (allocator.kind is paged)"]),
    ("paged with a reservation", {}, run_cfg("allocator.reserve_tokens=512"),
     ["allocator.reserve_tokens: allowed only with kind contiguous"]),
    ("oracle with a reservation", {}, run_cfg("allocator.kind=contiguous", "allocator.preset=orca-oracle",
                                              "allocator.reserve_tokens=512"),
     ["--set: allocator.reserve_tokens: allowed only with reservation max or pow2"]),
    ("unknown allocator kind", {}, run_cfg("allocator.kind=slab"),
     ["allocator.kind: must be one of paged, contiguous (got slab)"]),
    ("v0 with a v1 key", {}, run_cfg("scheduler.long_prefill_token_threshold=64"),
     ["scheduler.long_prefill_token_threshold: allowed only with policy vllm-v1 (scheduler.policy is vllm-v0)"]),
    ("v1 with request batching", {}, run_cfg("scheduler.policy=vllm-v1", "scheduler.batching=request"),
     ["scheduler.batching: allowed only with policy vllm-v0 (scheduler.policy is vllm-v1)"]),
    ("v1 with an sglang key", {}, run_cfg("scheduler.policy=vllm-v1", "scheduler.chunked_prefill_size=512"),
     ["scheduler.chunked_prefill_size: allowed only with policy sglang"]),
    ("sglang chunk below a page", {}, run_cfg("scheduler.policy=sglang", "allocator.block_size=64",
                                              "scheduler.chunked_prefill_size=16"),
     ["scheduler.chunked_prefill_size (16) is below the page size allocator.block_size (64)"]),
    ("unknown scheduler policy", {}, run_cfg("scheduler.policy=vllm-v2"),
     ["scheduler.policy: must be one of vllm-v0, vllm-v1, sglang (got vllm-v2)"]),
    ("calibrated with roofline efficiencies", {},
     run_cfg("cost_model.kind=calibrated", "cost_model.profile=p.yaml", "cost_model.memory_efficiency=0.5"),
     ["cost_model.memory_efficiency: allowed only with kind roofline (cost_model.kind is calibrated)"]),
    ("roofline with a profile", {}, run_cfg("cost_model.profile=rtx4090-llama-3.1-8b"),
     ["cost_model.profile: allowed only with kind calibrated or profiled (cost_model.kind is roofline)"]),
    # --- issue 17: renamed keys name their new name
    ("renamed kv_cache_gb", {}, run_cfg("hardware.kv_cache_gb=12"),
     ["--set: hardware.kv_cache_gb was renamed hardware.kv_cache_gib"]),
    ("renamed swap_space_gb", {"old.yaml": OK + "hardware:\n  gpu: a100-80gb\n  swap_space_gb: 8\n"},
     ["run", "old.yaml"], ["old.yaml:15: hardware.swap_space_gb was renamed hardware.swap_space_gib"]),
    ("renamed model.max_seq_len", {}, run_cfg("model.max_seq_len=2048"),
     ["model.max_seq_len was renamed model.context_len_tokens"]),
    ("renamed allocator.max_seq_len", {}, run_cfg("allocator.kind=contiguous", "allocator.max_seq_len=2048"),
     ["allocator.max_seq_len was renamed allocator.reserve_tokens"]),
    ("renamed scheduler.macro_steps", {}, run_cfg("scheduler.macro_steps=false"),
     ["scheduler.macro_steps was renamed engine.macro_steps"]),
    ("preset vs batching", {}, run_cfg("allocator.kind=contiguous", "allocator.preset=fastertransformer",
                                       "scheduler.batching=iteration"), ["conflicts with allocator.preset"]),
    ("preset vs placement", {}, run_cfg("allocator.kind=contiguous", "allocator.preset=orca-max",
                                        "allocator.placement=first_fit"), ["conflicts with preset"]),
    ("sweep --address with local", {}, ["sweep", "ok.yaml", "--grid", "seed=1,2", "--address", "ray://x:1"],
     ["--executor ray"]),
    ("reproduce --address with local", {}, ["reproduce", "vllm-paper", "--address", "ray://x:1", "--out", "rp"],
     ["--executor ray"]),
    ("a billion samples", {}, run_cfg("workload.n=1000000000"), ["workload.n", "less than or equal to 1024"]),
    ("beams beyond max_num_seqs", {}, run_cfg("workload.beam_width=300"),
     ["workload.beam_width (300) is more than scheduler.max_num_seqs (256)"]),
    # --- section 1: names
    ("run name ..", {}, run_cfg(extra=("--run", "..")), ["plain folder name"]),
    ("experiment name", {}, run_cfg("name=../x"), ["plain folder name"]),
    # --- other subcommands
    ("sweep missing file", {}, ["sweep", "nope.yaml"], ["nope.yaml"]),
    ("sweep bad axis", {}, ["sweep", "ok.yaml", "--grid", "seed"], ["seed"]),
    ("sweep bad find-rate", {}, ["sweep", "ok.yaml", "--find-rate", "lo"], ["KEY=VALUE"]),
    ("plot missing folder", {}, ["plot", "nothere"], ["nothere"]),
    ("plot not a results folder", {"empty/x.txt": ""}, ["plot", "empty"], ["neither a sweep folder"]),
    ("trace stats missing", {}, ["trace", "stats", "nope.csv"], ["nope.csv"]),
    ("trace stats bad row", {"t.csv": TRACE + "1.0,abc,5\n"}, ["trace", "stats", "t.csv", "--format", "generic",
     "--columns", "arrival_time,prompt_tokens,output_tokens"], ["abc"]),
    ("trace plot to a missing folder", {"t.csv": TRACE}, ["trace", "plot", "t.csv", "--format", "generic",
     "--columns", "arrival_time,prompt_tokens,output_tokens", "-o", "no/such/dir/x.png"], ["no/such/dir"]),
]


@pytest.mark.parametrize(("files", "argv", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, files, argv, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2, captured
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in captured.err + captured.out
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_alias_bomb_is_refused_quickly_without_growing(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # 9^9 = 387 million values once expanded
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_NODES} values"):
        load_config(path)
    assert time.perf_counter() - t0 < 10.0  # the old loader grew past 2 GB and kept going


def test_all_rejected_run_warns_and_strict_makes_it_fail(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)
    too_long = ["--set", "workload.lengths.prompt_tokens=5000"]  # llama-2-7b holds 4096 tokens
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", *too_long]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: tiny: no request completed (5 rejected of 5)")
    assert "context window (model.context_len_tokens)" in err[0]  # the first rejection's reason
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", "--strict", *too_long]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tiny: no request completed")
    # a healthy run is quiet and passes --strict
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", "--strict"]) == 0
    assert capsys.readouterr().err == ""


def test_presets_write_what_they_run_into_the_resolved_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**TINY, "allocator": {"kind": "contiguous", "preset": "fastertransformer"}}))
    cfg, _ = load_config(path)
    assert (cfg.allocator.placement, cfg.allocator.reservation, cfg.scheduler.batching) == \
        ("first_fit", "max", "request")
    again = tmp_path / "again.yaml"  # the resolved config loads again, unchanged
    again.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(again)[0] == cfg


def test_saturated_window_that_is_empty_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)  # 5 requests, 5 req/s on a big GPU: nothing ever waits
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", "--strict", "--set", "metrics.window=saturated"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.window 'saturated' is empty" in err[0]


def test_running_out_of_memory_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)

    def huge(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("kvsim.simulator.runner.run_experiment", huge)
    assert main(["run", "ok.yaml", "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory")


def test_empty_workload_warns_and_strict_makes_it_fail(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)
    late = ["--set", "workload.window.start_s=100000"]  # after the 5th request: nothing left
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", *late]) == 0
    assert capsys.readouterr().err.strip() == "warning: tiny: the workload holds no request (check " \
        "workload.window and the trace)"
    assert main(["run", "ok.yaml", "--no-plot", "--quiet", "--strict", *late]) == 2


def test_request_limit_counts_where_the_generator_stops(tmp_path):
    """num_requests and duration_s together: it stops at the first, so only that one counts."""
    path = tmp_path / "c.yaml"
    raw = {**TINY, "workload": {**TINY["workload"], "num_requests": 5, "duration_s": 1e12}}
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path)[0].workload.num_requests == 5
    raw["workload"].update(num_requests=10**12, duration_s=10.0)
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path)[0].workload.duration_s == 10.0
