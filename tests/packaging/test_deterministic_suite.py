"""``make test`` must give the same outcomes on every run: its property tests draw from a
fixed seed and replay the saved failures read-only (tests/conftest.py)."""

import os
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import ReadOnlyDatabase

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("KVSIM_HYPOTHESIS_PROFILE") == "long"


def test_property_tests_draw_from_a_fixed_seed(request):
    """``make test`` seeds 0, ``make test-long`` a fresh seed it prints: either run repeats."""
    assert request.config.getoption("--hypothesis-seed") is not None
    saves = not isinstance(settings.default.database, ReadOnlyDatabase)
    assert saves == LONG, "only the long profile saves the failures it finds"


DRAWN: list[list[int]] = []


@given(st.lists(st.integers(0, 10**9), min_size=3, max_size=3))
@settings(max_examples=5, database=None)
def _draw(xs):
    DRAWN[-1].append(tuple(xs))


def test_the_same_test_draws_the_same_examples_twice():
    for _ in range(2):
        DRAWN.append([])
        _draw()
    assert DRAWN[0] == DRAWN[1] and len(DRAWN[0]) == 5


def test_hypothesis_is_pinned_exactly():
    """A seed fixes the examples only under one Hypothesis version."""
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"hypothesis==[0-9.]+"', text), "the dev extra must pin hypothesis exactly"
