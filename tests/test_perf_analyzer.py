"""NVIDIA's perf_analyzer, unmodified, against every demo model over HTTP and gRPC: zero errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchpilot.testing.perfa import find_perf_analyzer, run_perf_analyzer
from batchpilot.testing.requests import perf_analyzer_token_data

pytestmark = pytest.mark.skipif(
    find_perf_analyzer() is None, reason="perf_analyzer not installed (make setup runs tools/install-perf-analyzer.sh)"
)

# Short, bounded measurements: this checks protocol compatibility, the benchmarks measure speed.
QUICK = ["--measurement-mode", "count_windows", "--measurement-request-count", "60", "-s", "100", "--max-trials", "6"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["resnet-mini", "textcls"])
def test_perf_analyzer_runs_clean(server, tmp_path: Path, model: str, protocol: str) -> None:
    port = server[0] if protocol == "http" else server[1]
    data = ["--input-data", str(perf_analyzer_token_data(tmp_path / "tokens.json"))] if model == "textcls" else []
    # Stability is a benchmark's concern (a busy CI machine may not reach it); any failed request makes
    # perf_analyzer exit non-zero, which run_perf_analyzer raises on.
    rows = run_perf_analyzer(
        model,
        f"127.0.0.1:{port}",
        protocol,
        concurrency_range="2:8:6",
        extra_args=[*data, *QUICK],
        timeout=240,
        require_stable=False,
    )
    assert rows and {row["concurrency"] for row in rows} <= {2, 8}
    assert all(row["infer_per_s"] > 0 for row in rows), rows
