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
