"""Every kvsim subcommand over a corpus of bad inputs: exit status 2, exactly one line on
stderr (``error: ...``), never a traceback; and the silent wrong answers found so far are
now refused, each with its reason.

Each case is a (name, files, argv, expected words) tuple: ``files`` are written into a
temporary folder that is the current folder, ``argv`` runs through :func:`simulator.app.cli.main`
in-process (small inputs: the whole corpus takes seconds). A word starting with ``!`` must not
appear in the line (a pydantic internal name, a line of the base file blamed for ``--set``).
"""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from kvsim.simulator.app.cli import main
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


MT = yaml.safe_dump({"name": "mt", "workload": {"multi_turn": {"conversations": 2, "conversation_rate": 1.0}}})
TRACE_SET = ("workload={trace: {format: generic, path: t.csv, columns: {arrival_time: arrival_time, "
             "prompt_tokens: prompt_tokens, output_tokens: output_tokens}}}",)
LOGNORMAL = ("workload.lengths={{kind: lognormal, prompt_mean: {mean}, prompt_std: {std}, output_mean: 10, "
             "output_std: 1}}")
TIER = "allocator.tiers=[{{name: cpu, capacity_gib: 1, link: {link}}}]"
SHAPE = ("model.shape={{num_layers: {layers}, hidden_size: {hidden}, num_heads: 4, intermediate_size: 256, "
         "vocab_size: 1000, context_len_tokens: 2048}}")


