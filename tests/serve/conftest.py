"""serve/ holds scripts, not a package: put it on sys.path for the tests."""

import sys
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "serve"
if str(SERVE) not in sys.path:
    sys.path.insert(0, str(SERVE))
