"""Soak: measure a demo model's capacity, then hold 85% of it for 10 minutes (not run in CI).

Capacity is the closed-loop throughput of 32 clients over a 60-s window (after 3 s of warm-up). The soak
is open-loop (Poisson arrivals at a fixed rate, so a slow server cannot slow the load down), over
keep-alive connections opened as needed. The server is pinned to core 0, this load generator to core 1
(as in the other benchmarks). Reported: errors (the goal is 0), refusals (429/503 answers), latency and
p99 against the SLO, and the server process's RSS over time (growth = a leak).

    python bench/soak.py                       # textcls, 600 s at 85% of a 60-s capacity window
    python bench/soak.py --model resnet-mini --duration 120 --load 0.5 --capacity-window 10 --slo-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bench.common import CLIENT_CPU, SERVER_CPU, bench_lock  # noqa: E402 - benchmarks never overlap

from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository  # noqa: E402
from batchpilot.testing.loadgen import run_load  # noqa: E402
from batchpilot.testing.requests import demo_requests  # noqa: E402
from test_hardening_server import Served, exchange, server_process  # noqa: E402

RSS_EVERY_S = 5.0


@dataclass
class Soak:
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: int = 0  # connection errors: no answer at all
    stale_retries: int = 0  # requests re-sent because their idle keep-alive connection had been closed
    latencies_s: list[float] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the soak, MiB)

    @property
    def errors(self) -> int:
        return self.failures + sum(n for s, n in self.statuses.items() if s != 200)


async def soak(served: Served, requests: list[bytes], rate: float, duration_s: float) -> Soak:
    result = Soak()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    tasks: set[asyncio.Task[None]] = set()
    rng = np.random.default_rng(0)

    async def one(request: bytes) -> None:
        reused = bool(idle)
        conn = idle.pop() if reused else await asyncio.open_connection("127.0.0.1", served.http)
        try:
            reply = await exchange(*conn, request)
        except (ConnectionError, asyncio.IncompleteReadError):
            conn[1].close()
            if not reused:
                result.failures += 1
                return
            # The server closes keep-alive connections idle for over 65 s; a request written to one that
            # was already closed never reached the server. Retry it once on a fresh connection, as HTTP
            # clients do, and count it apart.
            result.stale_retries += 1
            conn = await asyncio.open_connection("127.0.0.1", served.http)
            try:
                reply = await exchange(*conn, request)
            except (ConnectionError, asyncio.IncompleteReadError):
                result.failures += 1
                conn[1].close()
                return
        result.statuses[reply.status] = result.statuses.get(reply.status, 0) + 1
        if reply.status == 200:
            result.latencies_s.append(reply.seconds)
        idle.append(conn)

    start = time.perf_counter()
    next_rss = next_at = 0.0
    while (now := time.perf_counter() - start) < duration_s:
        if now >= next_rss:
            result.rss.append((now, served.rss_mib()))
            next_rss += RSS_EVERY_S
        task = asyncio.create_task(one(requests[int(rng.integers(len(requests)))]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        result.sent += 1
        # Poisson arrivals at `rate` per second, on an absolute schedule (no drift from slow sends).
        next_at += rng.exponential(1.0 / rate)
        await asyncio.sleep(max(0.0, start + next_at - time.perf_counter()))
    await asyncio.gather(*tasks)
    result.rss.append((time.perf_counter() - start, served.rss_mib()))
    for _, writer in idle:
        writer.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="textcls", choices=["textcls", "resnet-mini"])
    parser.add_argument("--duration", type=float, default=600.0, help="soak seconds")
    parser.add_argument("--load", type=float, default=0.85, help="fraction of the measured capacity")
    parser.add_argument("--capacity-window", type=float, default=60.0, help="seconds the capacity is measured over")
    parser.add_argument("--capacity-clients", type=int, default=32, help="closed-loop clients measuring capacity")
    parser.add_argument("--slo-ms", type=float, help="p99 SLO in ms (default: the demo model's spec)")
    args = parser.parse_args()
    slo_ms = args.slo_ms or build_demo_modules()[args.model][0].autotune.latency_slo_p99_ms
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {int(CLIENT_CPU)})  # the load generator on its own core
    with tempfile.TemporaryDirectory(prefix="batchpilot-soak-") as tmp, bench_lock():
        repository = Path(tmp) / "models"
        write_demo_repository(repository)
        with server_process(repository, Path(tmp) / "server.log") as served:
            if (os.cpu_count() or 1) > 1:  # every thread of the server onto the server core
                subprocess.run(
                    ["taskset", "-a", "-cp", SERVER_CPU, str(served.proc.pid)], check=True, capture_output=True
                )
            requests = demo_requests(args.model, f"127.0.0.1:{served.http}", count=256)
            asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=8, duration_s=3.0))  # warm-up
            capacity = asyncio.run(
                run_load(
                    "127.0.0.1",
                    served.http,
                    requests,
                    concurrency=args.capacity_clients,
                    duration_s=args.capacity_window,
                )
            ).throughput
            rate = args.load * capacity
            print(
                f"capacity {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {args.duration:.0f} s ...", flush=True
            )
            result = asyncio.run(soak(served, requests, rate, args.duration))
            code = served.stop()
    rss = [mib for _, mib in result.rss]
    lat = np.array(result.latencies_s) * 1e3
    refusals = sum(n for status, n in result.statuses.items() if status in (429, 503))
    p99 = float(np.percentile(lat, 99)) if lat.size else float("nan")
    rows = [
        ("model", args.model),
        (f"capacity (req/s, {args.capacity_clients} clients, {args.capacity_window:g} s)", f"{capacity:.1f}"),
        ("target rate (req/s)", f"{rate:.1f}"),
        ("achieved rate (req/s)", f"{sum(result.statuses.values()) / args.duration:.1f}"),
        ("requests sent", result.sent),
        ("answers by status", result.statuses),
        ("no answer", result.failures),
        ("re-sent after a stale keep-alive", result.stale_retries),
        ("errors (goal 0)", result.errors),
        ("refusals (429/503, among the errors)", refusals),
        (
            "latency p50 / p99 / max (ms)",
            f"{np.percentile(lat, 50):.1f} / {np.percentile(lat, 99):.1f} / {lat.max():.1f}" if lat.size else "-",
        ),
        (f"p99 within the SLO ({slo_ms:g} ms)", "yes" if p99 <= slo_ms else "NO"),
        ("RSS start / max / end (MiB)", f"{rss[0]:.0f} / {max(rss):.0f} / {rss[-1]:.0f}"),
        ("RSS growth (MiB)", f"{rss[-1] - rss[0]:+.1f}"),
        ("server exit status", code),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\nRSS (MiB) per minute: " + ", ".join(f"{mib:.0f}" for t, mib in result.rss if t % 60 < RSS_EVERY_S))
    return 0 if result.errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
