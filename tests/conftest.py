"""Shared fixtures: the demo model repository and a real `batchpilot serve` process on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from batchpilot.runtime.demo_models import write_demo_repository
from batchpilot.testing.processes import serving
from reference import MAX_BODY

# CI runs the property tests with fixed seeds so a red run reproduces; bench/fuzz.py explores further.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_sessionstart(session: pytest.Session) -> None:
    """`make test` (and so CI) sets BATCHPILOT_REQUIRE_TOOLS: there a missing perf_analyzer is an error, not a
    skip (a moved module once made its tests skip silently). A bare `pytest` may still skip them."""
    from batchpilot.testing.perfa import find_perf_analyzer

    if os.environ.get("BATCHPILOT_REQUIRE_TOOLS") and find_perf_analyzer() is None:
        raise pytest.UsageError("perf_analyzer not found: `make setup` installs it into .tools/bin")


@pytest.fixture(scope="session")
def demo_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_demo_repository(root)
    return root


@pytest.fixture(scope="session")
def server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(http_port, grpc_port) of a server with batching on, shared by the tests that only read or infer."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with serving(demo_repository, "--torch-threads", "1", "--max-body-bytes", str(MAX_BODY), log_path=log) as ports:
        yield ports
