"""Soak: measure a demo model's open-loop capacity, then hold 85% of it for 10 minutes (not run in CI).

Capacity (default --capacity-basis open): the highest Poisson arrival rate at which a *static* setting
(--static, default the demo spec's own 16 items / 2 ms, autotune off) holds p99 within the SLO with no
refusals and no errors, measured on a server of its own with the open-loop client of the autotuner
benchmark's open-loop rows (bench/common.py open_loop_capacity):
  1. warm-up (3 s, 8 closed-loop clients), then the closed-loop throughput of --capacity-clients (32) over
     --closed-window (10 s): printed for reference, and the search's starting rate;
  2. the search: probes of --search-warmup (2 s, discarded) + --search-window (6 s), down from that rate
     while they fail, then bisecting to 5%; at most --search-probes (8) probes and --search-budget (90 s);
     every probe printed;
  3. the rate found confirmed over one --capacity-window (60 s) window: if that window fails (p99 over the
     SLO, a refusal or an error), the rate drops 5% (or to 95% of the answers per second that window
     achieved, when lower) and is confirmed again (at most --confirm-tries in all; common.confirm_capacity);
     the capacity is the confirmed rate (the last one tried, flagged, when none held). --capacity-window 0
     skips the confirmation.
--capacity-basis closed keeps the older basis: the closed-loop throughput of --capacity-clients over
--capacity-window on the soaked server itself (an open loop at 85% of it overloads the server: the clients
of a closed loop never queue more than themselves). --capacity RPS skips the measurement.

The soak then runs on a fresh server: the demo spec as written (autotuned; --mode static: the --static
setting), 3 s of closed-loop warm-up, then open loop (Poisson arrivals at a fixed rate, so a slow server
cannot slow the load down) over keep-alive connections opened as needed; latency counts from each request's
scheduled arrival, as in the capacity search. The servers are pinned to core 0, this load generator to core 1
(as in the other benchmarks). Reported: errors (the goal is 0), refusals (429/503 answers), latency and p99
against the SLO, the client's lateness p99 (its send minus the scheduled arrival; above 5 ms the client, not
the server, set the pace: flagged), and the soaked server's RSS over time (growth = a leak), with its open file
descriptors and the client's open connections beside it (a stall makes the client open more connections, each of
which the server holds until it is idle for its keep-alive time).

Wall time at the defaults: about 1.5-6.5 min of capacity measurement (servers' start, 13 s closed loop, a
search of at most 90 s, one to five 60-s confirmations) plus the 600-s soak: 12-17 min. (Two confirmations were
too few on a host whose speed drifts: run AN's soak ran at 85% of a rate that failed both, an overload.)

    python bench/soak.py                       # textcls, 600 s at 85% of the open-loop capacity
    python bench/soak.py --model resnet-mini --duration 120 --load 0.5 --capacity-window 10 --slo-ms 100
    python bench/soak.py --capacity 700        # no capacity measurement: 85% of 700 req/s
    python bench/soak.py --duration 5 --closed-window 2 --search-window 2 --search-warmup 1 --search-probes 2 \\
        --capacity-window 2                    # smoke test (about a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from bench.common import (  # noqa: E402 - benchmarks never overlap
    CLIENT_CPU,
    LAG_LIMIT_MS,
    SERVER_CPU,
    bench_lock,
    confirm_capacity,
    lag_text,
    open_loop_capacity,
)

from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository  # noqa: E402
from batchpilot.runtime.repository import SPECS_ENV  # noqa: E402
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
    latencies_s: list[float] = field(default_factory=list)  # from the scheduled arrival, status 200 only
    lags_s: list[float] = field(default_factory=list)  # each request's send minus its scheduled arrival
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the soak, MiB)
    # Beside each RSS sample: the server's open file descriptors (its connections and ~30 others) and the
    # connections this client holds open (the most it needed at once over the server's keep-alive time).
    fds: list[int] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    most_connections: int = 0

    @property
    def errors(self) -> int:
        return self.failures + sum(n for s, n in self.statuses.items() if s != 200)

    @property
    def lag_p99_ms(self) -> float:
        return float(np.percentile(self.lags_s, 99)) * 1e3 if self.lags_s else 0.0


async def soak(served: Served, requests: list[bytes], rate: float, duration_s: float) -> Soak:
    result = Soak()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    tasks: set[asyncio.Task[None]] = set()
    rng = np.random.default_rng(0)
    opened = 0

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        nonlocal opened
        conn = await asyncio.open_connection("127.0.0.1", served.http)
        opened += 1
        result.most_connections = max(result.most_connections, opened)
        return conn

    def close(writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        writer.close()
        opened -= 1

    async def one(request: bytes, at: float) -> None:
        reused = bool(idle)
        conn = idle.pop() if reused else await connect()
        result.lags_s.append(time.perf_counter() - at)
        try:
            reply = await exchange(*conn, request)
        except (ConnectionError, asyncio.IncompleteReadError):
            close(conn[1])
            if not reused:
                result.failures += 1
                return
            # The server closes keep-alive connections idle for over 65 s; a request written to one that
            # was already closed never reached the server. Retry it once on a fresh connection, as HTTP
            # clients do, and count it apart.
            result.stale_retries += 1
            conn = await connect()
            try:
                reply = await exchange(*conn, request)
            except (ConnectionError, asyncio.IncompleteReadError):
                result.failures += 1
                close(conn[1])
                return
        result.statuses[reply.status] = result.statuses.get(reply.status, 0) + 1
        if reply.status == 200:
            result.latencies_s.append(time.perf_counter() - at)
        idle.append(conn)

    def sample(at: float) -> None:
        result.rss.append((at, served.rss_mib()))
        result.fds.append(served.open_fds())
        result.connections.append(opened)

    start = time.perf_counter()
    next_rss = next_at = 0.0
    while (now := time.perf_counter() - start) < duration_s:
        if now >= next_rss:
            sample(now)
            next_rss += RSS_EVERY_S
        task = asyncio.create_task(one(requests[int(rng.integers(len(requests)))], start + next_at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        result.sent += 1
        # Poisson arrivals at `rate` per second, on an absolute schedule (no drift from slow sends).
        next_at += rng.exponential(1.0 / rate)
        await asyncio.sleep(max(0.0, start + next_at - time.perf_counter()))
    await asyncio.gather(*tasks)
    sample(time.perf_counter() - start)
    for _, writer in idle:
        close(writer)
    return result


def static_specs_env(model: str, size: int, delay_ms: float) -> dict[str, str]:
    """BATCHPILOT_MODEL_SPECS holding `model` at a fixed (size, delay), autotune off (the other demo model as
    the repository writes it)."""
    doc = build_demo_modules()[model][0].model_dump(mode="json", by_alias=True)
    doc["autotune"]["enabled"] = False
    doc["batching"].update(maxBatchSize=size, maxQueueDelayMicroseconds=int(delay_ms * 1000))
    return {SPECS_ENV: json.dumps([doc])}


def pin_server(served: Served) -> None:
    """Every thread of the server and of its child processes onto the server core. (Its plan worker, spawned before
    the server is ready, had kept this script's core, the load generator's, until this pinned the children too.)"""
    if (os.cpu_count() or 1) > 1:
        for pid in process_tree(served.proc.pid):
            subprocess.run(["taskset", "-a", "-cp", SERVER_CPU, str(pid)], check=True, capture_output=True)


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc's lists of each thread's children."""
    tree, todo = [], [pid]
    while todo:
        tree.append(p := todo.pop())
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in children.read_text().split()]
    return tree


