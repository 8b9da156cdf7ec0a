"""`batchpilot demo`: serve the demo models locally, load them with and without batching, show the gain."""

from __future__ import annotations

import asyncio
import re
import tempfile
import urllib.request
from pathlib import Path

from batchpilot.runtime.demo_models import write_demo_repository
from batchpilot.testing.loadgen import LoadResult, run_load
from batchpilot.testing.processes import get_json, serving
from batchpilot.testing.requests import demo_requests


def release_reasons(port: int, model: str) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = rf'batchpilot_batch_release_total\{{model="{re.escape(model)}",reason="(\w+)"\}}'
    pattern = re.compile(series + r" ([0-9.e+]+)")
    return {reason: int(float(n)) for reason, n in pattern.findall(text)}


def batch_counts(port: int, model: str) -> tuple[int, int]:
    """(items, executions) the model has run so far (Triton's statistics extension)."""
    stats = get_json(f"http://127.0.0.1:{port}/v2/models/{model}/stats")["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def mean_batch_size(port: int, model: str) -> float:
    items, executions = batch_counts(port, model)
    return items / max(1, executions)


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
                    rows.append(
                        (model, mode, result, mean_batch_size(port, model), release_reasons(port, model), state)
                    )
                    print(f"  {model:12s} {mode:12s} {result.throughput:7.1f} req/s", flush=True)
    print()
    print(f"{concurrency} concurrent clients, {duration_s:.0f} s per run, v2 REST binary tensors, one item per request")
    header = (
        f"{'model':12s} {'mode':12s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>6s} {'mean batch':>10s}"
        "  tuned (size, delay)  release reasons"
    )
    print(header)
    print("-" * len(header))
    for model, mode, r, batch, reasons, state in rows:
        tuned = f"{state['max_batch_size']}, {state['max_queue_delay_microseconds']} us"
        print(
            f"{model:12s} {mode:12s} {r.throughput:8.1f} {r.percentile_ms(50):8.2f} {r.percentile_ms(99):8.2f} "
            f"{r.errors:6d} {batch:10.2f}  {tuned:20s} {reasons}"
        )
    print()
    for model in models:
        on = next(r for m, mode, r, *_ in rows if m == model and mode == "batching")
        off = next(r for m, mode, r, *_ in rows if m == model and mode == "no batching")
        print(f"{model}: batching serves {on.throughput / max(off.throughput, 1e-9):.2f}x the requests per second")
    return 0 if all(r.errors == 0 for _, _, r, *_ in rows) else 1
