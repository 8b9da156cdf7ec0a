"""What the autotuner's plans cost the server they tune: a load step, autotuned vs static, side by side (not run in CI).

Each plan (0.1-0.2 s of simulation on this machine's cores since 961462e, 0.2-0.4 s before;
`batchpilot.runtime.plan_worker`) runs in a worker process at a lower priority on the server's own core(s): on one
core its CPU comes out of the serving threads'. This benchmark
shows how much. One model at a time, on a fresh server per arm, driven by this script's closed-loop clients
(2 -> 32 -> 2 clients, 10 / 20 / 10 s, as the autotuner benchmark's load steps):
  - static: the autotuner off at --static (default 32 items / 8 ms, where the tuner settles at 32 clients);
  - autotuned: the demo spec with the SLO, cold.
Per second it records the answers and the CPU seconds of the server's main process and of its plan worker; it
prints per arm the answers/s over each part of the 32-client step (its first 10 s and its last 10 s) and the
worker's CPU, repeated --repeats times (spread = the range), and writes plan-cost.json and plan-cost.png to --out.

The server is pinned to core 0 and this script to core 1, as in the other benchmarks; run it alone.

    python bench/plan_cost.py                          # both demo models, 2 repeats (about 7 min)
    python bench/plan_cost.py --models textcls --repeats 1 --out /tmp/pc
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autotune_bench import HOST, client_requests, solo_repository, spec_doc, specs_env
from common import CLIENT_CPU, SERVER_CPU, bench_lock, closed_loop_timeline, pinned, process_cpu_seconds, table

from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.testing.processes import child_process, free_port, ready_url, serve_command

SCHEDULE = ((10.0, 2), (20.0, 32), (10.0, 2))
SECONDS = int(sum(s for s, _ in SCHEDULE))
STEP = (10, 20, 30)  # the 32-client step's seconds: its first 10 s (10-20) and its last 10 s (20-30)
SLO_MS = 50.0


@contextmanager
def cpu_sampler(root: int) -> Iterator[list[tuple[float, dict[int, float]]]]:
    """Every second, the CPU seconds used so far by each process of the server's tree."""
    samples: list[tuple[float, dict[int, float]]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), process_cpu_seconds(root)))
            stop.wait(1.0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def per_second_cpu(samples: list[tuple[float, dict[int, float]]], pids: set[int], t0: float) -> list[float]:
    """CPU seconds per wall second of the processes `pids`, per second since `t0`."""
    out = [0.0] * SECONDS
    for (a, before), (b, after) in itertools.pairwise(samples):
        used = sum(after.get(p, 0.0) - before.get(p, 0.0) for p in pids)
        k = int((a + b) / 2 - t0)
        if 0 <= k < SECONDS:
            out[k] += used / max(b - a, 1e-9)
    return out


def run_arm(repo: Path, work: Path, model: str, doc: dict[str, Any], log: Path) -> dict[str, Any]:
    solo = solo_repository(repo, work, model)
    port, grpc_port = free_port(), free_port()
    command = pinned(SERVER_CPU, serve_command(solo, port, grpc_port, "--torch-threads", "1", log_level="INFO"))
    with child_process(command, ready_url(port), env=specs_env(doc), log_path=log) as proc:
        root = proc.pid  # (taskset execs the server: the same process)
        requests = client_requests(model, "binary", port)
        t0 = time.perf_counter()
        with cpu_sampler(root) as samples:
            timeline = asyncio.run(closed_loop_timeline(HOST, port, requests, list(SCHEDULE), t0=t0))
        workers = set(samples[-1][1]) - {root} if samples else set()
    answers = np.bincount(timeline.done_s.astype(int), minlength=SECONDS)
    plans = sum('"event": "plan-asked"' in line for line in log.read_text().splitlines())
    return {
        "answers_per_s": answers[:SECONDS].tolist(),
        "server_cpu_per_s": per_second_cpu(samples, {root}, t0),
        "worker_cpu_per_s": per_second_cpu(samples, workers, t0),
        "plans": plans,
    }


def summary_rows(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[list[object]]:
    rows: list[list[object]] = []
    a, b, c = STEP
    for model, arms in results.items():
        for arm, runs in arms.items():
            first = [float(np.mean(r["answers_per_s"][a:b])) for r in runs]
            last = [float(np.mean(r["answers_per_s"][b:c])) for r in runs]
            worker = [float(sum(r["worker_cpu_per_s"])) for r in runs]
            rows.append(
                [
                    model,
                    arm,
                    " / ".join(f"{x:.0f}" for x in first),
                    " / ".join(f"{x:.0f}" for x in last),
                    " / ".join(f"{x:.2f}" for x in worker),
                    " / ".join(str(r["plans"]) for r in runs),
                ]
            )
    return rows


def plot(results: dict[str, dict[str, list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 6), squeeze=False, sharex=True)
    for col, (model, arms) in enumerate(results.items()):
        for arm, runs in arms.items():
            for i, r in enumerate(runs):
                style = "-" if arm == "autotuned" else "--"
                axes[0][col].plot(r["answers_per_s"], style, label=f"{arm} {i + 1}")
                if arm == "autotuned":
                    axes[1][col].plot(r["worker_cpu_per_s"], label=f"plan worker {i + 1}")
        axes[0][col].set_title(f"{model}: 2 -> 32 -> 2 clients")
        axes[0][col].set_ylabel("answers / s")
        axes[1][col].set_ylabel("plan worker CPU s / s")
        axes[1][col].set_xlabel("s")
        for ax in axes[:, col]:
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet-mini,textcls")
    parser.add_argument("--static", default="32/8", help="the static arm's max batch size / delay ms")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("plan-cost-out"))
    args = parser.parse_args()
    size, delay = (int(x) for x in args.static.split("/"))
    args.out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    specs = {name: spec for name, (spec, _) in build_demo_modules().items()}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, bench_lock():
        work = Path(tmp)
        repo = work / "repo"
        repo.mkdir()
        write_demo_repository(repo)
        for model in args.models.split(","):
            arms: dict[str, list[dict[str, Any]]] = {"static": [], "autotuned": []}
            for i in range(args.repeats):  # interleaved, so a drifting host hits both arms alike
                for arm in arms:
                    if arm == "static":
                        doc = spec_doc(specs[model], static=(size, delay))
                    else:
                        doc = spec_doc(specs[model], slo_ms=SLO_MS)
                    print(f"== {model} {arm} run {i + 1}", flush=True)
                    arms[arm].append(run_arm(repo, work, model, doc, args.out / f"{model}-{arm}-{i + 1}.log"))
            results[model] = arms
    headers = [
        "model",
        "arm",
        "answers/s, step's first 10 s (per run)",
        "answers/s, step's last 10 s",
        "plan worker CPU s (40 s)",
        "plans",
    ]
    print(table(headers, summary_rows(results)))
    (args.out / "plan-cost.json").write_text(json.dumps({"schedule": SCHEDULE, "results": results}, indent=1))
    plot(results, args.out / "plan-cost.png")
    print(f"wrote {args.out / 'plan-cost.json'}, {args.out / 'plan-cost.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