def closed_loop(served: Served, requests: list[bytes], clients: int, seconds: float) -> float:
    """3 s of warm-up (8 clients), then the closed-loop throughput of `clients` over `seconds`."""
    asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=8, duration_s=3.0))
    return asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=clients, duration_s=seconds)).throughput


def open_capacity(repository: Path, tmp: Path, args: argparse.Namespace, slo_ms: float) -> tuple[float, float, str]:
    """(open-loop capacity, closed-loop reference, how the capacity was found), on a static server."""
    size, delay = args.static
    env = static_specs_env(args.model, size, delay)
    with server_process(repository, tmp / "capacity-server.log", env=env) as served:
        pin_server(served)
        reqs = demo_requests(args.model, f"127.0.0.1:{served.http}", count=256)  # the soak's requests
        closed = closed_loop(served, reqs, args.capacity_clients, args.closed_window)
        print(
            f"static {size} / {delay:g} ms: closed-loop throughput {closed:.1f} req/s ({args.capacity_clients} "
            f"clients, {args.closed_window:g} s); open-loop capacity search from there ...",
            flush=True,
        )
        search = asyncio.run(
            open_loop_capacity(
                "127.0.0.1",
                served.http,
                reqs,
                start_rps=closed,
                slo_ms=slo_ms,
                window_s=args.search_window,
                warmup_s=args.search_warmup,
                budget_s=args.search_budget,
                max_probes=args.search_probes,
            )
        )
        found = search.rps is not None
        rate = search.rate
        how = (
            f"open loop, static {size} / {delay:g} ms: search of {len(search.probes)} probes ({search.seconds:.0f} s)"
            + ("" if found else ", NONE passed: the lowest rate tried")
            + ("" if not found or search.resolution_met else ", bracket not narrowed to 5%")
        )
        if args.capacity_window > 0 and found:
            held = asyncio.run(
                confirm_capacity(
                    "127.0.0.1",
                    served.http,
                    reqs,
                    rate,
                    slo_ms=slo_ms,
                    window_s=args.capacity_window,
                    warmup_s=args.search_warmup,
                    tries=args.confirm_tries,
                )
            )
            rate = held.rate
            how += f", {held.text()}"
        if search.client_behind:
            how += f"; client behind (lag p99 > {LAG_LIMIT_MS:g} ms) in some probe"
    return rate, closed, how


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="textcls", choices=["textcls", "resnet-mini"])
    parser.add_argument("--duration", type=float, default=600.0, help="soak seconds")
    parser.add_argument("--load", type=float, default=0.85, help="fraction of the measured capacity")
    parser.add_argument(
        "--capacity-basis",
        choices=["open", "closed"],
        default="open",
        help="open (default): the open-loop capacity of the --static setting; closed: the older closed-loop basis",
    )
    parser.add_argument(
        "--capacity-window",
        type=float,
        default=60.0,
        help="open basis: the window the capacity found is confirmed over (0: none); closed basis: the "
        "closed-loop measurement's seconds",
    )
    parser.add_argument(
        "--capacity-clients", type=int, default=32, help="closed-loop clients (the reference figure / closed basis)"
    )
    parser.add_argument(
        "--closed-window", type=float, default=10.0, help="open basis: seconds of the closed-loop reference run"
    )
    parser.add_argument(
        "--static",
        default=None,
        metavar="SIZE/DELAY_MS",
        help="the static setting whose open-loop capacity is measured, and soaked with --mode static (default: the demo spec's, 16/2)",
    )
    parser.add_argument("--search-window", type=float, default=6.0, help="seconds measured per search probe")
    parser.add_argument("--search-warmup", type=float, default=2.0, help="seconds of warm-up per search probe")
    parser.add_argument("--search-probes", type=int, default=8, help="at most this many search probes")
    parser.add_argument("--search-budget", type=float, default=90.0, help="seconds the search may take (at most)")
    parser.add_argument(
        "--confirm-tries", type=int, default=5, help="confirmation windows at most (each after a failure lower)"
    )
    parser.add_argument("--capacity", type=float, help="capacity in req/s: no capacity measurement")
    parser.add_argument(
        "--mode",
        choices=["autotuned", "static"],
        default="autotuned",
        help="the soaked server: the demo spec as written (autotuned, default) or the --static setting",
    )
    parser.add_argument(
        "--heap-trim-interval", type=float, default=10.0, help="the soaked server's --heap-trim-interval (0: never)"
    )
    parser.add_argument("--slo-ms", type=float, help="p99 SLO in ms (default: the demo model's spec)")
    parser.add_argument(
        "--server-log", type=Path, help="keep the soaked server's log here, at INFO (its autotune lines)"
    )
    args = parser.parse_args()
    spec = build_demo_modules()[args.model][0]
    slo_ms = args.slo_ms or spec.autotune.latency_slo_p99_ms
    try:
        size, delay = args.static.split("/") if args.static else (spec.batching.max_batch_size, None)
        args.static = (
            int(size),
            float(delay) if delay is not None else spec.batching.max_queue_delay_microseconds / 1000,
        )
    except ValueError:
        parser.error(f"--static wants SIZE/DELAY_MS, e.g. 16/2: {args.static}")
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {int(CLIENT_CPU)})  # the load generator on its own core
    closed: float | None = None
    with tempfile.TemporaryDirectory(prefix="batchpilot-soak-") as tmp, bench_lock():
        repository = Path(tmp) / "models"
        write_demo_repository(repository)
        if args.capacity:
            capacity, how = args.capacity, "given (--capacity)"
        elif args.capacity_basis == "open":
            capacity, closed, how = open_capacity(repository, Path(tmp), args, slo_ms)
        env = static_specs_env(args.model, *args.static) if args.mode == "static" else None
        log, level = (args.server_log, "INFO") if args.server_log else (Path(tmp) / "server.log", "WARNING")
        trim = ("--heap-trim-interval", str(args.heap_trim_interval))
        with server_process(repository, log, *trim, env=env, log_level=level) as served:
            pin_server(served)
            requests = demo_requests(args.model, f"127.0.0.1:{served.http}", count=256)
            if not args.capacity and args.capacity_basis == "closed":
                capacity = closed = closed_loop(served, requests, args.capacity_clients, args.capacity_window)
                how = (
                    f"closed loop, {args.capacity_clients} clients over {args.capacity_window:g} s, {args.mode} server"
                )
            else:
                asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=8, duration_s=3.0))  # warm-up
            rate = args.load * capacity
            print(
                f"capacity {capacity:.1f} req/s ({how}); soaking the {args.mode} server at {rate:.1f} req/s for "
                f"{args.duration:.0f} s ...",
                flush=True,
            )
            result = asyncio.run(soak(served, requests, rate, args.duration))
            code = served.stop()
    rss = [mib for _, mib in result.rss]
    lat = np.array(result.latencies_s) * 1e3
    refusals = sum(n for status, n in result.statuses.items() if status in (429, 503))
    p99 = float(np.percentile(lat, 99)) if lat.size else float("nan")
    rows = [
        ("model", args.model),
        ("soaked server", args.mode + (f" {args.static[0]} / {args.static[1]:g} ms" if args.mode == "static" else "")),
        ("capacity (req/s)", f"{capacity:.1f} ({how})"),
        (
            f"closed-loop throughput (req/s, {args.capacity_clients} clients; reference)",
            "-" if closed is None else f"{closed:.1f}",
        ),
        ("target rate (req/s)", f"{rate:.1f}"),
        ("achieved rate (req/s)", f"{sum(result.statuses.values()) / args.duration:.1f}"),
        ("requests sent", result.sent),
        ("answers by status", result.statuses),
        ("no answer", result.failures),
        ("re-sent after a stale keep-alive", result.stale_retries),
        ("errors (goal 0)", result.errors),
        ("refusals (429/503, among the errors)", refusals),
        (
            "latency from arrival p50 / p99 / max (ms)",
            f"{np.percentile(lat, 50):.1f} / {np.percentile(lat, 99):.1f} / {lat.max():.1f}" if lat.size else "-",
        ),
        (f"p99 within the SLO ({slo_ms:g} ms)", "yes" if p99 <= slo_ms else "NO"),
        (f"client lag p99 (ms; > {LAG_LIMIT_MS:g}: client behind)", lag_text(result.lag_p99_ms)),
        ("RSS start / max / end (MiB)", f"{rss[0]:.0f} / {max(rss):.0f} / {rss[-1]:.0f}"),
        ("RSS growth (MiB)", f"{rss[-1] - rss[0]:+.1f}"),
        ("heap trimmed every (s)", f"{args.heap_trim_interval:g}" if args.heap_trim_interval > 0 else "never"),
        ("server exit status", code),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    minutes = [i for i, (t, _) in enumerate(result.rss) if t % 60 < RSS_EVERY_S]
    print("\nRSS (MiB) per minute: " + ", ".join(f"{result.rss[i][1]:.0f}" for i in minutes))
    print("server open fds per minute: " + ", ".join(str(result.fds[i]) for i in minutes))
    print(
        "client connections per minute: "
        + ", ".join(str(result.connections[i]) for i in minutes)
        + f" (most at once: {result.most_connections})"
    )
    return 0 if result.errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
