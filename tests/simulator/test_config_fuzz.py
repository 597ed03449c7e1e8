"""Random YAML trees into the config loader: it loads, or raises the one-line ConfigError.

Trees mix the schema's real section and key names with junk, and values of every YAML
type (wrong types, wrong nesting, huge and negative numbers, unicode), so most of them
get deep into validation before they fail.
"""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.simulator.config import ConfigError, ExperimentConfig, load_config

SECTIONS = [k for k in ExperimentConfig.model_fields]
KEYS = sorted({k for f in ExperimentConfig.model_fields.values()
               for k in getattr(f.annotation, "model_fields", {})} | {
    "trace", "arrivals", "lengths", "kind", "rate", "prompt_tokens", "output_tokens", "path", "format",
    "name", "preset", "window", "duration_s", "num_requests", "cv", "tokens"})
WORDS = ["paged", "contiguous", "orca-max", "fastertransformer", "poisson", "fixed", "preset", "sharegpt-paper",
         "llama-2-7b", "opt-13b", "a100-80gb", "h200", "buddy", "request", "swap", "calibrated", "../x", "/abs"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 16, 3, 1e9, 1e300, -1, 0.5, 2048]),
    st.sampled_from(WORDS), st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(KEYS + SECTIONS), st.text(min_size=1, max_size=8))
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)
WORKLOAD = {"arrivals": {"kind": "poisson", "rate": 2.0}, "lengths": {"kind": "fixed", "prompt_tokens": 8,
                                                                         "output_tokens": 4}, "num_requests": 3}
configs = st.fixed_dictionaries({}, optional={s: trees for s in SECTIONS}).map(
    lambda d: {"workload": WORKLOAD, **d})


def _check(path) -> None:
    try:
        load_config(path)
    except ConfigError as e:
        text = str(e)
        assert text and "\n" not in text, text
        assert "Traceback" not in text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs)
def test_random_config_trees_load_or_raise_one_line_config_error(tmp_path, raw):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    _check(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(trees, st.dictionaries(st.sampled_from(SECTIONS), trees, max_size=6)))
def test_random_documents_of_any_shape_load_or_raise_one_line_config_error(tmp_path, raw):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    _check(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_random_text_loads_or_raises_one_line_config_error(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    _check(path)


def _resolved_base() -> dict:
    return load_config_dict({"workload": WORKLOAD})


def load_config_dict(raw: dict) -> dict:
    from kvsim.simulator.config import validate_config

    return validate_config(raw).model_dump(mode="json")


BASE = _resolved_base()
LEAVES = [(s, k) for s, v in BASE.items() if isinstance(v, dict) for k in v] + [
    (k, None) for k, v in BASE.items() if not isinstance(v, dict)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(LEAVES), st.one_of(scalars, trees)), min_size=1, max_size=3))
def test_a_valid_config_with_random_values_loads_or_raises_one_line_config_error(tmp_path, changes):
    """Start from a resolved config (every key present) and change one to three values."""
    import copy

    raw = copy.deepcopy(BASE)
    for (section, key), value in changes:
        if key is None:
            raw[section] = value
        else:
            raw[section][key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    _check(path)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([".".join(p for p in leaf if p) for leaf in LEAVES] + ["a.b", "", "=", "seed.x.y"]),
       st.one_of(st.text(max_size=20), st.sampled_from(["true", "[1, 2", "{a: 1, a: 2}", ".inf", "-1", "1e9",
                                                        "&a [*a]", "!!python/object:os.system x", "~"])))
def test_random_overrides_apply_or_raise_one_line_config_error(key, value):
    import copy

    from kvsim.simulator.config import validate_config

    try:
        validate_config(copy.deepcopy(BASE), overrides=[f"{key}={value}"])
    except ConfigError as e:
        assert str(e) and "\n" not in str(e), str(e)


# --- ``kvsim run`` in-process, stopped once the config is validated and its workload read ------

