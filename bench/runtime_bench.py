"""Runtime benchmark: what batching buys on each demo model, and BatchPilot's serving stack vs stock KServe.

One core serves (taskset), the load generator runs on the other. Sections:
  1. the model alone (raw items/s per batch size, one thread);
  2. perf_analyzer concurrency sweep 1..64 over HTTP, batching on (static 16 / 2 ms) and off;
  3. a trivial model, BatchPilot vs a stock KServe ModelServer, same wrk client, v2 JSON;
  4. a 1x3x224x224 FP32 model over REST v2 binary tensors, BatchPilot vs stock KServe, same wrk client.
Prints Markdown tables, writes docs/bench/runtime.md and docs/bench/runtime.png.

Usage: .venv/bin/python bench/runtime_bench.py [--quick]   (needs perf_analyzer: make setup; wrk: apt-get install wrk)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    CLIENT_CPU,
    ROOT,
    SERVER_CPU,
    batchpilot_server,
    raw_throughput,
    static_specs,
    stock_kserve_server,
    table,
    v2_json_body,
    wrk,
)
from models import write_bench_models

from batchpilot.runtime.demo import batch_counts
from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.perfa import PerfAnalyzerError, run_perf_analyzer
from batchpilot.testing.requests import perf_analyzer_token_data, v2_binary_body

CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
# The NLP model, raw and served, runs on sequences of this many tokens: the served/raw ratio compares the
# same work (mixed lengths add the length grouping's padding, which bench/padding_bench.py measures).
NLP_MEAN_LENGTH = 36
KEEP_MARKER = "<!-- kept by runtime_bench.py: everything below -->"
SERVED_RAW_TARGET = 0.9  # issue 13
GAIN_TARGET = 0.9


def raw_section() -> dict[str, dict[int, float]]:
    os.sched_setaffinity(0, {int(SERVER_CPU)})
    torch.set_num_threads(1)
    rates = {}
    for name, (spec, module) in build_demo_modules().items():
        scripted = torch.jit.script(module)
        if spec.type == "nlp":

            def make(b: int):
                ids = torch.randint(1, 8000, (b, NLP_MEAN_LENGTH))
                return ids, torch.ones_like(ids)
        else:

            def make(b: int):
                return (torch.randn(b, 3, 64, 64),)

        rates[name] = raw_throughput(scripted, make, BATCHES)
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    return rates


def sweep_section(repo: Path, work: Path, quick: bool, protocol: str = "http") -> dict[tuple[str, str], list[dict]]:
    """perf_analyzer, one concurrency level per run so each level's mean batch size can be read."""
    levels = [1, 8, 32] if quick else CONCURRENCY
    window = ["-p", "1500" if quick else "2500", "-s", "15", "--max-trials", "8"]
    data = {
        "textcls": [
            "--input-data",
            str(perf_analyzer_token_data(work / "tokens.json", count=64, lengths=(NLP_MEAN_LENGTH,) * 2)),
        ],
        "resnet-mini": [],
    }
    results: dict[tuple[str, str], list[dict]] = {}
    for mode, extra in (("batching", ()), ("no batching", ("--no-batching",))):
        with batchpilot_server(repo, *extra, env={SPECS_ENV: static_specs()}) as (port, grpc_port):
            for model in ("resnet-mini", "textcls"):
                rows = []
                for c in levels:
                    before = batch_counts(port, model)
                    url = f"127.0.0.1:{port if protocol == 'http' else grpc_port}"
                    try:
                        row = run_perf_analyzer(model, url, protocol, [c, c, 1], [*data[model], *window])[0]
                    except PerfAnalyzerError as exc:  # a busy machine: once more, with a looser stability bound
                        print(f"  {model} c={c}: {str(exc).splitlines()[0][:80]}; retrying with -s 40", flush=True)
                        looser = ["-p", window[1], "-s", "40", "--max-trials", "10"]
                        row = run_perf_analyzer(model, url, protocol, [c, c, 1], [*data[model], *looser])[0]
                    after = batch_counts(port, model)
                    row["mean_batch"] = (after[0] - before[0]) / max(1, after[1] - before[1])
                    rows.append(row)
                    print(
                        f"  {model:12s} {mode:12s} c={c:3d} {row['infer_per_s']:8.1f} infer/s "
                        f"p99 {row['p99_us'] / 1e3:7.2f} ms  mean batch {row['mean_batch']:.1f}",
                        flush=True,
                    )
                results[(model, mode)] = rows
    return results


