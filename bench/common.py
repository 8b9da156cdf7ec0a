"""Shared plumbing of the benchmarks: pinned server processes, wrk runs, raw model throughput, tables."""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from batchpilot.runtime.demo_models import IMAGE_SIZE, VOCAB_SIZE, build_demo_modules
from batchpilot.testing.loadgen import _read_response
from batchpilot.testing.processes import child_process, free_port, serving
from batchpilot.testing.requests import v2_binary_body

ROOT = Path(__file__).resolve().parent.parent

# The asyncio load generators run on uvloop (in the venv: the server's own loop): on one core the default
# loop fell behind its Poisson schedule at ~1,000 req/s (p99 lateness 4-9 ms); uvloop costs less per request.
with suppress(ImportError):
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
SERVER_CPU = "0"  # the server gets one core...
CLIENT_CPU = "1"  # ...and the load generator the other
BENCH_LOCK = Path("/tmp/batchpilot-bench.lock")  # benchmarks on this shared machine never overlap
SEQ_LEN = 32  # every NLP request carries exactly this many tokens, so every system does the same work


@contextmanager
def bench_lock() -> Iterator[float]:
    """Hold the machine-wide benchmark lock (blocking); yields the seconds spent waiting for it."""
    start = time.monotonic()
    with open(BENCH_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pinned(cpu: str, command: Sequence[str]) -> list[str]:
    return ["taskset", "-c", cpu, *command] if os.cpu_count() and os.cpu_count() > 1 else list(command)


def process(command: Sequence[str], ready_url: str, env: dict[str, str] | None = None, log: Path | None = None):
    """A server child process, ready when `ready_url` answers (see runtime.demo.child_process)."""
    return child_process(list(command), ready_url, env=env, log_path=log)


def batchpilot_server(repository: Path, *extra: str, env: dict[str, str] | None = None):
    """`batchpilot serve` pinned to the server core, one torch thread; yields (http, grpc) ports."""
    prefix = tuple(pinned(SERVER_CPU, []))
    return serving(repository, "--torch-threads", "1", *extra, env=env, prefix=prefix)


@contextmanager
def stock_kserve_server(model_path: Path, name: str, output: str) -> Iterator[int]:
    http, grpc = free_port(), free_port()
    command = pinned(
        SERVER_CPU,
        [
            sys.executable,
            str(ROOT / "bench" / "stock_kserve.py"),
            "--model_path",
            str(model_path),
            "--model_name",
            name,
            "--output_name",
            output,
            "--http_port",
            str(http),
            "--grpc_port",
            str(grpc),
        ],
    )
    with process(command, f"http://127.0.0.1:{http}/v2/models/{name}/ready"):
        yield http


class MissingTool(Exception):
    """A load generator this benchmark needs is not installed (not an error of the system measured)."""


@dataclass
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def static_specs(setting: tuple[int, float] | None = None) -> str:
    """BATCHPILOT_MODEL_SPECS for the demo models with the autotuner off (fixed parameters to compare): each model's
    own batching parameters, or `setting` (max batch size, max queue delay in ms) for every model."""
    specs = []
    for spec, _ in build_demo_modules().values():
        doc = spec.model_dump(mode="json", by_alias=True)
        doc["autotune"]["enabled"] = False
        if setting is not None:
            size, delay_ms = setting
            doc["batching"].update(maxBatchSize=size, maxQueueDelayMicroseconds=round(delay_ms * 1000))
        specs.append(doc)
    return json.dumps(specs)


def wrk(
    url: str, body: bytes, headers: dict[str, str], *, connections: int, duration_s: int, workdir: Path
) -> WrkResult:
    """POST the same body over `connections` keep-alive connections; one wrk thread on the client core."""
    if shutil.which("wrk") is None:  # (else every row would read as a failed measurement)
        raise MissingTool("wrk is not installed: apt-get install wrk (Debian's package)")
    body_path = workdir / "body.bin"
    body_path.write_bytes(body)
    script = workdir / "post.lua"
    lines = ['wrk.method = "POST"', f'local f = io.open("{body_path}", "rb")', "wrk.body = f:read('*all')", "f:close()"]
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    script.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        pinned(CLIENT_CPU, ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(script), url]),
        capture_output=True,
        text=True,
        timeout=duration_s + 60,
        check=True,
    )
    out = done.stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    p50 = _ms(re.search(r"\n\s+50%\s+(\S+)", out).group(1))
    p99 = _ms(re.search(r"\n\s+99%\s+(\S+)", out).group(1))
    errors = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return WrkResult(rps, p50, p99, errors)


