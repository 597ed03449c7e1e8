"""Make this folder's test modules importable by each other (``test_cli_bad_inputs`` builds
its measured run with ``test_validate.make_folder``), as tests/reference/conftest.py does
for its helpers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
