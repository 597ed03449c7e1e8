"""Make this folder's helper module (``tier_cases``) importable by its tests, as
tests/reference/conftest.py does; ``scheduler_cases`` lives in tests/simulator/ (its
conftest), shared with the config tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
