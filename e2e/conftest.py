"""The end-to-end flow reuses the operator tests' kmock emulator (tests/operator/kmockkit.py) and the chart
tests' Helm rendering (tests/chart/chartkit.py)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
for helpers in (TESTS / "operator", TESTS / "chart"):
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))