RUN_BASES = {
    "gen.yaml": {"name": "gen", "workload": WORKLOAD},
    "mt.yaml": {"name": "mt", "workload": {"multi_turn": {"conversations": 2, "conversation_rate": 1.0,
                                                          "turns": {"min": 1, "max": 2}}}},
    "trace.yaml": {"name": "tr", "workload": {"trace": {"format": "vidur", "path": "t.csv"}},
                   "allocator": {"prefix_caching": True, "tiers": [{"name": "cpu", "capacity_gib": 1}]}},
}
TRACE_CSV = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n0.5,20,6\n"


def _dotted(node, prefix: str = "") -> list[str]:
    """Every key path of a resolved config, sections and leaves (list items by index)."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return []
    out = []
    for k, v in items:
        path = f"{prefix}{k}"
        out += [path, *_dotted(v, path + ".")]
    return out


RUN_KEYS = sorted({k for raw in RUN_BASES.values() for k in _dotted(load_config_dict(dict(raw)))} | {
    "workload.arrivals.cv", "workload.rate_scale", "workload.duration_s", "workload.window.start_s",
    "workload.window.duration_s", "workload.shared_prefix.tokens", "model.shape", "model.shape.num_layers",
    "hardware.gpu_memory_gib", "allocator.tiers.0.link", "allocator.tiers.0.link.bandwidth_gb_s",
    "preemption.overlap_swap", "workload.lengths.prompt_std", "nonsense", "workload.x.y"})
VALUE_TEXTS = ["1e-300", "1e300", "-1", "0", "1", "0.5", "16", "'16'", "''", "true", "null", "~", ".nan", "-.inf",
               "9" * 5000, str(2**64), "[1, 2]", "[]", "{}", "{a: 1}", "{bandwidth_gb_s: 1e-300}", "pcie-gen5",
               "vllm-v1", "sglang", "contiguous", "lognormal", "{kind: lognormal, prompt_mean: 1e300, prompt_std: 1, "
               "output_mean: 5, output_std: 1}", "{num_layers: 2, hidden_size: 100, num_heads: 3, "
               "intermediate_size: 64, vocab_size: 100, context_len_tokens: 512}", "[{name: c, capacity_gib: 1}]"]
run_values = st.one_of(st.sampled_from(VALUE_TEXTS), st.integers(-5, 5000).map(str),
                       st.floats(allow_nan=False, width=32).map(repr), st.text(max_size=10))


class _Validated(Exception):
    """Raised in place of the simulation: the config was accepted and its first requests read."""


def _read_workload_and_stop(cfg, base_dir, requests=None, progress=None):
    import itertools

    from kvsim.simulator.workload import build_requests

    stream = build_requests(cfg.workload, base_dir=base_dir, seed=cfg.seed, max_seq_len=cfg.model.context_len)
    for _ in itertools.islice(stream, 20):
        pass
    raise _Validated


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(RUN_BASES)),
       st.lists(st.tuples(st.one_of(st.sampled_from(RUN_KEYS), keys), run_values), min_size=1, max_size=3))
def test_kvsim_run_with_random_sets_validates_or_says_one_line(tmp_path, monkeypatch, capsys, base, sets):
    """``kvsim run BASE --set KEY=VALUE ...`` with random keys and values: the config is accepted
    (and its workload's first requests read), or the command exits 2 with one ``error:`` line."""
    from kvsim.simulator.app.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kvsim.simulator.engine.runner.run_experiment", _read_workload_and_stop)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    (tmp_path / base).write_text(yaml.safe_dump(RUN_BASES[base]))
    capsys.readouterr()
    argv = ["run", base, "--no-plot", "--quiet", *(a for k, v in sets for a in ("--set", f"{k}={v}"))]
    try:
        rc = main(argv)
    except _Validated:
        return
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2, (argv, captured)
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)
    assert "Traceback" not in captured.err + captured.out
