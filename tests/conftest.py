"""Suite-wide settings: property tests are judged on their assertions, never on wall time
(CI machines are slow and shared), so Hypothesis's per-example deadline is off; and the
long profile (``KVSIM_HYPOTHESIS_PROFILE=long``, hundreds to thousands of cases a test,
minutes each) lifts pytest-timeout's per-test limit, which is there for ``make test``."""

import os

import pytest
from hypothesis import settings

settings.register_profile("kvsim", deadline=None)
settings.load_profile("kvsim")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KVSIM_HYPOTHESIS_PROFILE") == "long":
        for item in items:
            item.add_marker(pytest.mark.timeout(0))