def run_mt(*sets: str) -> list[str]:
    return ["run", "mt.yaml", "--no-plot", "--quiet", *(a for s in sets for a in ("--set", s))]


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
    # --- renamed keys name their new name
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
    # --- bounds with physical meaning (a word starting with "!" must not appear)
    ("rate near 0", {}, run_cfg("workload.arrivals.rate=1e-300"), ["workload", "at most 1e7 s", "raise the rate"]),
    ("rate_scale near 0", {}, run_cfg("workload.rate_scale=1e-300"), ["rate_scale", "at most 1e7 s"]),
    ("rate_scale stretches a trace", {"t.csv": TRACE}, run_cfg(*TRACE_SET, "workload.rate_scale=1e-300"),
     ["t.csv", "workload.rate_scale 1e-300 stretches the trace", "at most 1e7 s"]),
    ("rate beyond any cluster", {}, run_cfg("workload.arrivals.rate=1e300"),
     ["workload.arrivals.rate", "less than or equal to 1000000"]),
    ("think time 1e300", {"mt.yaml": MT}, run_mt("workload.multi_turn.think_time_s=1e300"),
     ["workload.multi_turn.think_time_s", "less than or equal to 86400"]),
    ("assumed TPOT 1e300", {"mt.yaml": MT}, run_mt("workload.multi_turn.assumed_tpot_s=1e300"),
     ["workload.multi_turn.assumed_tpot_s", "less than or equal to 10"]),
    ("conversation rate near 0", {"mt.yaml": MT}, run_mt("workload.multi_turn.conversation_rate=1e-300"),
     ["workload.multi_turn", "conversation_rate", "at most 1e7 s"]),
    ("system prompt of 1e9 tokens", {"mt.yaml": MT}, run_mt("workload.multi_turn.system_prompt_tokens=1000000000"),
     ["workload.multi_turn.system_prompt_tokens", "less than or equal to 16777216"]),
    ("user message of 1e9 tokens", {"mt.yaml": MT},
     run_mt("workload.multi_turn.user_tokens={min: 1000000000, max: 1000000000}"),
     ["workload.multi_turn.user_tokens.min", "less than or equal to 16777216"]),
    ("multi-turn work estimate", {"mt.yaml": MT},
     run_mt("workload.multi_turn.conversations=1000", "workload.multi_turn.user_tokens={min: 10000000, max: 10000000}"),
     ["workload.multi_turn", "prompt tokens in all", "at most 1e+10", "--set"]),
    ("step overhead 1e12", {}, run_cfg("cost_model.step_overhead_s=1e12"),
     ["cost_model.step_overhead_s", "less than or equal to 1"]),
    ("compute efficiency 1e-12", {}, run_cfg("cost_model.compute_efficiency=1e-12"),
     ["cost_model.compute_efficiency", "greater than or equal to 0.01"]),
    ("GPU memory beyond the GPU", {}, run_cfg("hardware.gpu_memory_gib=4096"),
     ["--set: hardware.gpu_memory_gib: 4096 GiB is more than one a100-80gb holds (80 GiB"]),
    ("lognormal too wide", {}, run_cfg(LOGNORMAL.format(mean=100, std="1e12")),
     ["workload.lengths", "prompt_std (1e+12) is too wide", "median", "!lognormal:"]),
    ("lognormal mean 1e300", {}, run_cfg(LOGNORMAL.format(mean="1e300", std=1)),
     ["--set: workload.lengths.prompt_mean", "less than or equal to 16777216", "!lognormal."]),
    ("prompt of 10^23 tokens", {}, run_cfg("workload.lengths.prompt_tokens=100000000000000000000000"),
     ["workload.lengths.prompt_tokens", "less than or equal to 16777216"]),
    ("trace timestamp 1e300", {"t.csv": TRACE + "1e300,20,6\n"}, run_cfg(*TRACE_SET),
     ["t.csv:4", "1e+300 s after the first", "at most 1e7 s"]),
    ("trace token count above int64", {"t.csv": TRACE + "1.0,99999999999999999999,6\n"}, run_cfg(*TRACE_SET),
     ["t.csv:4", "column 'prompt_tokens' is too large", "at most 2147483647"]),
    ("trace stats, token count above int64", {"t.csv": TRACE + "1.0,99999999999999999999,6\n"},
     ["trace", "stats", "t.csv", "--format", "generic", "--columns", "arrival_time,prompt_tokens,output_tokens"],
     ["t.csv:4", "too large"]),
    ("trace plot, token count above int64", {"t.csv": TRACE + "1.0,99999999999999999999,6\n"},
     ["trace", "plot", "t.csv", "--format", "generic", "--columns", "arrival_time,prompt_tokens,output_tokens",
      "-o", "t.png"], ["t.csv:4", "too large"]),
    ("trace path that is not there", {}, run_cfg("workload={trace: {format: azure, path: "
                                                  "mine/AzureLLMInferenceTrace_conv.csv}}"),
     ["workload.trace.path", "mine/AzureLLMInferenceTrace_conv.csv", "not found"]),
    ("trace stats of a missing file named like a shipped one", {},
     ["trace", "stats", "mine/AzureLLMInferenceTrace_conv.csv"], ["mine/AzureLLMInferenceTrace_conv.csv", "not found"]),
    ("tier link of 1e-300 GB/s", {}, run_cfg("allocator.prefix_caching=true", TIER.format(link="{bandwidth_gb_s: 1e-300}")),
     ["--set: allocator.tiers.0.link.bandwidth_gb_s", "greater than or equal to 0.01", "!literal[", "!TierLinkConfig"]),
    ("unknown tier link", {}, run_cfg("allocator.prefix_caching=true", TIER.format(link="pcie-gen9")),
     ["allocator.tiers.0.link: must be one of pcie-gen4", "(got 'pcie-gen9')", "!literal[", "!TierLinkConfig"]),
    ("shape whose heads do not divide", {}, run_cfg(SHAPE.format(layers=2, hidden=102)),
     ["model.shape", "hidden_size (102) does not divide into num_heads (4)"]),
    ("shape beside a catalogue name", {}, run_cfg("model.name=llama-2-7b", SHAPE.format(layers=2, hidden=128)),
     ["model.name", "'llama-2-7b' is a catalogue model"]),
    ("a billion layers", {}, run_cfg(SHAPE.format(layers=10**9, hidden=4096)),
     ["model.shape.num_layers", "less than or equal to 1024", "!GiB of weights"]),
    ("the largest shape allowed", {}, run_cfg("model.name=big", SHAPE.format(layers=1024, hidden=2**17)),
     ["model big leaves no KV memory", "weights take 131,265.1 GiB per GPU", "!e+"]),
    ("a token budget no GPU holds", {}, run_cfg("scheduler.policy=vllm-v1", "scheduler.max_num_batched_tokens=2**30"),
     ["scheduler.max_num_batched_tokens", "must be an integer"]),
    ("an activation peak larger than the GPU", {},
     run_cfg("scheduler.policy=vllm-v1", "scheduler.max_num_batched_tokens=100000000"),
     ["leaves no KV memory", "activation peak", "scheduler.max_num_batched_tokens 100,000,000"]),
    ("gamma arrivals with cv near 0", {}, run_cfg("workload.arrivals={kind: gamma, rate: 2, cv: 1e-300}"),
     ["--set: workload.arrivals.cv", "greater than or equal to 0.01"]),
    ("scheduler limit beyond 2^30", {}, run_cfg("scheduler.max_num_seqs=100000000000000000000"),
     ["scheduler.max_num_seqs", "less than or equal to 1073741824"]),
    ("overlap_swap under vllm-v1", {}, run_cfg("scheduler.policy=vllm-v1", "preemption.overlap_swap=true"),
     ["preemption.overlap_swap true is not allowed with scheduler.policy vllm-v1"]),
    ("overlap_swap under sglang", {}, run_cfg("scheduler.policy=sglang", "preemption.overlap_swap=true"),
     ["preemption.overlap_swap true is not allowed with scheduler.policy sglang"]),
    ("block size as text", {}, run_cfg("allocator.block_size='16'"),
     ["--set: allocator.block_size: must be an integer, not the text '16'"]),
    ("block size as text in the file", {"s.yaml": OK + "allocator:\n  block_size: '16'\n"}, ["run", "s.yaml"],
     ["s.yaml:14", "allocator.block_size: must be an integer"]),
    ("empty output_dir", {}, run_cfg("output_dir=''"), ["output_dir: must be a folder path"]),
    ("5000-digit integer in --set", {}, run_cfg("seed=" + "9" * 5000), ["--set seed", "5000 digits"]),
    ("5000-digit integer in the file", {"big.yaml": OK + "seed: " + "9" * 5000 + "\n"}, ["run", "big.yaml"],
     ["big.yaml:13", "5000 digits"]),
    ("5000-digit integer in --grid", {}, ["sweep", "ok.yaml", "--grid", "seed=1," + "9" * 5000, "--dry-run"],
     ["--grid seed", "digits"]),
    ("5000-digit integer in --find-rate", {}, ["sweep", "ok.yaml", "--find-rate", "lo=" + "9" * 5000 + ",hi=2"],
     ["--find-rate lo"]),
    ("grid with a repeated value", {}, ["sweep", "ok.yaml", "--grid", "seed=1,2,1", "--dry-run"],
     ["--grid seed", "grid.seed: value 1 is given twice"]),
    ("sweep file grid with a repeated value", {"s.yaml": "base: ok.yaml\ngrid:\n  seed: [1, 2, 1]\n"},
     ["sweep", "s.yaml", "--dry-run"], ["s.yaml:3", "grid.seed: value 1 is given twice"]),
    ("a 9-million-point grid", {}, ["sweep", "ok.yaml", "--dry-run", "--grid", "seed=" + ",".join(map(str, range(3000))),
                                    "--grid", "workload.num_requests=" + ",".join(map(str, range(1, 3001)))],
     ["3000 x 3000 = 9,000,000 points", "at most 100,000"]),
    ("--workers -3", {}, ["sweep", "ok.yaml", "--grid", "seed=1,2", "--workers", "-3"],
     ["argument --workers: expected a number >= 1, got -3"]),
    # --- --set errors name --set, not a line of the base file
    ("--set of one key", {}, run_cfg("workload.arrivals.rate=-1"),
     ["--set: workload.arrivals.rate: Input should be greater than 0", "!ok.yaml", "!poisson"]),
    ("--set of a section", {}, run_cfg("workload.arrivals={kind: poisson, rate: -1}"),
     ["--set: workload.arrivals.rate", "!ok.yaml"]),
    ("--set and a check across keys", {}, run_cfg("workload.num_requests=1000000000", "workload.arrivals.rate=1e-3"),
     ["(with --set workload.arrivals.rate, workload.num_requests)"]),
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
        if w.startswith("!"):
            assert w[1:] not in lines[0], (w, lines[0])
        else:
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

    monkeypatch.setattr("kvsim.simulator.engine.runner.run_experiment", huge)
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