def raw_throughput(
    module: torch.nn.Module, make_args, batch_sizes: Sequence[int], seconds: float = 1.5
) -> dict[int, float]:
    """Items per second of the model alone (one thread, like the server), per batch size."""
    rates = {}
    with torch.inference_mode():
        for batch in batch_sizes:
            args = make_args(batch)
            for _ in range(3):
                module(*args)
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                module(*args)
                count += 1
            rates[batch] = batch * count / (time.perf_counter() - start)
    return rates


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (it reads fine in a terminal too)."""

    def cell(v: object) -> str:
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Workload:
    model: str
    body_label: str
    body: bytes
    headers: dict[str, str]


# -- request bodies (wrk's and the asyncio clients') ----------------------------------------------------------
def v2_json(name: str, datatype: str, array: np.ndarray) -> bytes:
    """A compact v2 JSON infer request with one input (flat `data`)."""
    doc = {
        "inputs": [{"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.reshape(-1).tolist()}]
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def workloads() -> dict[str, list[Workload]]:
    """Per model: the v2 JSON body every system gets, plus BatchPilot's binary-tensor extra."""
    rng = np.random.default_rng(0)
    values = np.round(rng.standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE)), 3)  # 3 decimals: ~78 KB of JSON
    image = values.astype(np.float32)
    tokens = rng.integers(1, VOCAB_SIZE, size=(1, SEQ_LEN), dtype=np.int64)
    json_headers = {"Content-Type": "application/json"}
    cv_json = v2_json("image", "FP32", values)
    nlp_json = v2_json("input_ids", "INT64", tokens)
    return {
        "json": [
            Workload("resnet-mini", f"v2 JSON FP32 [1,3,64,64], {len(cv_json) / 1e3:.0f} KB", cv_json, json_headers),
            Workload("textcls", f"v2 JSON INT64 [1,{SEQ_LEN}], {len(nlp_json)} B", nlp_json, json_headers),
        ],
        "binary": [
            Workload(
                "resnet-mini",
                "v2 binary tensors FP32 [1,3,64,64] (binary output)",
                *v2_binary_body("image", "FP32", image, ["logits"]),
            ),
            Workload(
                "textcls",
                f"v2 binary tensors INT64 [1,{SEQ_LEN}] (binary outputs)",
                *v2_binary_body("input_ids", "INT64", tokens, ["logits", "token_scores"]),
            ),
        ],
    }


def machine() -> str:
    """CPU model, cores, memory, kernel and Python, for the results pages."""
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.machine(),
    )
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    return f"{cpu}, {os.cpu_count()} cores, {mem / 2**20:.0f} GiB, Linux {platform.release()}, Python {platform.python_version()}"


def v2_json_body(name: str, datatype: str, shape: list[int], data: list) -> bytes:
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}).encode()


@dataclass
class Window:
    start_s: float
    requests_per_s: float  # answers with status 200 per second
    p99_ms: float  # of those answers; nan when none completed
    level: float  # closed loop: clients; open loop: offered arrivals per second
    errors: int = 0  # non-200 answers and requests that got no answer
    sent_per_s: float = 0.0  # requests sent (open loop: scheduled arrivals) in the window, per second