def interpolate(rates: dict[int, float], batch: float) -> float:
    sizes = sorted(rates)
    return float(np.interp(batch, sizes, [rates[s] for s in sizes]))


def stack_section(repo: Path, work: Path, quick: bool) -> list[list[object]]:
    duration = 5 if quick else 10
    cases = [
        (
            "trivial, v2 JSON",
            "trivial",
            "y",
            repo / "trivial" / "model.pt",
            v2_json_body("x", "FP32", [1, 4], [0.5, 1.5, 2.5, 3.5]),
            {"Content-Type": "application/json"},
        ),
        (
            "1x3x224x224, v2 binary",
            "image224",
            "features",
            repo / "image224" / "model.pt",
            *v2_binary_body(
                "image",
                "FP32",
                np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32),
                ["features"],
            ),
        ),
    ]
    rows = []
    for label, model, output, path, body, headers in cases:
        measured = {}
        with batchpilot_server(repo) as (port, _):
            for c in (8, 32):
                measured[("BatchPilot", c)] = wrk(
                    f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                    body,
                    headers,
                    connections=c,
                    duration_s=duration,
                    workdir=work,
                )
        with stock_kserve_server(path, model, output) as port:
            for c in (8, 32):
                measured[("stock KServe", c)] = wrk(
                    f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                    body,
                    headers,
                    connections=c,
                    duration_s=duration,
                    workdir=work,
                )
        for c in (8, 32):
            ours, stock = measured[("BatchPilot", c)], measured[("stock KServe", c)]
            rows.append(
                [
                    label,
                    c,
                    ours.requests_per_s,
                    ours.p99_ms,
                    ours.errors,
                    stock.requests_per_s,
                    stock.p99_ms,
                    stock.errors,
                    f"{ours.requests_per_s / max(stock.requests_per_s, 1e-9):.1f}x",
                ]
            )
            print(
                f"  {label}: c={c} BatchPilot {ours.requests_per_s:.0f} req/s vs stock {stock.requests_per_s:.0f}",
                flush=True,
            )
    return rows


