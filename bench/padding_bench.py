"""NLP padding budget on mixed-length traffic: fixed budgets vs the autotuner, measured in the same run.

textcls (the NLP demo model) behind one server core (taskset), this script's asyncio closed-loop clients
on the other core, v2 binary requests whose sequence lengths are drawn log-uniformly from 8 to 256 tokens
(most short, a long tail). Each configuration gets a fresh server: the demo's size and delay fixed with the
length grouping's budget (max_padding_waste) at each value given, and the autotuner (size, delay and budget,
starting from the demo's budget). Every configuration is run `--repeats` times, in turn, so that the spread
is known. Reported per run: req/s, p99 (client side), the padding efficiency (useful / computed token slots
from /metrics over the measured span) and the settings in force at the end.

Usage: .venv/bin/python bench/padding_bench.py [--clients 32] [--seconds 20] [--warmup 10] [--repeats 2]
Prints a Markdown table and writes docs/bench/padding.md and padding.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLIENT_CPU, ROOT, batchpilot_server, closed_loop_timeline, machine, table

from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.loadgen import build_request
from batchpilot.testing.processes import get_json
from batchpilot.testing.requests import v2_binary_body

MODEL = "textcls"
HOST = "127.0.0.1"
VOCAB = 1000


def lengths(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [round(8 * 32 ** float(u)) for u in rng.random(n)]


def requests(port: int, n: int = 256) -> list[bytes]:
    rng = np.random.default_rng(1)
    out = []
    for length in lengths(n):
        tokens = rng.integers(1, VOCAB, size=(1, length), dtype=np.int64)
        body, headers = v2_binary_body("input_ids", "INT64", tokens, ["logits", "token_scores"])
        out.append(build_request(f"{HOST}:{port}", f"/v2/models/{MODEL}/infer", body, headers))
    return out


def spec_env(waste: float | None, slo_ms: float) -> dict[str, str]:
    spec = build_demo_modules()[MODEL][0]
    doc = spec.model_dump(mode="json", by_alias=True)
    if waste is None:
        doc["autotune"].update(enabled=True, latencySloP99Ms=slo_ms)
    else:
        doc["autotune"]["enabled"] = False
        doc["sequence"]["maxPaddingWaste"] = waste
    return {SPECS_ENV: json.dumps([doc])}


def token_counters(port: int) -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10).read().decode()

    def value(name: str) -> float:
        m = re.search(rf'^{name}{{model="{MODEL}"}} ([0-9.e+]+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("batchpilot_tokens_useful_total"), value("batchpilot_tokens_computed_total")


def run_one(repo: Path, waste: float | None, args: argparse.Namespace) -> dict[str, Any]:
    with batchpilot_server(repo, env=spec_env(waste, args.slo_ms)) as (port, _):
        reqs = requests(port)
        asyncio.run(closed_loop_timeline(HOST, port, reqs, [(args.warmup, args.clients)]))
        useful0, computed0 = token_counters(port)
        t = asyncio.run(closed_loop_timeline(HOST, port, reqs, [(args.seconds, args.clients)], seed=2))
        useful1, computed1 = token_counters(port)
        state = get_json(f"http://{HOST}:{port}/v2/models/{MODEL}/batching")
    ok = t.between(0.0, t.end_s)
    return {
        "config": "autotuned" if waste is None else f"fixed budget {waste:.2f}",
        "req_s": len(ok) / t.end_s,
        "p99_ms": float(np.percentile(ok, 99) * 1e3) if len(ok) else None,
        "errors": t.errors,
        "padding_efficiency": (useful1 - useful0) / max(computed1 - computed0, 1.0),
        "final": {k: state.get(k) for k in ("max_batch_size", "max_queue_delay_microseconds", "max_padding_waste")},
        "plan": state.get("autotune", {}).get("plan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wastes", default="0,0.25,0.5,0.7")
    parser.add_argument("--slo-ms", type=float, default=200.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    configs: list[float | None] = [float(w) for w in args.wastes.split(",")] + [None]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_demo_repository(repo)
        for r in range(args.repeats):
            for waste in configs:
                row = run_one(repo, waste, args) | {"repeat": r + 1}
                print(json.dumps(row), flush=True)
                runs.append(row)
    rows = [
        [
            x["config"],
            x["repeat"],
            f"{x['req_s']:.0f}",
            f"{x['p99_ms']:.1f}" if x["p99_ms"] is not None else "-",
            x["errors"],
            f"{x['padding_efficiency']:.2f}",
            f"{x['final']['max_batch_size']} / {x['final']['max_queue_delay_microseconds'] / 1000:g} ms"
            + (
                f", budget {x['final']['max_padding_waste']}" if x["final"].get("max_padding_waste") is not None else ""
            ),
        ]
        for x in sorted(runs, key=lambda x: (x["config"], x["repeat"]))
    ]
    headers = ["configuration", "run", "req/s", "p99 ms", "errors", "padding efficiency", "final setting"]
    page = "\n".join(
        [
            "# NLP padding budget on mixed-length traffic",
            "",
            f"Machine: {machine()}. textcls on one server core, {args.clients} closed-loop clients on the other,"
            f" v2 binary requests of 8-256 tokens (log-uniform), {args.warmup:g} s warm-up then {args.seconds:g} s"
            f" measured, {args.repeats} runs of every configuration in turn; autotuner SLO {args.slo_ms:g} ms p99.",
            "Command: `.venv/bin/python bench/padding_bench.py " + " ".join(sys.argv[1:]) + "`",
            "",
            table(headers, rows),
            "",
        ]
    )
    print(page)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "padding.md").write_text(page)
    (args.out / "padding.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