@dataclass
class Timeline:
    """A load run, request by request: when each one ended (s since the start), its latency and its HTTP
    status (0 = no answer: the connection failed)."""

    done_s: np.ndarray
    latency_s: np.ndarray
    status: np.ndarray
    steps: list[tuple[float, float]]  # (start s, clients or offered arrivals/s)
    end_s: float = 0.0  # when the schedule ended
    sent: int = 0
    unfinished: int = 0  # open loop: still unanswered when the drain time ran out
    skipped: int = 0  # open loop: arrivals not sent because the client's in-flight cap was reached
    stale_retries: int = 0  # open loop: re-sent on a fresh connection after an idle keep-alive one was closed
    lag_p99_ms: float = 0.0  # open loop: p99 of how late the client sent a request after its scheduled arrival
    lag_max_ms: float = 0.0  # open loop: the latest send

    @property
    def errors(self) -> int:
        return int(np.count_nonzero(self.status != 200)) + self.unfinished

    def statuses(self, t0: float = 0.0, t1: float = float("inf")) -> dict[int, int]:
        values, counts = np.unique(self.status[(self.done_s >= t0) & (self.done_s < t1)], return_counts=True)
        return {int(v): int(n) for v, n in zip(values, counts, strict=True)}

    def spans(self) -> list[tuple[float, float, float]]:
        """Each step of the schedule as (start s, end s, level), in order."""
        ends = [start for start, _ in self.steps[1:]] + [self.end_s]
        return [(start, end, level) for (start, level), end in zip(self.steps, ends, strict=True)]

    def between(self, t0: float, t1: float) -> np.ndarray:
        """Latencies (s) of the successful requests that ended in [t0, t1)."""
        return self.latency_s[(self.done_s >= t0) & (self.done_s < t1) & (self.status == 200)]

    def rate_p99(self, t0: float, t1: float) -> tuple[float, float]:
        lat = self.between(t0, t1)
        return float(lat.size / (t1 - t0)), float(np.percentile(lat, 99)) * 1e3 if lat.size else float("nan")

    def errors_between(self, t0: float, t1: float) -> int:
        return int(np.count_nonzero((self.done_s >= t0) & (self.done_s < t1) & (self.status != 200)))

    def sent_between(self, t0: float, t1: float) -> int:
        """Requests sent in [t0, t1) that ended (sent = end - latency: open loop, the scheduled arrival)."""
        sent = self.done_s - self.latency_s
        return int(np.count_nonzero((sent >= t0) & (sent < t1)))

    def arrived(self, t0: float, t1: float) -> np.ndarray:
        """Mask of the requests whose scheduled arrival (open loop; closed loop: send) lies in [t0, t1),
        whenever they ended (after the schedule too, within the drain time)."""
        sent = self.done_s - self.latency_s
        return (sent >= t0) & (sent < t1)

    def level_at(self, t: float) -> float:
        return [self.steps[0][1], *(level for start, level in self.steps if start <= t)][-1]

    def windows(self, width_s: float = 1.0, start_s: float = 0.0, end_s: float | None = None) -> list[Window]:
        """Whole windows of `width_s` from `start_s` up to `end_s` (default: the end of the schedule)."""
        end = self.end_s if end_s is None else end_s
        starts = (float(t) for t in np.arange(start_s, end - width_s + 1e-6, width_s))
        return [
            Window(
                t,
                *self.rate_p99(t, t + width_s),
                self.level_at(t),
                self.errors_between(t, t + width_s),
                self.sent_between(t, t + width_s) / width_s,
            )
            for t in starts
        ]


