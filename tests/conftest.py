"""Suite-wide settings.

Property tests are judged on their assertions, never on wall time (CI machines are slow and
shared), so Hypothesis's per-example deadline is off.

``make test`` is deterministic: every property test draws the same examples on every run
(``--hypothesis-seed=0`` in pyproject's pytest options; the examples also depend on the
Hypothesis version, which the ``dev`` extra pins), and first replays the failures saved in
``tests/hypothesis-failures/`` by earlier long runs, read-only. So a test fails for a
change, never for a lucky or unlucky draw.

``make test-long`` (``KVSIM_HYPOTHESIS_PROFILE=long`` and a fresh random seed, printed)
runs hundreds to thousands of cases a test and saves every failure it finds into
``tests/hypothesis-failures/``: commit it, and ``make test`` replays it from then on (and
paste the printed case into a regression test, which outlives the test's source). The long
profile also lifts pytest-timeout's per-test limit, which is there for ``make test``.
"""

import os
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

SAVED_FAILURES = Path(__file__).resolve().parent / "hypothesis-failures"
LONG = os.environ.get("KVSIM_HYPOTHESIS_PROFILE") == "long"

settings.register_profile(
    "kvsim", deadline=None, database=ReadOnlyDatabase(DirectoryBasedExampleDatabase(SAVED_FAILURES))
)
settings.register_profile(
    "kvsim-long", deadline=None, database=DirectoryBasedExampleDatabase(SAVED_FAILURES)
)
settings.load_profile("kvsim-long" if LONG else "kvsim")


def pytest_collection_modifyitems(config, items):
    if LONG:
        for item in items:
            item.add_marker(pytest.mark.timeout(0))
