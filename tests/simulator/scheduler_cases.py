"""What the scheduler scenario tests (``test_scheduler_v1``, ``test_scheduler_sglang``) share:
one way to drive a scheduler a step at a time, one small experiment config to vary key by
key, and one comparison of two runs' request tables.

Kept in one place so that a rule of the test harness (a step lasts 1 s; the allocator's
books are checked after every step; a config error is one line) is written once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvsim.simulator.config import ConfigError, load_config

# A small experiment every config test starts from; ``{extra}`` adds or overrides sections.
CONFIG = """\
name: t
model: {{name: llama-2-7b}}
hardware: {{gpu: a100-80gb}}
workload:
  arrivals: {{kind: poisson, rate: 20.0}}
  lengths: {{kind: uniform, prompt_min: 10, prompt_max: 600, output_min: 1, output_max: 300}}
  num_requests: 60
{extra}
"""

TIME_COLUMNS = ("scheduled_s", "first_token_s", "finish_s")


def step(s, t: int):
    """One scheduler step from ``t`` to ``t + 1`` s (an empty step completes nothing); the
    allocator's books are checked after it, so a broken invariant fails at the step that
    broke it. Returns the step."""
    x = s.schedule(float(t))
    if not x.empty:
        s.complete(x, float(t + 1))
    s.alloc.check()
    return x


def ids(groups) -> list[int]:
    """The request ids of ``groups``, in order: what the scenario docstrings talk in."""
    return [g.request.request_id for g in groups]


def config(tmp_path: Path, extra: str) -> Path:
    """Write ``CONFIG`` with ``extra`` YAML appended to ``tmp_path/c.yaml``; returns the path."""
    p = tmp_path / "c.yaml"
    p.write_text(CONFIG.format(extra=extra))
    return p


def config_error(tmp_path: Path, extra: str, overrides: list[str] | None = None) -> str:
    """Load ``CONFIG`` + ``extra`` (and ``--set`` overrides), expecting a ``ConfigError``;
    asserts the message is one line (the project's rule for user errors) and returns it."""
    with pytest.raises(ConfigError) as e:
        load_config(config(tmp_path, extra), overrides or [])
    message = str(e.value)
    assert "\n" not in message, message
    return message


def assert_round_trips(cfg, tmp_path: Path) -> None:
    """The resolved config (every key written out, as a run saves it) loads again to the
    same config: no default is lost or changed on the way."""
    p = tmp_path / "resolved.yaml"
    p.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    again, _ = load_config(p)
    assert again == cfg


def assert_same_requests(one: pd.DataFrame, other: pd.DataFrame, exact: tuple[str, ...]) -> None:
    """Two runs' request tables agree: the ``exact`` columns equal, the times (s) to 1e-9
    (closed-form runs add durations in another order than single steps do)."""
    for col in exact:
        assert one[col].tolist() == other[col].tolist(), col
    for col in TIME_COLUMNS:
        np.testing.assert_allclose(one[col].to_numpy(float), other[col].to_numpy(float),
                                   rtol=1e-9, atol=1e-9, err_msg=col)