async def closed_loop_timeline(
    host: str,
    port: int,
    requests: Sequence[bytes],
    schedule: Sequence[tuple[float, int]],
    seed: int = 0,
    t0: float | None = None,
) -> Timeline:
    """Closed-loop clients over keep-alive connections (as `batchpilot.testing.loadgen.run_load`), recording
    every answer's completion time; `schedule` is [(seconds, clients), ...] run one after the other. Times
    count from `t0` (a `time.perf_counter()` value; default: now), so other recorders can share it."""
    rng = np.random.default_rng(seed)
    done: list[float] = []
    latency: list[float] = []
    status: list[int] = []
    t0 = time.perf_counter() if t0 is None else t0
    steps: list[tuple[float, float]] = []

    async def client(deadline: float) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (start := time.perf_counter()) < deadline:
                writer.write(requests[int(rng.integers(len(requests)))])
                code = await _read_response(reader)
                end = time.perf_counter()
                done.append(end - t0)
                latency.append(end - start)
                status.append(code)
        finally:
            writer.close()

    for duration_s, clients in schedule:
        steps.append((time.perf_counter() - t0, clients))
        deadline = time.perf_counter() + duration_s
        await asyncio.gather(*(client(deadline) for _ in range(clients)))
    end_s = time.perf_counter() - t0
    return Timeline(np.asarray(done), np.asarray(latency), np.asarray(status, dtype=int), steps, end_s, len(done))


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_loop_timeline(
    host: str,
    port: int,
    requests: Sequence[bytes],
    schedule: Sequence[tuple[float, float]],
    seed: int = 0,
    t0: float | None = None,
    max_in_flight: int = 2048,
    drain_s: float = 10.0,
) -> Timeline:
    """Open loop: Poisson arrivals at each step's rate, `schedule` = [(seconds, arrivals/s), ...], on an
    absolute schedule (a slow server cannot slow the load down). Each request goes out on an idle keep-alive
    connection, or a new one when none is idle. Latency counts from the request's scheduled arrival, so the
    client's own lateness is charged too (no coordinated omission). Lateness = when the request's first byte
    was written (after its task got to run, and after connecting when no connection was idle) minus its
    scheduled arrival; `lag_p99_ms` is its p99 (above LAG_LIMIT_MS the client, not the server, set the pace).
    After the last step, requests still in flight get `drain_s` to finish; the rest count as unfinished."""
    rng = np.random.default_rng(seed)
    done: list[float] = []
    latency: list[float] = []
    status: list[int] = []
    lags: list[float] = []
    idle: list[_Conn] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter() if t0 is None else t0
    steps: list[tuple[float, float]] = []
    counts = {"sent": 0, "skipped": 0, "stale": 0}

    async def exchange(conn: _Conn, request: bytes, at: float | None = None) -> int:
        try:
            if at is not None:  # the first write of this request: its lateness
                lags.append(time.perf_counter() - at)
            conn[1].write(request)
            return await _read_response(conn[0])
        except BaseException:
            conn[1].close()
            raise

    async def one(request: bytes, at: float) -> None:
        code, conn, retry = 0, None, False
        try:
            if idle:
                conn = idle.pop()
                try:
                    code = await exchange(conn, request, at)
                except (ConnectionError, asyncio.IncompleteReadError):
                    # The server closed this idle keep-alive connection (idle timeout, or after an error
                    # answer): the request never reached it. Re-send once on a fresh one, as clients do.
                    counts["stale"] += 1
                    conn, retry = None, True
            if conn is None:
                conn = await asyncio.open_connection(host, port)
                code = await exchange(conn, request, None if retry else at)
        except (OSError, asyncio.IncompleteReadError):
            code = 0
        end = time.perf_counter()
        done.append(end - t0)
        latency.append(end - at)
        status.append(code)
        if code and conn is not None:
            idle.append(conn)

    for duration_s, rate in schedule:
        start = time.perf_counter()
        steps.append((start - t0, rate))
        at = start
        while (at := at + float(rng.exponential(1.0 / rate))) < start + duration_s:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))  # 0: just let the answers in
            if len(tasks) >= max_in_flight:
                counts["skipped"] += 1
                continue
            task = asyncio.create_task(one(requests[int(rng.integers(len(requests)))], at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            counts["sent"] += 1
        if (wait := start + duration_s - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
    end_s = time.perf_counter() - t0
    unfinished = 0
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain_s)
        unfinished = len(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for _, writer in idle:
        writer.close()
    return Timeline(
        np.asarray(done),
        np.asarray(latency),
        np.asarray(status, dtype=int),
        steps,
        end_s,
        sent=counts["sent"],
        unfinished=unfinished,
        skipped=counts["skipped"],
        stale_retries=counts["stale"],
        lag_p99_ms=float(np.percentile(lags, 99)) * 1e3 if lags else 0.0,
        lag_max_ms=max(lags) * 1e3 if lags else 0.0,
    )


LAG_LIMIT_MS = (
    5.0  # open loop: above this p99 lateness the client is behind its schedule (it, not the server, is the limit)
)


def say(line: str) -> None:
    """Print a progress line at once (benchmarks' output is often a file someone is watching)."""
    print(line, flush=True)


def lag_text(lag_p99_ms: float) -> str:
    """A run's client lateness p99 for a table, flagged when the client fell behind."""
    return f"{lag_p99_ms:.1f}" + (" (client behind)" if lag_p99_ms > LAG_LIMIT_MS else "")


@dataclass
class Probe:
    """One rate tried by `open_loop_capacity`: figures over the requests *scheduled* in the measured window
    (those that ended during the drain count; those never answered are errors)."""

    rate: float  # offered arrivals per second
    arrivals: int  # requests scheduled in the measured window (and sent)
    p99_ms: float  # of those answered 200, from the scheduled arrival
    achieved_rps: float  # answers with status 200 that ended in the window, per second
    refused: int  # 429 / 503 answers
    errors: int  # every other failure: other non-200 answers, no answer, unfinished, skipped by the in-flight cap
    lag_p99_ms: float  # the client's lateness (see open_loop_timeline)
    passed: bool  # p99 <= SLO, no refusals, no errors
    seconds: float  # wall time of the probe (warm-up, window, drain)


@dataclass
class CapacitySearch:
    """The open-loop capacity: the highest Poisson rate tried whose window met the SLO with no refusals and
    no errors (None when none did within the budget)."""

    rps: float | None
    start_rps: float
    slo_ms: float
    window_s: float
    warmup_s: float
    probes: list[Probe]
    seconds: float
    resolution_met: bool  # the bracket [highest pass, lowest fail] narrowed to the resolution asked

    @property
    def client_behind(self) -> bool:
        return any(p.lag_p99_ms > LAG_LIMIT_MS for p in self.probes)

    @property
    def rate(self) -> float:
        """The capacity found, else the lowest rate tried (which failed)."""
        return self.rps if self.rps is not None else min(p.rate for p in self.probes)

    def dump(self) -> dict[str, object]:
        return asdict(self) | {"client_behind": self.client_behind, "lag_limit_ms": LAG_LIMIT_MS}


def probe_of(t: Timeline, rate: float, slo_ms: float, seconds: float) -> Probe:
    """Judge an open-loop run of [(warm-up, rate), (window, rate)] on its last step's arrivals."""
    w0, w1 = t.steps[-1][0], t.end_s
    mask = t.arrived(w0, w1)
    status, lat = t.status[mask], t.latency_s[mask]
    ok = lat[status == 200] * 1e3
    p99 = float(np.percentile(ok, 99)) if ok.size else float("nan")
    refused = int(np.count_nonzero((status == 429) | (status == 503)))
    errors = int(np.count_nonzero(status != 200)) - refused + t.unfinished + t.skipped
    passed = bool(ok.size and p99 <= slo_ms and refused == 0 and errors == 0)
    achieved = t.between(w0, w1).size / max(1e-9, w1 - w0)
    return Probe(rate, int(mask.sum()), p99, achieved, refused, errors, t.lag_p99_ms, passed, seconds)


async def open_loop_capacity(
    host: str,
    port: int,
    requests: Sequence[bytes],
    *,
    start_rps: float,
    slo_ms: float,
    window_s: float = 6.0,
    warmup_s: float = 2.0,
    budget_s: float = 90.0,
    max_probes: int = 8,
    resolution: float = 0.05,
    drain_s: float = 2.0,
    log: Callable[[str], None] = say,
) -> CapacitySearch:
    """The highest Poisson arrival rate at which the server, as it is set up now, holds p99 (from the scheduled
    arrival) within `slo_ms` with no refusals and no errors, found with the open-loop client of the open-loop
    runs (`open_loop_timeline`). Each probe runs `warmup_s` at its rate (discarded; it also lets a previous
    probe's backlog clear), then a `window_s` window judged on the requests scheduled in it (see `probe_of`).
    Search: from `start_rps` (e.g. the closed-loop throughput) down while probes fail (to 0.85x the rate, or
    0.95x the answers per second the failing probe achieved when lower: under overload that is about the
    service rate) or up by 1.2x while they pass, then bisect between the highest pass and the lowest fail
    until they are within `resolution`; at most `max_probes` probes, and no probe started that would end
    after `budget_s` (the first always runs). Every probe is logged."""
    lo: float | None = None  # highest rate that passed
    hi: float | None = None  # lowest rate that failed
    rate, began = start_rps, time.perf_counter()
    probes: list[Probe] = []
    while len(probes) < max_probes and rate >= 1.0:
        elapsed = time.perf_counter() - began
        if probes and elapsed + warmup_s + window_s > budget_s:
            log(f"    capacity search: budget {budget_s:g} s reached after {len(probes)} probes ({elapsed:.0f} s)")
            break
        t0 = time.perf_counter()
        t = await open_loop_timeline(
            host, port, requests, [(warmup_s, rate), (window_s, rate)], seed=len(probes), drain_s=drain_s
        )
        p = probe_of(t, rate, slo_ms, time.perf_counter() - t0)
        probes.append(p)
        if p.passed:
            lo = max(lo or 0.0, rate)
        else:
            hi = min(hi or math.inf, rate)
        log(
            f"    capacity probe {len(probes)}: {rate:.0f}/s -> p99 {p.p99_ms:.1f} ms (SLO {slo_ms:g}), "
            f"{p.arrivals} arrivals, refused {p.refused}, errors {p.errors}, achieved {p.achieved_rps:.0f}/s, "
            f"client lag p99 {lag_text(p.lag_p99_ms)} ms: {'pass' if p.passed else 'FAIL'}; "
            f"bracket {'-' if lo is None else f'{lo:.0f}'} .. {'-' if hi is None else f'{hi:.0f}'} ({p.seconds:.1f} s)",
        )
        if lo is not None and hi is not None:
            if hi / lo - 1 <= resolution:
                break
            rate = (lo + hi) / 2
        elif lo is None:
            rate = min(0.85 * rate, 0.95 * p.achieved_rps) if p.achieved_rps > 0 else 0.85 * rate
        else:
            rate *= 1.2
    done = lo is not None and hi is not None and hi / lo - 1 <= resolution
    return CapacitySearch(lo, start_rps, slo_ms, window_s, warmup_s, probes, time.perf_counter() - began, bool(done))


@dataclass
class Confirmation:
    """A capacity held over a longer window than the search's probes (`confirm_capacity`)."""

    rate: float  # the confirmed rate when `held`, else the last one tried (which failed)
    held: bool
    window_s: float
    probes: list[Probe]

    def text(self) -> str:
        tried = ", ".join(f"{p.rate:.0f}/s{'' if p.passed else ' failed'}" for p in self.probes)
        verdict = "confirmed" if self.held else "NOT confirmed (the last rate tried)"
        return f"{verdict} over {self.window_s:g} s ({tried})"

    def dump(self) -> dict[str, object]:
        return asdict(self)


async def confirm_capacity(
    host: str,
    port: int,
    requests: Sequence[bytes],
    rate: float,
    *,
    slo_ms: float,
    window_s: float,
    warmup_s: float = 2.0,
    tries: int = 2,
    log: Callable[[str], None] = say,
) -> Confirmation:
    """Hold a searched capacity for one `window_s` window (after `warmup_s` at it), judged as a search probe. A
    search probe is short, and a host that ran fast for its few seconds passes a rate it does not hold for a
    minute (run AM: textcls passed 1,742/s over 6 s, then the same static setting read p99 715 ms at 80% of it).
    When the window fails the rate drops to 0.95x, or to 0.95x the answers per second the window achieved when
    lower (under overload about the service rate), and is tried again: at most `tries` windows."""
    probes: list[Probe] = []
    for i in range(max(1, tries)):
        t0 = time.perf_counter()
        t = await open_loop_timeline(host, port, requests, [(warmup_s, rate), (window_s, rate)], seed=99 + i)
        p = probe_of(t, rate, slo_ms, time.perf_counter() - t0)
        probes.append(p)
        log(
            f"    confirmation over {window_s:g} s at {rate:.0f}/s: p99 {p.p99_ms:.1f} ms, {p.arrivals} arrivals, "
            f"refused {p.refused}, errors {p.errors}, achieved {p.achieved_rps:.0f}/s, "
            f"client lag p99 {lag_text(p.lag_p99_ms)} ms: {'pass' if p.passed else 'FAIL'}"
        )
        if p.passed:
            return Confirmation(rate, True, window_s, probes)
        if i + 1 < tries:
            rate = min(0.95 * rate, 0.95 * p.achieved_rps) if p.achieved_rps > 0 else 0.95 * rate
    return Confirmation(rate, False, window_s, probes)


def _proc_stats() -> dict[int, tuple[int, int, float]]:
    """Every live process: pid -> (parent pid, session id, utime+stime+cutime+cstime in seconds).
    Children's times count once they are reaped (cutime/cstime), so short-lived workers are not lost."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # after "pid (comm)": state ppid pgrp session ... utime(12) stime(13) cutime(14) cstime(15)
        found[int(entry)] = (int(fields[1]), int(fields[3]), sum(int(v) for v in fields[11:15]) / tick)
    return found


def process_tree(root: int) -> set[int]:
    """`root`, its descendants, and every process of its session (servers that fork workers or daemons)."""
    stats = _proc_stats()
    tree = {root} | {pid for pid, (_, sid, _) in stats.items() if sid == root}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _, _) in stats.items() if ppid in tree} - tree
        tree |= children
        grew = bool(children)
    return tree & set(stats)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by a server's whole process tree."""
    return sum(process_cpu_seconds(root).values())


def process_cpu_seconds(root: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each process of a server's tree."""
    stats = _proc_stats()
    return {pid: stats[pid][2] for pid in process_tree(root) if pid in stats}


@contextmanager
def process_group(
    command: Sequence[str],
    ready_url: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    cwd: Path | None = None,
    ready_timeout_s: float = 300,
) -> Iterator[subprocess.Popen]:
    """Like `process`, for servers made of several processes: a session of its own, and on exit the
    whole tree gets SIGTERM, then SIGKILL after 30 s."""
    from batchpilot.testing.processes import wait_ready

    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 (closed when the child ends)
    proc = subprocess.Popen(
        list(command),
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        wait_ready(ready_url, timeout_s=ready_timeout_s, proc=proc)
        yield proc
    finally:
        tree = process_tree(proc.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in tree:
                with suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in tree - {proc.pid}):
                proc.poll()
                time.sleep(0.2)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
            if not any(os.path.exists(f"/proc/{p}") for p in tree - {proc.pid}):
                break
        if log:
            out.close()


def batchpilot_server_logged(
    repository: Path, *extra: str, log: Path, env: dict[str, str] | None = None, log_level: str = "INFO"
):
    """`batchpilot_server` with its log (at `log_level`, e.g. INFO for the autotune decisions) kept in `log`."""
    prefix = tuple(pinned(SERVER_CPU, []))
    return serving(
        repository, "--torch-threads", "1", *extra, env=env, prefix=prefix, log_path=log, log_level=log_level
    )
