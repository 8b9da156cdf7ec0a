from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chartkit import CHART_DIR, VALUE_SETS

INFO = 1  # severities: 0 unknown, 1 info, 2 warning, 3 error


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_reports_no_error_or_warning(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART_DIR, values, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > INFO] == []
