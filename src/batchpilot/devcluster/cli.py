"""`batchpilot cluster`: run the local control plane in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any


def add_cluster_parser(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="run a local Kubernetes control plane (etcd, API server, controllers, "
        "scheduler, kwok) on 127.0.0.1 until Ctrl-C",
    )
    cluster.add_argument("--dir", default=".cluster", help="state, logs and kubeconfig (wiped at start)")
    cluster.add_argument(
        "--bin-dir",
        default=os.environ.get("BATCHPILOT_TOOLS_BIN", ".tools/bin"),
        help="where `make controlplane` put the binaries",
    )
    cluster.add_argument(
        "--kserve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run KServe's controller manager and webhooks (Standard mode)",
    )
    cluster.set_defaults(func=run_cluster)


def run_cluster(args: argparse.Namespace) -> int:
    import shutil

    from batchpilot.devcluster import LocalCluster

    workdir = Path(args.dir)
    shutil.rmtree(workdir, ignore_errors=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = LocalCluster(workdir, Path(args.bin_dir))
    try:
        seconds = cluster.start()
        if args.kserve:
            from batchpilot.devcluster.kserve import KServe

            seconds += KServe(cluster).start()
        print(
            f"cluster ready in {seconds:.0f} s; logs in {cluster.logs}\n"
            f"export KUBECONFIG={cluster.kubeconfig.resolve()}",
            flush=True,
        )
        while not stop.is_set():
            dead = [c.name for c in cluster.components.values() if not c.running()]
            if dead:
                print(f"stopped: {', '.join(dead)} exited (see {cluster.logs})", flush=True)
                return 1
            stop.wait(1.0)
        return 0
    finally:
        t0 = time.monotonic()
        cluster.stop()
        print(f"cluster stopped in {time.monotonic() - t0:.1f} s", flush=True)
