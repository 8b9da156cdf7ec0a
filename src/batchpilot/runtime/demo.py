"""`batchpilot demo`: serve the demo models locally, load them with and without batching, show the gain."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from .demo_models import IMAGE_SIZE, VOCAB_SIZE, write_demo_repository
from .loadgen import LoadResult, build_request, run_load


def v2_binary_body(name: str, datatype: str, array: np.ndarray, outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    """A v2 infer request in the binary tensor extension (binary outputs too)."""
    data = np.ascontiguousarray(array).tobytes()
    header = json.dumps({
        "inputs": [{"name": name, "datatype": datatype, "shape": list(array.shape),
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}


def demo_requests(model: str, host: str, count: int = 64, seed: int = 0) -> list[bytes]:
    """Prebuilt HTTP requests for a demo model: single images, or single sequences of 8-64 tokens."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        if model == "resnet-mini":
            array = rng.standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
            body, headers = v2_binary_body("image", "FP32", array, ["logits"])
        else:
            array = rng.integers(1, VOCAB_SIZE, size=(1, int(rng.integers(8, 65))), dtype=np.int64)
            body, headers = v2_binary_body("input_ids", "INT64", array, ["logits", "token_scores"])
        requests.append(build_request(host, f"/v2/models/{model}/infer", body, headers))
    return requests


def perf_analyzer_token_data(path: Path, count: int = 16, seed: int = 3) -> Path:
    """perf_analyzer `--input-data` for the NLP demo model: real token ids, 8 to 64 of them per request
    (perf_analyzer's own random INT64 data would hold ids outside the vocabulary)."""
    rng = np.random.default_rng(seed)
    entries = []
    for _ in range(count):
        length = int(rng.integers(8, 65))
        entries.append({"input_ids": {"content": rng.integers(1, VOCAB_SIZE, length).tolist(), "shape": [length]}})
    path.write_text(json.dumps({"data": entries}))
    return path


def free_port() -> int:
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
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
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
        if log_path:
            log.close()


@contextmanager
def serving(
    repository: Path, *extra: str, log_path: Path | None = None, env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (), log_level: str = "WARNING",
) -> Iterator[tuple[int, int]]:
    """Run `batchpilot serve` in a child process on free loopback ports; yields (http, grpc) ports.
    `prefix` goes before the command (e.g. taskset to pin the server to a core)."""
    http, grpc_port = free_port(), free_port()
    command = [*prefix, sys.executable, "-m", "batchpilot", "--log-level", log_level, "serve", "--model-repository",
               str(repository), "--http-port", str(http), "--grpc-port", str(grpc_port), "--host", "127.0.0.1", *extra]
    with child_process(command, f"http://127.0.0.1:{http}/v2/health/ready", env=env, log_path=log_path):
        yield http, grpc_port


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def release_reasons(port: int, model: str) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(r'batchpilot_batch_release_total\{model="%s",reason="(\w+)"\} ([0-9.e+]+)' % re.escape(model))
    return {reason: int(float(n)) for reason, n in pattern.findall(text)}


def mean_batch_size(port: int, model: str) -> float:
    stats = get_json(f"http://127.0.0.1:{port}/v2/models/{model}/stats")["model_stats"][0]
    return stats["inference_count"] / max(1, stats["execution_count"])


def measure(port: int, model: str, concurrency: int, duration_s: float) -> LoadResult:
    requests = demo_requests(model, f"127.0.0.1:{port}")
    asyncio.run(run_load("127.0.0.1", port, requests, concurrency=4, duration_s=1.0))  # warm-up
    return asyncio.run(run_load("127.0.0.1", port, requests, concurrency=concurrency, duration_s=duration_s))


def run_demo(duration_s: float = 8.0, concurrency: int = 32) -> int:
    models = ["resnet-mini", "textcls"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="batchpilot-demo-") as tmp:
        repository = Path(tmp) / "models"
        print(f"building demo models into {repository} ...", flush=True)
        write_demo_repository(repository)
        for mode, extra in (("batching", ()), ("no batching", ("--no-batching",))):
            print(f"starting batchpilot serve ({mode}) ...", flush=True)
            with serving(repository, *extra) as (port, _):
                for model in models:
                    result = measure(port, model, concurrency, duration_s)
                    state = get_json(f"http://127.0.0.1:{port}/v2/models/{model}/batching")
                    rows.append((model, mode, result, mean_batch_size(port, model), release_reasons(port, model), state))
                    print(f"  {model:12s} {mode:12s} {result.throughput:7.1f} req/s", flush=True)
    print()
    print(f"{concurrency} concurrent clients, {duration_s:.0f} s per run, v2 REST binary tensors, one item per request")
    header = f"{'model':12s} {'mode':12s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>6s} {'mean batch':>10s}  tuned (size, delay)  release reasons"
    print(header)
    print("-" * len(header))
    for model, mode, r, batch, reasons, state in rows:
        tuned = f"{state['max_batch_size']}, {state['max_queue_delay_microseconds']} us"
        print(f"{model:12s} {mode:12s} {r.throughput:8.1f} {r.percentile_ms(50):8.2f} {r.percentile_ms(99):8.2f} "
              f"{r.errors:6d} {batch:10.2f}  {tuned:20s} {reasons}")
    print()
    for model in models:
        on = next(r for m, mode, r, *_ in rows if m == model and mode == "batching")
        off = next(r for m, mode, r, *_ in rows if m == model and mode == "no batching")
        print(f"{model}: batching serves {on.throughput / max(off.throughput, 1e-9):.2f}x the requests per second")
    return 0 if all(r.errors == 0 for _, _, r, *_ in rows) else 1
