"""Servers as child processes on free loopback ports, and polling them until they are ready."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range when it can: a port from that range
    can become some outgoing connection's local end between this check and the server's bind (seen: kwok's
    "address already in use" on a port picked here)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200 if low > 11000 else 0):
        port = rng.randrange(10000, low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@contextmanager
def child_process(
    command: list[str], ready_url: str, *, env: dict[str, str] | None = None, log_path: Path | None = None
) -> Iterator[subprocess.Popen]:
    """Run a server as a child process until `ready_url` answers 200; SIGTERM it (then kill) afterwards."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 (closed below, after the child)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        wait_ready(ready_url, timeout_s=180, proc=proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not isinstance(log, int):
            log.close()


@contextmanager
def serving(
    repository: Path,
    *extra: str,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    log_level: str = "WARNING",
) -> Iterator[tuple[int, int]]:
    """Run `batchpilot serve` in a child process on free loopback ports; yields (http, grpc) ports.
    `prefix` goes before the command (e.g. taskset to pin the server to a core)."""
    http, grpc_port = free_port(), free_port()
    command = [*prefix, *serve_command(repository, http, grpc_port, *extra, log_level=log_level)]
    with child_process(command, ready_url(http), env=env, log_path=log_path):
        yield http, grpc_port


def serve_command(repository: Path, http: int, grpc_port: int, *extra: str, log_level: str = "WARNING") -> list[str]:
    """`batchpilot serve` of `repository` on loopback ports, with this Python."""
    return [
        *(sys.executable, "-m", "batchpilot", "--log-level", log_level, "serve"),
        *("--model-repository", str(repository), "--http-port", str(http), "--grpc-port", str(grpc_port)),
        *("--host", "127.0.0.1", *extra),
    ]


def ready_url(http: int) -> str:
    return f"http://127.0.0.1:{http}/v2/health/ready"


def get_json(url: str, timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())