def test_a_reservation_too_small_is_the_reason_given(tmp_path, monkeypatch, capsys):
    """``reserve_tokens: 1``: every request is rejected for its region, not for the cache's size."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)
    assert main(run_cfg("allocator.kind=contiguous", "allocator.reserve_tokens=1")) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no request completed (5 rejected of 5)" in err[0]
    assert "needs 39 KV slots (prompt + output - 1) but a region holds at most 1 (allocator.reserve_tokens)" \
        in err[0]
    assert "whole cache" not in err[0]


def test_bad_workers_are_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(OK)
    for bad in ("-3", "0", "two", "5000", "9" * 5000):
        assert main(["sweep", "ok.yaml", "--grid", "seed=1,2", "--workers", bad]) == 2
        assert capsys.readouterr().err.startswith("error: argument --workers:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.yaml"]  # no results folder, no table


def test_a_measured_run_with_block_size_0_is_an_error(tmp_path, capsys):
    from test_validate import make_folder

    root = make_folder(tmp_path / "r", meta_extra={"kv_cache": {"num_gpu_blocks": 101, "block_size": 0}})
    assert main(["validate", str(root), "--cost-model", "roofline", "--no-plot", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "block_size" in err[0] and "blocks of 16" not in err[0]


def test_physical_bounds_leave_real_settings_alone(tmp_path):
    """The bounds refuse nonsense only: slow rates, wide lognormals, custom shapes still load."""
    path = tmp_path / "c.yaml"
    raw = {**TINY, "workload": {**TINY["workload"], "arrivals": {"kind": "poisson", "rate": 1e-3},
                                "lengths": {"kind": "lognormal", "prompt_mean": 161.3, "prompt_std": 400,
                                            "output_mean": 338, "output_std": 300}},
           "model": {"shape": {"num_layers": 126, "hidden_size": 16384, "num_heads": 128, "num_kv_heads": 8,
                               "intermediate_size": 53248, "vocab_size": 128256, "context_len_tokens": 131072}},
           "hardware": {"gpu": "h200", "tensor_parallel": 8, "gpu_memory_gib": 131},
           "cost_model": {"step_overhead_s": 0.03, "compute_efficiency": 0.3}}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)[0]
    assert cfg.model.name == "custom"  # a shape is never labelled with the catalogue's default model
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(again)[0] == cfg


NUMERIC_BASES = {  # configs that between them hold every numeric key
    "generated": {"workload": {"arrivals": {"kind": "gamma", "rate": 2.0, "cv": 1.0},
                               "lengths": {"kind": "lognormal", "prompt_mean": 8, "prompt_std": 1, "output_mean": 4,
                                           "output_std": 1},
                               "num_requests": 3, "window": {"start_s": 1, "duration_s": 5, "num_requests": 2},
                               "shared_prefix": {"tokens": 4}},
                  "allocator": {"prefix_caching": True, "tiers": [{"name": "c", "capacity_gib": 1,
                                                                   "link": {"bandwidth_gb_s": 1}}]},
                  "metrics": {"slo_ttft_ms": 1, "slo_tpot_ms": 1, "window_start_s": 0, "window_end_s": 1},
                  "hardware": {"gpu_memory_gib": 70, "peak_activation_gib": 1}},
    "multi-turn": {"workload": {"multi_turn": {"conversations": 2, "conversation_rate": 1.0}},
                   "scheduler": {"policy": "vllm-v1", "max_num_partial_prefills": 1}},
    "sglang": {"scheduler": {"policy": "sglang"}, "workload": TINY["workload"]},
    "contiguous": {"allocator": {"kind": "contiguous", "reserve_tokens": 100}, "workload": TINY["workload"],
                   "hardware": {"kv_cache_gib": 1}},
}
UNBOUNDED = {"workload.duration_s"}  # with num_requests the generator stops first: any duration is fine


def _numeric_leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numeric_leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numeric_leaves(v, (*path, str(i)))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield ".".join(path)


@pytest.mark.parametrize("base", sorted(NUMERIC_BASES))
def test_every_numeric_key_refuses_absurd_values_naming_itself(base):
    """1e300 and -1 in any numeric key: a one-line error naming the key, never accepted."""
    from kvsim.simulator.config import validate_config

    raw = NUMERIC_BASES[base]
    resolved = validate_config(copy.deepcopy(raw)).model_dump(mode="json")
    keys = sorted(set(_numeric_leaves(resolved)) | set(_numeric_leaves(raw)))
    assert len(keys) > 10
    for key in keys:
        for value in ("1e300", "-1"):
            if key in UNBOUNDED and value == "1e300":
                continue
            with pytest.raises(ConfigError) as info:
                validate_config(copy.deepcopy(raw), overrides=[f"{key}={value}"])
            text = str(info.value)
            assert "\n" not in text and key.rsplit(".", 1)[-1] in text, (key, value, text)
