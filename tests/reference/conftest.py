"""Make this folder's helpers (``ref_cases``, ``ref_compare``) importable by its tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
