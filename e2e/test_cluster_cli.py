"""`batchpilot cluster` (what `make cluster` runs): ready with a usable kubeconfig, then torn down cleanly on
SIGINT (Ctrl-C) or SIGTERM, leaving no component running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clusterkit import BIN, REPO

from batchpilot.devcluster.cluster import FAKE_NODE

pytestmark = pytest.mark.timeout(240)


def _children_alive(pids: list[int]) -> list[int]:
    return [
        p for p in pids if os.path.exists(f"/proc/{p}") and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]
    ]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cluster_command_serves_then_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    workdir = tmp_path / "cluster"
    proc = subprocess.Popen(
        [
            str(BIN / "batchpilot"),
            "cluster",
            "--no-kserve",
            "--dir",
            str(workdir),
            "--bin-dir",
            str(REPO / ".tools/bin"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        t0 = time.monotonic()
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("export KUBECONFIG="):
                break
        ready_s = time.monotonic() - t0
        kubeconfig = lines[-1].strip().removeprefix("export KUBECONFIG=")
        assert kubeconfig == str((workdir / "kubeconfig").resolve()), lines
        nodes = subprocess.run(
            [str(REPO / ".tools/bin/kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert [n["metadata"]["name"] for n in json.loads(nodes.stdout)["items"]] == [FAKE_NODE]
        components = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(components) == 5, components  # etcd, API server, controller manager, scheduler, kwok

        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        rest = proc.stdout.read()
        assert "cluster stopped" in rest, rest
        assert _children_alive(components) == []
        print(f"\nbatchpilot cluster: ready in {ready_s:.1f} s, stopped on {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