def plot(raw: dict[str, dict[int, float]], sweep: dict[tuple[str, str], list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, model in zip(axes, ("resnet-mini", "textcls"), strict=False):
        for mode, style in (("batching", "o-"), ("no batching", "s--")):
            rows = sweep[(model, mode)]
            ax.plot([r["concurrency"] for r in rows], [r["infer_per_s"] for r in rows], style, label=f"served, {mode}")
        ax.axhline(max(raw[model].values()), color="grey", linestyle=":", label="model alone, best batch")
        ax.axhline(raw[model][1], color="black", linestyle=":", label="model alone, batch 1")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (perf_analyzer, HTTP)")
        ax.set_ylabel("inferences / s")
        ax.set_title(model)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer levels, shorter windows")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http", help="perf_analyzer's, for the sweep")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bp-bench-") as tmp:
        work = Path(tmp)
        repo = work / "models"
        write_demo_repository(repo)
        write_bench_models(repo)
        print("1. the model alone ...", flush=True)
        raw = raw_section()
        print("2. perf_analyzer sweeps ...", flush=True)
        sweep = sweep_section(repo, work, args.quick, args.protocol)
        print("3-4. serving stack vs stock KServe (wrk) ...", flush=True)
        stack = stack_section(repo, work, args.quick)

    raw_table = table(
        ["model", *[f"batch {b}" for b in BATCHES]], [[m, *[r[b] for b in BATCHES]] for m, r in raw.items()]
    )
    sweep_rows, verdicts = [], []
    for model in ("resnet-mini", "textcls"):
        on, off = sweep[(model, "batching")], sweep[(model, "no batching")]
        for a, b in zip(on, off, strict=False):
            served_raw = a["infer_per_s"] / interpolate(raw[model], a["mean_batch"])
            sweep_rows.append(
                [
                    model,
                    a["concurrency"],
                    a["infer_per_s"],
                    a["p99_us"] / 1e3,
                    a["mean_batch"],
                    f"{served_raw:.2f}",
                    b["infer_per_s"],
                    b["p99_us"] / 1e3,
                    f"{a['infer_per_s'] / b['infer_per_s']:.2f}x",
                ]
            )
        high = [r for r in on if r["concurrency"] >= 32]
        ratio = min(r["infer_per_s"] / interpolate(raw[model], r["mean_batch"]) for r in high)
        best_on = max(high, key=lambda r: r["infer_per_s"])
        served_gain = best_on["infer_per_s"] / max(r["infer_per_s"] for r in off)
        raw_gain = interpolate(raw[model], best_on["mean_batch"]) / raw[model][1]
        verdicts.append(
            f"- {model}: served/raw at concurrency >= 32 (2x max batch 16): {ratio:.2f} (target >= {SERVED_RAW_TARGET}: "
            f"{'met' if ratio >= SERVED_RAW_TARGET else 'NOT met'}); batching gain served {served_gain:.2f}x vs raw "
            f"gain {raw_gain:.2f}x at batch {best_on['mean_batch']:.1f} = {served_gain / raw_gain:.2f} "
            f"(target >= {GAIN_TARGET}: {'met' if served_gain / raw_gain >= GAIN_TARGET else 'NOT met'})"
        )
    sweep_table = table(
        [
            "model",
            "clients",
            "batching infer/s",
            "p99 ms",
            "mean batch",
            "served/raw",
            "no batching infer/s",
            "p99 ms",
            "gain",
        ],
        sweep_rows,
    )
    stack_table = table(
        [
            "workload",
            "clients",
            "BatchPilot req/s",
            "p99 ms",
            "errors",
            "stock KServe req/s",
            "p99 ms",
            "errors",
            "ratio",
        ],
        stack,
    )
    for row in stack:
        target = 2.5 if row[0].startswith("trivial") else 20.0
        ratio = row[2] / max(row[5], 1e-9)
        verdicts.append(
            f"- {row[0]} at {row[1]} clients: {ratio:.1f}x stock KServe (target >= {target}x: "
            f"{'met' if ratio >= target else 'NOT met'})"
        )
    plot(raw, sweep, args.out / "runtime.png")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, python {platform.python_version()}"
    page = "\n\n".join(
        [
            "# Runtime benchmark",
            f"Machine: {machine}. Server pinned to core {SERVER_CPU} (torch 1 thread), "
            f"load generator on core {CLIENT_CPU}. Command: `.venv/bin/python bench/runtime_bench.py{' --quick' if args.quick else ''}`.",
            f"textcls runs on sequences of {NLP_MEAN_LENGTH} tokens both alone and served (perf_analyzer's data), so "
            "served/raw compares the same work; mixed lengths add the length grouping's padding (docs/bench/padding.md).",
            "## The model alone (items/s, one thread)",
            raw_table,
            f"## perf_analyzer over {'HTTP' if args.protocol == 'http' else 'gRPC'}, batching (static 16 / 2 ms) vs none",
            sweep_table,
            "## Serving stack vs stock KServe 0.21 (same wrk client)",
            stack_table,
            "## Targets",
            "\n".join(verdicts),
            "![throughput vs concurrency](runtime.png)",
        ]
    )
    # A hand-written part after the marker (issue 13's before/after table and profiles) survives a rerun.
    target = args.out / "runtime.md"
    old = target.read_text() if target.exists() else ""
    kept = old[old.index(KEEP_MARKER) :] if KEEP_MARKER in old else ""
    target.write_text(page + "\n" + ("\n" + kept if kept else ""))
    print("\n" + page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
