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
