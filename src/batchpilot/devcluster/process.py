"""Child processes of the local cluster: started with their output in one log file each, stopped in
reverse order with SIGTERM (then SIGKILL), and waited for with a readiness probe."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchpilot.testing.processes import free_port

__all__ = ["ClusterError", "Component", "free_port", "wait_until"]


class ClusterError(RuntimeError):
    """The cluster could not be started (the message names the component and its log)."""


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            # A session of its own: a Ctrl-C in the terminal reaches the launcher, which stops us in order.
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_until(component: Component, probe: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `probe` until it is true; fail early, with the log's tail, if the component exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not component.running():
            code = component.proc.returncode if component.proc else None
            raise ClusterError(f"{component.name} exited ({code}) before {what}; {component.log}:\n{component.tail()}")
        try:
            if probe():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise ClusterError(f"{component.name}: not {what} within {timeout_s:.0f} s; {component.log}:\n{component.tail()}")
