"""Autotuner benchmark on a live server: the autotuner against the best static setting (the oracle), both
measured in the same run.

Placement as bench/peers_bench.py: the server pinned to core 0 (taskset) with one torch thread, the load
generator on core 1 (wrk for the closed-loop levels, this script's asyncio clients elsewhere). Every server
phase holds the machine-wide lock /tmp/batchpilot-bench.lock. Both demo models: resnet-mini (CV), textcls (NLP).

Phases (--phases, comma-separated):
  levels  closed loop at 1..64 connections (wrk), v2 JSON and v2 binary bodies. Per level a static sweep
          (max batch sizes up to the level plus the next power of two, x delays; size 1 only with delay 0),
          every setting a model of its own in one server; the top 3 re-measured after the sweep (the noise);
          the oracle = the best mean throughput of those whose p99 met the SLO. Then the autotuned model,
          cold and alone in a fresh server, --tuned-runs times per level: the first --settle-s discarded, the
          rest measured; before the first and after each, the oracle's setting in a fresh one-model server too
          (static, the same window after a warm-up), as the autotuned model is served and measured, so that
          each autotuned run is compared with the two static runs beside it (the host drifts by tens of
          percent within minutes).
  open    open loop (Poisson arrivals) at 50/80/95% of the open-loop capacity: the static best setting vs
          the autotuned model (fresh server per rate), --open-runs times, alternating (a short row's p99 is
          set by a few bursts: one run of each proves little). The static best setting is the oracle of the highest
          level (closed loop; without levels results, the demo setting measured with wrk at 64 connections).
          The open-loop capacity = the highest Poisson rate at which that static setting holds p99 within the
          SLO with no refusals and no errors, found with this script's asyncio open-loop client: a search
          from the closed-loop throughput, down (or up) then bisecting, --cap-warmup-s + --cap-window-s per
          probe, at most --cap-probes probes and --cap-budget-s seconds per model, every probe printed, the
          rate found then held for --cap-confirm-s (lower after a failed window, at most --cap-confirm-tries:
          a short probe passes rates a host holds only for seconds); or given with --capacity MODEL=RPS (no
          search). The closed-loop figure is kept beside it.
  steps   autotuned, parameters polled every 0.5 s: closed loop 2 -> 32 -> 2 clients, open loop r -> 3r -> r
          (r a fraction of the open-loop capacity: the open phase's of this run, --capacity, or searched).
          A closed step's target: the levels oracle's setting at its clients, run statically through the same
          steps by the same client.
  two     both models in one server, each driven by its own closed-loop clients at once: autotuned pair
          vs the best static pair, found by a sweep of pairs (--two-settings for each model, plus its demo
          setting and its levels oracle at that many clients) in one server, --two-sweep-s per pair.
  single  one client alone: autotune vs --no-batching.
The soak (10 minutes open loop at 85% of the open-loop capacity) is bench/soak.py.
Every open-loop run reports the client's lateness (send time minus scheduled arrival) p99; above 5 ms the
client, not the server, set the pace, and the tables say "client behind".

Raw results go to OUT/autotune.json keyed by phase (a rerun of some phases keeps the others'); the page is
OUT/autotune.md with OUT/autotune-levels.png and OUT/autotune-steps.png. OUT defaults to docs/bench.

Usage:
  .venv/bin/python bench/autotune_bench.py                            # every phase, both models (see --plan)
  .venv/bin/python bench/autotune_bench.py --quick --out /tmp/at      # smoke test: a few minutes
  .venv/bin/python bench/autotune_bench.py --phases steps,two --slo textcls=75
  .venv/bin/python bench/autotune_bench.py --phases open --quick --out /tmp/at   # open phase only, small
  .venv/bin/python bench/autotune_bench.py --phases open --capacity resnet-mini=600,textcls=900  # no search
  .venv/bin/python bench/autotune_bench.py --phases ''                # re-render the page from the JSON
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BENCH_LOCK,
    CLIENT_CPU,
    LAG_LIMIT_MS,
    ROOT,
    SERVER_CPU,
    Timeline,
    Workload,
    batchpilot_server,
    batchpilot_server_logged,
    bench_lock,
    closed_loop_timeline,
    confirm_capacity,
    lag_text,
    machine,
    open_loop_capacity,
    open_loop_timeline,
    table,
    workloads,
    wrk,
)

from batchpilot.runtime.demo import batch_counts
from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.spec.model import ModelSpec
from batchpilot.testing.loadgen import build_request
from batchpilot.testing.processes import get_json

MODELS = ("resnet-mini", "textcls")
ENCODINGS = ("json", "binary")
SIZES = (1, 2, 4, 8, 16, 32, 64)  # the demo models' autotune bounds: batch 1..64
PHASES = ("levels", "open", "steps", "two", "single")
HOST = "127.0.0.1"
POLL_S = 0.5
FORMAT = 2  # the layout of autotune.json; older files (keyed by model) are not merged


@dataclass
class Config:
    """Everything a run's figures depend on (stored with each phase's results)."""

    models: list[str]
    encodings: list[str]  # the levels phase's request bodies (wrk)
    levels: list[int]  # closed-loop connections
    delays_ms: list[int]
    static_s: int  # measured seconds per static setting (wrk takes whole seconds)
    grid_warmup_s: int  # one wrk run per grid model before the sweep (TorchScript specialises on first calls)
    top: int  # static settings re-measured per level (the oracle's noise)
    tuned_runs: int  # autotuned runs per level, each in a fresh server between two of the oracle's setting
    tuned_s: int  # an autotuned run in all...
    settle_s: int  # ...of which the first seconds are discarded as the tuner's settling
    open_loads: list[float]  # fractions of the capacity
    open_s: float  # measured seconds per open-loop rate
    open_runs: int  # runs of every open-loop row, static and autotuned alternating (the rows' noise)
    step_clients: list[int]  # the closed-loop steps
    step_rate: float  # open-loop steps: r as a fraction of the capacity (r -> 3r -> r)
    step_s: float
    skip_s: float  # a step's first seconds left out of the SLO attainment
    two_clients: int  # per model, in the two-model phase
    two_s: float
    two_settings: str  # static settings paired in the two-model sweep ("n/ms,..."; the demo's and the oracle's added)
    two_sweep_s: float  # measured seconds per pair swept
    single_s: float
    client_encoding: str  # the asyncio clients' body (open, steps, two, single)
    cap_warmup_s: float  # open-loop capacity search: each probe's warm-up at its rate (discarded)...
    cap_window_s: float  # ...and its measured window
    cap_probes: int  # at most this many probes...
    cap_budget_s: float  # ...and no probe started that would end after this many seconds (per model)
    cap_confirm_s: float  # the rate found then held for this long (0: not confirmed)...
    cap_confirm_tries: int  # ...at most this many windows, each lower after a failed one

    @property
    def static_warm_s(self) -> int:
        """Warm-up of a static server before its measurement (discarded)."""
        return min(2, self.settle_s)

    def dump(self) -> dict[str, Any]:
        return asdict(self) | {"static_warm_s": self.static_warm_s}


FULL = Config(
    models=list(MODELS),
    encodings=list(ENCODINGS),
    levels=[1, 2, 4, 8, 16, 32, 64],
    delays_ms=[0, 1, 2, 5, 10],
    static_s=4,
    grid_warmup_s=1,
    top=3,
    tuned_runs=2,
    tuned_s=20,
    settle_s=8,
    open_loads=[0.5, 0.8, 0.95],
    open_s=20.0,
    open_runs=3,
    step_clients=[2, 32, 2],
    step_rate=0.3,
    step_s=30.0,
    skip_s=10.0,
    two_clients=16,
    two_s=30.0,
    two_settings="8/5,16/5,32/2",
    two_sweep_s=6.0,
    single_s=10.0,
    client_encoding="binary",
    cap_warmup_s=2.0,
    cap_window_s=6.0,
    cap_probes=8,
    cap_budget_s=90.0,
    cap_confirm_s=20.0,
    cap_confirm_tries=3,
)
QUICK = replace(
    FULL,
    models=["textcls"],
    encodings=["binary"],
    levels=[1, 8, 32],
    delays_ms=[0, 5],
    static_s=1,
    grid_warmup_s=0,
    tuned_runs=1,
    tuned_s=6,
    settle_s=2,
    open_loads=[0.8],
    open_s=3.0,
    open_runs=1,
    step_s=3.0,
    skip_s=1.0,
    two_s=3.0,
    two_settings="",
    two_sweep_s=2.0,
    single_s=2.0,
    cap_warmup_s=1.0,
    cap_window_s=2.0,
    cap_probes=3,
    cap_budget_s=12.0,
    cap_confirm_s=2.0,
    cap_confirm_tries=1,
)


# -- settings, specs, servers -----------------------------------------------------------------------------
def level_sizes(c: int) -> list[int]:
    """Max batch sizes worth sweeping at `c` connections: above c they act like c up to timing, so the
    powers of two <= c plus the next one (c=1 sweeps 1 and 2)."""
    return [n for n in SIZES if n <= c] + [n for n in SIZES if n > c][:1]


def level_settings(c: int, delays_ms: list[int]) -> list[tuple[int, int]]:
    """(max batch size, delay ms) swept at `c` connections; size 1 only with delay 0 (nothing to wait for)."""
    return [(n, d) for n in level_sizes(c) for d in ([0] if n == 1 else delays_ms)]


def grid_name(model: str, n: int, d: int) -> str:
    return f"{model}-b{n}-d{d}"


def grid_repository(src: Path, dst: Path, spec: ModelSpec, settings: list[tuple[int, int]]) -> None:
    """One model per static setting (autotune off), all sharing the demo model's weights."""
    for n, d in settings:
        folder = dst / grid_name(spec.name, n, d)
        folder.mkdir(parents=True)
        (folder / "model.pt").symlink_to(src / spec.name / "model.pt")
        doc = spec.model_dump(mode="json")
        doc.update(
            name=folder.name,
            batching={**doc["batching"], "max_batch_size": n, "max_queue_delay_microseconds": d * 1000},
        )
        doc["autotune"]["enabled"] = False
        (folder / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def solo_repository(repo: Path, work: Path, model: str) -> Path:
    """A repository holding only `model`, so its server loads nothing else."""
    solo = work / f"solo-{model}"
    if not solo.exists():
        solo.mkdir()
        (solo / model).symlink_to(repo / model)
    return solo


def spec_doc(spec: ModelSpec, *, slo_ms: float | None = None, static: tuple[int, int] | None = None) -> dict[str, Any]:
    """The model's spec for BATCHPILOT_MODEL_SPECS: autotuned with this SLO, or fixed at (size, delay ms)."""
    doc = spec.model_dump(mode="json", by_alias=True)
    if static is None:
        doc["autotune"].update(enabled=True, latencySloP99Ms=slo_ms)
    else:
        doc["autotune"]["enabled"] = False
        doc["batching"].update(maxBatchSize=static[0], maxQueueDelayMicroseconds=static[1] * 1000)
    return doc


def specs_env(*docs: dict[str, Any]) -> dict[str, str]:
    return {SPECS_ENV: json.dumps(list(docs))}


def workload(model: str, encoding: str) -> Workload:
    return next(w for w in workloads()[encoding] if w.model == model)


def client_requests(model: str, encoding: str, port: int) -> list[bytes]:
    """The asyncio clients' request: the same body wrk sends in the levels phase."""
    return named_requests(model, model, encoding, port)


def named_requests(model: str, served_as: str, encoding: str, port: int) -> list[bytes]:
    """`client_requests` sent to the served model `served_as` (a grid model of `model`)."""
    w = workload(model, encoding)
    return [build_request(f"{HOST}:{port}", f"/v2/models/{served_as}/infer", w.body, w.headers)]


def autotune_events(log: Path, model: str) -> list[dict[str, Any]]:
    """The server log's autotune decisions (INFO lines whose JSON says "event": "autotune")."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if '"event": "autotune"' in line:
            event = json.loads(line[line.index("{") :])
            if event.get("model") == model:
                events.append(event)
    return events


# -- parameter polling ------------------------------------------------------------------------------------
@dataclass
class Poll:
    t_s: float
    max_batch_size: int
    delay_ms: float
    changes: int
    plan: dict[str, Any] | None = (
        None  # autotune.plan (the planner's prediction) when the server has one and it changed
    )


class Poller:
    """Reads GET /v2/models/{m}/batching every 0.5 s in a thread while a load runs (times from `t0`)."""

    def __init__(self, port: int, model: str, t0: float) -> None:
        self.url = f"http://{HOST}:{port}/v2/models/{model}/batching"
        self.t0 = t0
        self.polls: list[Poll] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last_plan: Any = None

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                s = get_json(self.url)
            except OSError:
                s = None
            if s is not None:
                plan = s.get("autotune", {}).get("plan")
                self.polls.append(
                    Poll(
                        time.perf_counter() - self.t0,
                        s["max_batch_size"],
                        s["max_queue_delay_microseconds"] / 1e3,
                        s.get("autotune", {}).get("changes") or 0,
                        plan if plan != self._last_plan else None,
                    )
                )
                self._last_plan = plan
            if self._stop.wait(POLL_S):
                return

    def dump(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in asdict(p).items() if v is not None} for p in self.polls]


def param_changes(polls: list[dict[str, Any]], t0: float, t1: float) -> int:
    seen = [(p["max_batch_size"], p["delay_ms"]) for p in polls if t0 <= p["t_s"] < t1]
    return sum(a != b for a, b in itertools.pairwise(seen))


def setting(state: dict[str, Any]) -> str:
    return f"{state['max_batch_size']} / {state['max_queue_delay_microseconds'] / 1e3:g} ms"


# -- measurements -----------------------------------------------------------------------------------------
def wrk_run(url: str, work: Workload, connections: int, seconds: int, tmp: Path) -> dict[str, Any]:
    """One wrk measurement as a row; a failed wrk (or no answers at all) is a row with `failed`."""
    try:
        r = wrk(url, work.body, work.headers, connections=connections, duration_s=seconds, workdir=tmp)
    except (subprocess.SubprocessError, AttributeError, OSError) as exc:
        return {"rps": 0.0, "p50_ms": math.nan, "p99_ms": math.nan, "errors": 1, "failed": f"{type(exc).__name__}"}
    return {"rps": r.requests_per_s, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "errors": r.errors}


def measured(t: Timeline, t0: float, t1: float, slo_ms: float) -> dict[str, Any]:
    """A timeline's figures over [t0, t1): successful answers per second, latency, errors by status."""
    lat = t.between(t0, t1) * 1e3
    statuses = t.statuses(t0, t1)
    windows = t.windows(1.0, t0, t1)
    return {
        "seconds": t1 - t0,
        "rps": lat.size / (t1 - t0),
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else math.nan,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
        "errors_by_status": {str(k): v for k, v in statuses.items() if k != 200},  # "0" = no answer
        "windows_in_slo": sum(w.p99_ms <= slo_ms for w in windows),
        "windows": len(windows),
    }


@contextmanager
def server(repo: Path, *extra: str, env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[int]:
    """A fresh `batchpilot serve` on the server core (with `log`: its INFO log, the autotune decisions, kept
    there); yields its HTTP port and prints how long it took to start and to stop."""
    started = time.perf_counter()
    with (
        batchpilot_server_logged(repo, *extra, env=env, log=log) if log else batchpilot_server(repo, *extra, env=env)
    ) as (port, _):
        up = time.perf_counter()
        print(f"    (server up in {up - started:.1f} s)", flush=True)
        yield port
        stopping = time.perf_counter()
    print(f"    (server stopped in {time.perf_counter() - stopping:.1f} s)", flush=True)


def levels_phase(
    repo: Path, work: Path, logs: Path, spec: ModelSpec, slo: float, cfg: Config, tmp: Path
) -> dict[str, Any]:
    model = spec.name
    per_level = {c: level_settings(c, cfg.delays_ms) for c in cfg.levels}
    grid_dir = work / f"grid-{model}"
    grid_repository(repo, grid_dir, spec, sorted({s for ss in per_level.values() for s in ss}))
    out: dict[str, Any] = {
        "slo_ms": slo,
        "config": cfg.dump(),
        "encodings": {
            enc: {"body": workload(model, enc).body_label, "levels": {str(c): {} for c in cfg.levels}}
            for enc in cfg.encodings
        },
    }
    with server(grid_dir) as port:

        def url(n: int, d: int) -> str:
            return f"http://{HOST}:{port}/v2/models/{grid_name(model, n, d)}/infer"

        if cfg.grid_warmup_s:
            print(f"  {model}: warming up {len(list(grid_dir.iterdir()))} grid models ...", flush=True)
            for folder in sorted(grid_dir.iterdir()):
                n, d = (int(x[1:]) for x in folder.name.rsplit("-", 2)[1:])
                wrk_run(url(n, d), workload(model, cfg.encodings[0]), min(64, 2 * n), cfg.grid_warmup_s, tmp)
        for enc in cfg.encodings:
            body = workload(model, enc)
            for c in cfg.levels:
                rows = []
                for n, d in per_level[c]:
                    row = {"max_batch_size": n, "delay_ms": d, **wrk_run(url(n, d), body, c, cfg.static_s, tmp)}
                    rows.append(row)
                    print(
                        f"  {model} {enc} c={c:2d} static {n:2d} / {d:2d} ms: {row['rps']:7.1f} req/s  "
                        f"p99 {row['p99_ms']:7.1f} ms{'  errors ' + str(row['errors']) if row['errors'] else ''}",
                        flush=True,
                    )
                out["encodings"][enc]["levels"][str(c)]["static"] = rows
        # Second runs of each level's best settings, after the whole sweep: how far a measurement moves.
        for enc in cfg.encodings:
            body = workload(model, enc)
            for c in cfg.levels:
                lv = out["encodings"][enc]["levels"][str(c)]
                lv["repeat"] = []
                for first in top_static(lv["static"], slo, cfg.top):
                    n, d = first["max_batch_size"], first["delay_ms"]
                    row = {"max_batch_size": n, "delay_ms": d, **wrk_run(url(n, d), body, c, cfg.static_s, tmp)}
                    lv["repeat"].append(row)
                    print(
                        f"  {model} {enc} c={c:2d} again  {n:2d} / {d:2d} ms: {row['rps']:7.1f} req/s  "
                        f"p99 {row['p99_ms']:7.1f} ms (first run {first['rps']:.1f} / {first['p99_ms']:.1f})",
                        flush=True,
                    )
    solo = solo_repository(repo, work, model)
    for enc in cfg.encodings:
        body = workload(model, enc)
        for c in cfg.levels:
            level = out["encodings"][enc]["levels"][str(c)]
            best = oracle(level, slo)
            # The oracle's setting in fresh servers brackets every autotuned run against the host's drift:
            # before, autotuned, after, autotuned, after ...
            fresh = [solo_static(solo, spec, body, c, best, cfg, tmp, f"{enc} c={c:2d}, before")] if best else []
            runs = []
            for i in range(cfg.tuned_runs):
                runs.append(
                    autotuned_run(solo, spec, slo, body, c, cfg, tmp, logs / f"levels-{model}-{enc}-c{c}-{i + 1}.log")
                )
                if best:
                    fresh.append(solo_static(solo, spec, body, c, best, cfg, tmp, f"{enc} c={c:2d}, after run {i + 1}"))
            level["tuned"], level["tuned_more"] = runs[0], runs[1:]
            if fresh:
                level["oracle_solo"], level["oracle_solo_after"], level["oracle_solo_more"] = (
                    fresh[0],
                    fresh[1],
                    fresh[2:],
                )
    return out


def autotuned_run(
    solo: Path, spec: ModelSpec, slo: float, body: Workload, c: int, cfg: Config, tmp: Path, log: Path
) -> dict[str, Any]:
    """The autotuned model cold and alone in a fresh server at `c` connections: the first `settle_s` discarded,
    the rest measured; with its parameters polled, its final state and its decision log."""
    with server(solo, env=specs_env(spec_doc(spec, slo_ms=slo)), log=log) as port:
        infer = f"http://{HOST}:{port}/v2/models/{spec.name}/infer"
        t0 = time.perf_counter()
        with Poller(port, spec.name, t0) as poller:
            wrk_run(infer, body, c, cfg.settle_s, tmp)  # the tuner's settling: discarded
            drain(port, spec.name)
            start = time.perf_counter() - t0
            row = wrk_run(infer, body, c, cfg.tuned_s - cfg.settle_s, tmp)
        final = get_json(f"http://{HOST}:{port}/v2/models/{spec.name}/batching")
    polls = poller.dump()
    row |= {
        "measured_from_s": start,
        "changes_measured": param_changes(polls, start, math.inf),
        "final": final,
        "polls": polls,
        "events": autotune_events(log, spec.name),
    }
    print(
        f"  {spec.name} c={c:2d} autotuned: {row['rps']:7.1f} req/s  p99 {row['p99_ms']:7.1f} ms, "
        f"final {setting(final)}, {len(row['events'])} autotune events",
        flush=True,
    )
    return row


#: After the settling run: the longest wait for its queue to empty, then a batch's time for the one executing.
DRAIN_S, LAST_BATCH_S = 0.4, 0.25


def drain(port: int, model: str) -> None:
    """Wait until the requests wrk abandoned at the end of a run have left the server (at most DRAIN_S +
    LAST_BATCH_S, short of the tuner's 1-s idle). Without it the next run's clients arrive beside them, and the
    tuner counts both populations for an instant: live, 32 clients read as 33 in the epoch of the switch, and a plan
    for 33 clients took a limit of 64 that 32 never fill (run AE)."""
    url = f"http://{HOST}:{port}/v2/models/{model}/batching"
    deadline = time.perf_counter() + DRAIN_S
    while get_json(url).get("queue_depth", 0) and time.perf_counter() < deadline:
        time.sleep(0.02)
    time.sleep(LAST_BATCH_S)


def solo_static(
    solo: Path, spec: ModelSpec, body: Workload, c: int, best: dict[str, Any], cfg: Config, tmp: Path, label: str
) -> dict[str, Any]:
    """The oracle's setting `best` in a fresh one-model server, as the autotuned model is served and measured: the
    same measured window after a warm-up (the grid server's figures are another server's); printed with `label`."""
    n, d = best["max_batch_size"], best["delay_ms"]
    with server(solo, env=specs_env(spec_doc(spec, static=(n, d)))) as port:
        infer = f"http://{HOST}:{port}/v2/models/{spec.name}/infer"
        wrk_run(infer, body, c, cfg.static_warm_s, tmp)
        row = wrk_run(infer, body, c, cfg.tuned_s - cfg.settle_s, tmp)
    print(
        f"  {spec.name} {label}: the oracle's {n} / {d} ms in a fresh server {row['rps']:7.1f} req/s  "
        f"p99 {row['p99_ms']:7.1f} ms",
        flush=True,
    )
    return {"max_batch_size": n, "delay_ms": d, **row}


def fresh_runs(level: dict[str, Any]) -> list[dict[str, Any]]:
    """The oracle's setting in fresh one-model servers, in order: before the first autotuned run, then after
    each (older results: before only, or before and after one)."""
    runs = [level[key] for key in ("oracle_solo", "oracle_solo_after") if level.get(key)]
    return runs + list(level.get("oracle_solo_more", []))


def tuned_runs(level: dict[str, Any]) -> list[dict[str, Any]]:
    """A level's autotuned runs, each in a fresh server (older results: one)."""
    return ([level["tuned"]] if level.get("tuned") else []) + list(level.get("tuned_more", []))


def tuned_summary(level: dict[str, Any]) -> dict[str, Any] | None:
    """The autotuned runs as one row: mean req/s, the worst p99, errors summed (None without a run)."""
    runs = tuned_runs(level)
    if not runs:
        return None
    return {
        "rps": float(np.mean([r["rps"] for r in runs])),
        "p99_ms": max(r["p99_ms"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "runs": runs,
    }


def fresh_oracle_rps(level: dict[str, Any]) -> float | None:
    """The mean of the oracle's setting's fresh-server runs; None without one."""
    runs = [r["rps"] for r in fresh_runs(level) if r["rps"] > 0]
    return float(np.mean(runs)) if runs else None


def pair_ratios(level: dict[str, Any]) -> list[float]:
    """Each autotuned run against the mean of the two fresh-server runs that bracket it (the host's drift
    between neighbours is smaller than across the level)."""
    fresh, runs = fresh_runs(level), tuned_runs(level)
    return [
        r["rps"] / np.mean([fresh[i]["rps"], fresh[i + 1]["rps"]])
        for i, r in enumerate(runs)
        if i + 1 < len(fresh) and fresh[i]["rps"] > 0 and fresh[i + 1]["rps"] > 0
    ]


def fresh_cell(level: dict[str, Any], tuned: dict[str, Any] | None) -> str:
    runs = [f"{r['rps']:.0f}" for r in fresh_runs(level)]
    alone = fresh_oracle_rps(level)
    if not runs:
        return "-"
    return " / ".join(runs) + (f" ({tuned['rps'] / alone:.2f}x)" if tuned and alone else "")


def top_static(rows: list[dict[str, Any]], slo: float, k: int) -> list[dict[str, Any]]:
    """The k best first-run settings: those within the SLO (no errors) first, by throughput."""
    return sorted(rows, key=lambda r: (not meets(r, slo), -r["rps"]))[:k]


def meets(row: dict[str, Any], slo: float) -> bool:
    return bool(row["p99_ms"] <= slo and not row["errors"])


def oracle(level: dict[str, Any], slo: float) -> dict[str, Any] | None:
    """A level's oracle from its re-measured settings: the best mean throughput of the two runs among those
    within the SLO in both runs (else in the first run only: `both_runs` False). Without any static setting
    within the SLO, the best mean throughput with `feasible` False (the SLO is then not asked of the tuner)."""
    first = {(r["max_batch_size"], r["delay_ms"]): r for r in level.get("static", [])}
    if not first:
        return None
    cands = []
    for again in level.get("repeat") or [max(first.values(), key=lambda r: r["rps"])]:
        one = first[again["max_batch_size"], again["delay_ms"]]
        runs = [one, again] if again is not one else [one]
        cands.append(
            {
                "max_batch_size": one["max_batch_size"],
                "delay_ms": one["delay_ms"],
                "rps": float(np.mean([r["rps"] for r in runs])),
                "p99_ms": max(r["p99_ms"] for r in runs),
                "runs": [(r["rps"], r["p99_ms"]) for r in runs],
                "first_ok": meets(one, slo),
                "both_ok": all(meets(r, slo) for r in runs),
            }
        )
    feasible = any(meets(r, slo) for r in first.values())
    for key in ("both_ok", "first_ok"):
        ok = [x for x in cands if x[key]]
        if ok:
            return max(ok, key=lambda x: x["rps"]) | {"feasible": True, "both_runs": key == "both_ok"}
    return max(cands, key=lambda x: x["rps"]) | {"feasible": feasible, "both_runs": False}


def closed_capacity(results: dict[str, Any], model: str, slo: float, cfg: Config) -> dict[str, Any] | None:
    """The closed-loop capacity: the oracle of the highest level measured in the levels phase (the client's
    body preferred). Its setting is the open-loop rows' static setting; its req/s starts the open-loop search."""
    lv = results.get("levels", {}).get(model)
    if not lv:
        return None
    encs = sorted(lv["encodings"], key=lambda e: e != cfg.client_encoding)
    levels = lv["encodings"][encs[0]]["levels"]
    top = max(levels, key=int)
    best = oracle(levels[top], slo)
    if not best:
        return None
    return {
        "rps": best["rps"],
        "setting": [best["max_batch_size"], best["delay_ms"]],
        "source": f"levels phase: oracle at {top} connections, {encs[0]} bodies"
        + ("" if best["feasible"] else " (no static setting met the SLO there: the best throughput)"),
    }


def level_oracle_rps(results: dict[str, Any], model: str, c: int, slo: float, cfg: Config) -> tuple[float | None, Any]:
    """The levels phase's oracle at `c` connections (client's body preferred): (req/s, (size, delay))."""
    lv = results.get("levels", {}).get(model)
    for enc in sorted(lv["encodings"], key=lambda e: e != cfg.client_encoding) if lv else []:
        level = lv["encodings"][enc]["levels"].get(str(c))
        if level and (best := oracle(level, slo)):
            return best["rps"], (best["max_batch_size"], best["delay_ms"])
    return None, None


MEASURED_CAPACITY: dict[str, dict[str, Any]] = {}  # per model: measured once per run when there are no levels results
OPEN_CAPACITY: dict[str, dict[str, Any]] = {}  # per model: the open-loop capacity found (or given) in this run


def demo_setting(spec: ModelSpec) -> tuple[int, int]:
    return spec.batching.max_batch_size, spec.batching.max_queue_delay_microseconds // 1000


def measure_closed_capacity(solo: Path, spec: ModelSpec, cfg: Config, tmp: Path) -> dict[str, Any]:
    """No levels results: a dedicated 64-connection measurement of the demo's static setting."""
    static = demo_setting(spec)
    body = workload(spec.name, cfg.client_encoding)
    with server(solo, env=specs_env(spec_doc(spec, static=static))) as port:
        url = f"http://{HOST}:{port}/v2/models/{spec.name}/infer"
        wrk_run(url, body, 64, cfg.static_warm_s, tmp)
        row = wrk_run(url, body, 64, 2 * cfg.static_s, tmp)
    return {
        "rps": row["rps"],
        "setting": list(static),
        "source": f"dedicated measurement: 64 connections (wrk, {cfg.client_encoding}), the demo setting "
        f"{static[0]} / {static[1]} ms (no levels results)",
    }


def closed_basis(
    results: dict[str, Any], repo: Path, work: Path, spec: ModelSpec, slo: float, cfg: Config, tmp: Path, given: bool
) -> dict[str, Any]:
    """The closed-loop capacity (the static setting and the search's start): the levels oracle of this run's
    results, else a dedicated wrk measurement of the demo setting; with the open-loop capacity `given`,
    nothing is measured (the demo setting, no closed-loop figure)."""
    model = spec.name
    closed = closed_capacity(results, model, slo, cfg) or MEASURED_CAPACITY.get(model)
    if closed is None and given:
        closed = {
            "rps": None,
            "setting": list(demo_setting(spec)),
            "source": "not measured, the open-loop capacity was given on the command line; the static setting is the demo's",
        }
    if closed is None:
        print(f"  {model}: no levels results for the closed-loop capacity: measuring it ...", flush=True)
        closed = MEASURED_CAPACITY[model] = measure_closed_capacity(solo_repository(repo, work, model), spec, cfg, tmp)
    return closed


def open_capacity(
    port: int, requests: list[bytes], model: str, slo: float, cfg: Config, closed: dict[str, Any], given: float | None
) -> dict[str, Any]:
    """The open-loop capacity of the static setting `closed["setting"]`, served at `port`: `given`, or
    searched with the asyncio open-loop client from the closed-loop figure (common.open_loop_capacity)."""
    n, d = closed["setting"]
    base = {"setting": closed["setting"], "closed_loop": closed}
    if given is not None:
        cap = base | {"rps": given, "basis": "given", "source": "given on the command line (--capacity)"}
    else:
        start = closed["rps"]
        print(f"  {model}: open-loop capacity search at {n} / {d} ms from {start:.0f}/s ...", flush=True)
        search = asyncio.run(
            open_loop_capacity(
                HOST,
                port,
                requests,
                start_rps=start,
                slo_ms=slo,
                window_s=cfg.cap_window_s,
                warmup_s=cfg.cap_warmup_s,
                budget_s=cfg.cap_budget_s,
                max_probes=cfg.cap_probes,
            )
        )
        found = search.rps is not None
        rps = search.rate
        held = None
        if found and cfg.cap_confirm_s > 0:
            held = asyncio.run(
                confirm_capacity(
                    HOST,
                    port,
                    requests,
                    rps,
                    slo_ms=slo,
                    window_s=cfg.cap_confirm_s,
                    warmup_s=cfg.cap_warmup_s,
                    tries=cfg.cap_confirm_tries,
                )
            )
            rps = held.rate
        cap = base | {
            "rps": rps,
            "basis": "open-loop search",
            "source": f"open-loop search ({len(search.probes)} probes of {cfg.cap_warmup_s:g} + {cfg.cap_window_s:g} s, "
            f"{search.seconds:.0f} s): the highest Poisson rate with p99 <= {slo:g} ms, no refusals, no errors"
            + ("" if found else " - NONE passed: the lowest rate tried, which failed")
            + ("" if not found or search.resolution_met else " (bracket not narrowed to 5%: probe limit or budget)")
            + (f"; client behind (lag p99 > {LAG_LIMIT_MS:g} ms) in some probe" if search.client_behind else "")
            + (f"; {held.text()}" if held else ""),
            "search": search.dump(),
            "confirmation": held.dump() if held else None,
        }
    OPEN_CAPACITY[model] = cap
    closed_text = f"{closed['rps']:.0f} req/s ({closed['source']})" if closed.get("rps") else closed["source"]
    print(
        f"  {model}: open-loop capacity {cap['rps']:.0f} req/s at {n} / {d} ms ({cap['source']}); closed-loop figure "
        f"{closed_text}",
        flush=True,
    )
    return cap


def open_phase(
    repo: Path,
    work: Path,
    logs: Path,
    spec: ModelSpec,
    slo: float,
    cfg: Config,
    closed: dict[str, Any],
    given: float | None,
) -> dict[str, Any]:
    model = spec.name
    solo = solo_repository(repo, work, model)
    static = (int(closed["setting"][0]), int(closed["setting"][1]))
    static_env = specs_env(spec_doc(spec, static=static))
    rows: list[dict[str, Any]] = []
    cap: dict[str, Any] = {}
    for run in range(cfg.open_runs):
        # Each run's static rows in a fresh static server; the first run's follow the capacity search in it.
        with server(solo, env=static_env) as port:
            requests = client_requests(model, cfg.client_encoding, port)
            if not cap:
                cap = open_capacity(port, requests, model, slo, cfg, closed, given)
            rows += static_open_rows(port, requests, model, slo, cap["rps"], static, cfg, run=run)
        for i, load in enumerate(cfg.open_loads):
            rate = load * cap["rps"]
            log = logs / (f"open-{model}-{i}.log" if run == 0 else f"open-{model}-{i}-run{run + 1}.log")
            with server(solo, env=specs_env(spec_doc(spec, slo_ms=slo)), log=log) as port:
                requests = client_requests(model, cfg.client_encoding, port)
                t0 = time.perf_counter()
                with Poller(port, model, t0) as poller:
                    t = asyncio.run(
                        open_loop_timeline(HOST, port, requests, [(cfg.settle_s, rate), (cfg.open_s, rate)], t0=t0)
                    )
                final = get_json(f"http://{HOST}:{port}/v2/models/{model}/batching")
            rows.append(
                open_row("autotuned", load, rate, t, slo)
                | {"run": run, "setting": setting(final), "final": final, "polls": poller.dump()}
                | {"events": autotune_events(log, model)}
            )
            print_open(model, rows[-1])
    return {"slo_ms": slo, "config": cfg.dump(), "capacity": cap, "rows": rows}


def static_open_rows(
    port: int,
    requests: list[bytes],
    model: str,
    slo: float,
    capacity: float,
    static: tuple[int, int],
    cfg: Config,
    *,
    run: int,
) -> list[dict[str, Any]]:
    """The static server's rows, one per load in turn (each after its warm-up at its rate)."""
    rows = []
    for load in cfg.open_loads:
        rate = load * capacity
        t = asyncio.run(open_loop_timeline(HOST, port, requests, [(cfg.static_warm_s, rate), (cfg.open_s, rate)]))
        rows.append(open_row("static", load, rate, t, slo) | {"run": run, "setting": f"{static[0]} / {static[1]} ms"})
        print_open(model, rows[-1])
    return rows


def open_row(mode: str, load: float, rate: float, t: Timeline, slo: float) -> dict[str, Any]:
    start = t.steps[-1][0]
    return {
        "mode": mode,
        "load": load,
        "offered_rps": rate,
        **measured(t, start, t.end_s, slo),
        "sent": t.sent,
        "unfinished": t.unfinished,
        "skipped": t.skipped,
        "stale_retries": t.stale_retries,
        "lag_p99_ms": t.lag_p99_ms,
    }


def print_open(model: str, r: dict[str, Any]) -> None:
    print(
        f"  {model} open loop {r['load']:.0%} ({r['offered_rps']:.0f}/s) {r['mode']} run {r.get('run', 0) + 1}: "
        f"{r['rps']:.1f} req/s ok, "
        f"p99 {r['p99_ms']:.1f} ms, errors {r['errors_by_status'] or 0}, unfinished {r['unfinished']}, "
        f"client lag p99 {lag_text(r['lag_p99_ms'])} ms",
        flush=True,
    )


def steps_capacity(
    repo: Path, work: Path, spec: ModelSpec, slo: float, cfg: Config, closed: dict[str, Any], given: float | None
) -> dict[str, Any]:
    """The steps phase's open-loop capacity: the open phase's of this run, else given or searched (a static
    server of its own)."""
    if spec.name in OPEN_CAPACITY:
        return OPEN_CAPACITY[spec.name]
    static = (int(closed["setting"][0]), int(closed["setting"][1]))
    with server(solo_repository(repo, work, spec.name), env=specs_env(spec_doc(spec, static=static))) as port:
        return open_capacity(
            port, client_requests(spec.name, cfg.client_encoding, port), spec.name, slo, cfg, closed, given
        )


def closed_step_targets(
    solo: Path, spec: ModelSpec, slo: float, cfg: Config, results: dict[str, Any], levels: list[int]
) -> list[tuple[float | None, str]]:
    """Each closed-loop step's target: the levels oracle's setting at the step's clients, served statically through
    the same schedule by the steps' own client (the asyncio one, which costs more per request than wrk), its req/s
    over the step's windows after `cfg.skip_s` (those the autotuned row reads). A step's target is thus measured
    after the same earlier steps: a 2-client step read after 32 clients is no fresh server's (live, a static 2 / 1
    ms served 0.83x, 0.87x and 1.18x of its own first 2-client step on the way back from 32). Without a levels
    result, no target."""
    schedule = [(cfg.step_s, c) for c in levels]
    targets: list[tuple[float | None, str]] = [(None, "none (no levels result at this level)")] * len(levels)
    for c in sorted(set(levels)):
        wrk_rps, best = level_oracle_rps(results, spec.name, c, slo, cfg)
        if best is None:
            continue
        n, d = int(best[0]), int(best[1])
        with server(solo, env=specs_env(spec_doc(spec, static=(n, d)))) as port:
            requests = client_requests(spec.name, cfg.client_encoding, port)
            # Polled as the autotuned schedule is: the poller's thread shares the client's process, and near the
            # client's own limit (32 clients) that costs the load it drives.
            t0 = time.perf_counter()
            with Poller(port, spec.name, t0):
                t = asyncio.run(closed_loop_timeline(HOST, port, requests, schedule, t0=t0))
        for i, (start, end, level) in enumerate(t.spans()):
            if int(level) == c:
                rps = measured(t, start + cfg.skip_s, end, slo)["rps"]
                source = f"oracle {n} / {d} ms through the same steps" + (f"; wrk {wrk_rps:.0f}" if wrk_rps else "")
                targets[i] = (rps, source)
                print(
                    f"  {spec.name}: static {n} / {d} ms, step {i + 1} at {c} clients (asyncio): {rps:.0f} req/s",
                    flush=True,
                )
    return targets


def steps_phase(
    repo: Path,
    work: Path,
    logs: Path,
    spec: ModelSpec,
    slo: float,
    cfg: Config,
    results: dict[str, Any],
    cap: dict[str, Any] | None,
) -> dict[str, Any]:
    model = spec.name
    solo = solo_repository(repo, work, model)
    out: dict[str, Any] = {"slo_ms": slo, "config": cfg.dump(), "capacity": cap}
    closed: list[tuple[float, float]] = [(cfg.step_s, c) for c in cfg.step_clients]
    kinds: list[tuple[str, list[tuple[float, float]]]] = [("closed", closed)]
    if cap:
        r = cfg.step_rate * cap["rps"]
        kinds.append(("open", [(cfg.step_s, r), (cfg.step_s, 3 * r), (cfg.step_s, r)]))
    targets = closed_step_targets(solo, spec, slo, cfg, results, cfg.step_clients)
    for kind, schedule in kinds:
        log = logs / f"steps-{model}-{kind}.log"
        with server(solo, env=specs_env(spec_doc(spec, slo_ms=slo)), log=log) as port:
            requests = client_requests(model, cfg.client_encoding, port)
            t0 = time.perf_counter()
            with Poller(port, model, t0) as poller:
                if kind == "closed":
                    sched = [(s, int(c)) for s, c in schedule]
                    t = asyncio.run(closed_loop_timeline(HOST, port, requests, sched, t0=t0))
                else:
                    t = asyncio.run(open_loop_timeline(HOST, port, requests, schedule, t0=t0))
            final = get_json(f"http://{HOST}:{port}/v2/models/{model}/batching")
        steps = []
        for i, (start, end, level) in enumerate(t.spans()):
            target, source = (level, "offered rate") if kind == "open" else targets[i]
            steps.append(
                {
                    "start_s": start,
                    "end_s": end,
                    "level": level,
                    "target_rps": target,
                    "target_source": source,
                    "windows": [asdict(w) for w in t.windows(1.0, start, end)],
                    "errors_by_status": {str(k): v for k, v in t.statuses(start, end).items() if k != 200},
                }
            )
        out[kind] = {
            "steps": steps,
            "windows": [asdict(w) for w in t.windows()],
            "polls": poller.dump(),
            "events": autotune_events(log, model),
            "final": final,
            "unfinished": t.unfinished,
            "lag_p99_ms": t.lag_p99_ms,
        }
        for row in step_rows(model, kind, out[kind], slo, cfg.skip_s):
            print("  " + " | ".join(str(x) for x in row), flush=True)
    return out


def two_phase(
    repo: Path,
    work: Path,
    logs: Path,
    specs: dict[str, ModelSpec],
    slos: dict[str, float],
    cfg: Config,
    results: dict[str, Any],
) -> dict[str, Any]:
    c = cfg.two_clients
    candidates: dict[str, list[tuple[int, int]]] = {}
    for m in MODELS:
        _, best = level_oracle_rps(results, m, c, slos[m], cfg)
        candidates[m] = sorted({demo_setting(specs[m]), *parse_settings(cfg.two_settings), *([best] if best else [])})
    sweep = pair_sweep(repo, work, specs, slos, cfg, candidates)
    top = sweep[0]
    statics = {m: (top[m]["setting"][0], top[m]["setting"][1]) for m in MODELS}
    source = f"the best of {len(sweep)} static pairs swept ({cfg.two_sweep_s:g} s each, one server)"
    out: dict[str, Any] = {
        "config": cfg.dump(),
        "clients": c,
        "slo_ms": slos,
        "static_source": dict.fromkeys(MODELS, source),
        "sweep": sweep,
    }
    for mode in ("autotuned", "static"):
        docs = [
            spec_doc(specs[m], slo_ms=slos[m]) if mode == "autotuned" else spec_doc(specs[m], static=statics[m])
            for m in MODELS
        ]
        warm = cfg.settle_s if mode == "autotuned" else cfg.static_warm_s
        log = logs / f"two-{mode}.log"
        with server(repo, env=specs_env(*docs), log=log) as port, ExitStack() as stack:
            t0 = time.perf_counter()
            pollers = {m: stack.enter_context(Poller(port, m, t0)) for m in MODELS}
            schedule = [(float(warm), c), (cfg.two_s, c)]
            # Batches counted over the measured window: two closed loops on one core can settle into cohorts
            # (16 clients in two alternating batches of 8) at the same setting, and the rate follows the cohorts.
            counts: dict[str, tuple[int, int]] = {}
            timer = threading.Timer(warm, read_counts, (port, counts))
            timer.start()
            timelines = asyncio.run(both_models(port, {m: m for m in MODELS}, schedule, cfg.client_encoding, t0))
            timer.join()
            stack.close()  # the pollers stop before the final reads
            finals = {m: get_json(f"http://{HOST}:{port}/v2/models/{m}/batching") for m in MODELS}
            batches = {m: mean_batch(counts.get(m, (0, 0)), batch_counts(port, m)) for m in MODELS}
        out[mode] = {}
        for m, t in zip(MODELS, timelines, strict=True):
            start = t.steps[-1][0]
            out[mode][m] = measured(t, start, t.end_s, slos[m]) | {
                "setting": setting(finals[m]),
                "mean_batch": batches[m],
                "final": finals[m],
                "polls": pollers[m].dump(),
                "events": autotune_events(log, m) if mode == "autotuned" else [],
                "window_list": [asdict(w) for w in t.windows(1.0, start, t.end_s)],
            }
            r = out[mode][m]
            print(
                f"  two models, {mode}: {m} {r['rps']:.1f} req/s, p99 {r['p99_ms']:.1f} ms, "
                f"{r['windows_in_slo']}/{r['windows']} windows within {slos[m]:g} ms, setting {r['setting']}, "
                f"mean batch {r['mean_batch']:.1f}",
                flush=True,
            )
    return out


def read_counts(port: int, into: dict[str, tuple[int, int]]) -> None:
    into.update({m: batch_counts(port, m) for m in MODELS})


def mean_batch(start: tuple[int, int], end: tuple[int, int]) -> float:
    return (end[0] - start[0]) / max(1, end[1] - start[1])


def pair_sweep(
    repo: Path,
    work: Path,
    specs: dict[str, ModelSpec],
    slos: dict[str, float],
    cfg: Config,
    candidates: dict[str, list[tuple[int, int]]],
) -> list[dict[str, Any]]:
    """Every pair of the models' candidate static settings, driven as the two-model phase drives them, in one server
    (each setting a model of its own, as the levels grid): the pairs best first, by the share of 1-s windows within
    the SLO of the model that held it least, then by req/s of both. Table 5's target asks for both SLOs wherever a
    static pair holds them, so the static side is the best pair found, not one chosen beforehand."""
    pairs_dir = work / "pairs"
    if not pairs_dir.exists():
        for m in MODELS:
            grid_repository(repo, pairs_dir, specs[m], candidates[m])
    c, rows = cfg.two_clients, []
    with server(pairs_dir) as port:
        for pair in itertools.product(*(candidates[m] for m in MODELS)):
            names = {m: grid_name(m, *s) for m, s in zip(MODELS, pair, strict=True)}
            t0 = time.perf_counter()
            schedule = [(float(cfg.static_warm_s), c), (cfg.two_sweep_s, c)]
            timelines = asyncio.run(both_models(port, names, schedule, cfg.client_encoding, t0))
            row: dict[str, Any] = {}
            for m, s, t in zip(MODELS, pair, timelines, strict=True):
                row[m] = measured(t, t.steps[-1][0], t.end_s, slos[m]) | {"setting": list(s)}
            row["held"] = min(row[m]["windows_in_slo"] / max(1, row[m]["windows"]) for m in MODELS)
            row["rps"] = sum(row[m]["rps"] for m in MODELS)
            rows.append(row)
            print(
                "  pair "
                + ", ".join(
                    f"{m} {s[0]} / {s[1]} ms: {row[m]['rps']:.0f} req/s p99 {row[m]['p99_ms']:.1f}"
                    for m, s in zip(MODELS, pair, strict=True)
                )
                + f"; both within the SLO in {row['held']:.0%} of the windows",
                flush=True,
            )
    return sorted(rows, key=lambda r: (-r["held"], -r["rps"]))


def parse_settings(text: str) -> list[tuple[int, int]]:
    """'16/2,32/5' -> [(16, 2), (32, 5)]: (max batch size, delay ms)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if item:
            n, d = item.split("/")
            out.append((int(n), int(d)))
    return out


async def both_models(
    port: int, names: dict[str, str], schedule: list[tuple[float, int]], encoding: str, t0: float
) -> list[Timeline]:
    """Each demo model's own closed-loop clients, at the same time (one event loop on the client core); `names`: the
    served model each demo model's requests go to (its own, or a grid model of it)."""
    runs = (
        closed_loop_timeline(HOST, port, named_requests(m, names[m], encoding, port), schedule, seed=i, t0=t0)
        for i, m in enumerate(MODELS)
    )
    return list(await asyncio.gather(*runs))


def single_phase(repo: Path, work: Path, spec: ModelSpec, slo: float, cfg: Config) -> dict[str, Any]:
    model = spec.name
    solo = solo_repository(repo, work, model)
    out: dict[str, Any] = {"slo_ms": slo, "config": cfg.dump()}
    warm = min(3, cfg.settle_s)
    for mode, extra, env in (
        ("autotune", (), specs_env(spec_doc(spec, slo_ms=slo))),
        ("no batching", ("--no-batching",), None),
    ):
        with server(solo, *extra, env=env) as port:
            requests = client_requests(model, cfg.client_encoding, port)
            t = asyncio.run(closed_loop_timeline(HOST, port, requests, [(warm, 1), (cfg.single_s, 1)]))
            state = get_json(f"http://{HOST}:{port}/v2/models/{model}/batching")
        lat = t.between(t.steps[1][0], math.inf) * 1e3
        out[mode] = {
            "mean_ms": float(lat.mean()),
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "rps": lat.size / cfg.single_s,
            "params": [state["max_batch_size"], state["max_queue_delay_microseconds"]],
        }
        print(f"  {model} one client, {mode}: mean {out[mode]['mean_ms']:.2f} ms", flush=True)
    return out


# -- analysis and the page --------------------------------------------------------------------------------
def fmt_ms(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.1f}"


def levels_section(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    lv_all = results.get("levels", {})
    if not lv_all:
        return [], []
    rows, noise, sweeps, verdicts, plan_cells = [], [], [], [], False
    for m in (m for m in MODELS if m in lv_all):
        r, slo = lv_all[m], lv_all[m]["slo_ms"]
        for enc, e in r["encodings"].items():
            ratios: list[tuple[float, int]] = []  # (autotuned / oracle, connections)
            seconds: list[float] = []  # autotuned / the oracle's second run alone (not picked by the sweep)
            solos: list[tuple[float, float]] = []  # (autotuned, the grid's oracle) / its setting in a fresh server
            bias: list[float] = []  # the oracle's second run / its first
            pairs: list[float] = []  # each autotuned run / the fresh-server runs just before and after it
            slo_levels = slo_met = 0
            for c, level in sorted(e["levels"].items(), key=lambda kv: int(kv[0])):
                best, tuned = oracle(level, slo), tuned_summary(level)
                if not best:
                    continue
                ratio = tuned["rps"] / best["rps"] if tuned and best["rps"] else math.nan
                within = "n/a (no static setting within)" if not best["feasible"] else "-"
                if tuned and best["feasible"]:
                    ok = meets(tuned, slo)
                    slo_levels, slo_met = slo_levels + 1, slo_met + ok
                    within = "yes" if ok else "NO"
                if tuned:
                    ratios.append((ratio, int(c)))
                if tuned and (alone := fresh_oracle_rps(level)):
                    solos.append((tuned["rps"] / alone, best["rps"] / alone))
                if len(best["runs"]) == 2 and best["runs"][0][0] > 0 and best["runs"][1][0] > 0:
                    bias.append(best["runs"][1][0] / best["runs"][0][0])
                    if tuned:
                        seconds.append(tuned["rps"] / best["runs"][1][0])
                pairs.extend(pair_ratios(level))
                plan = (tuned["runs"][0] if tuned else {}).get("final", {}).get("autotune", {}).get("plan")
                plan_cells |= plan is not None
                rows.append(
                    [
                        m,
                        enc,
                        int(c),
                        f"{best['max_batch_size']} / {best['delay_ms']} ms" + ("" if best["both_runs"] else " *"),
                        f"{best['rps']:.0f} (" + " / ".join(f"{x:.0f}" for x, _ in best["runs"]) + ")",
                        " / ".join(fmt_ms(p) for _, p in best["runs"]),
                        runs_cell(tuned, lambda r: f"{r['rps']:.0f}", f"{tuned['rps']:.0f}") if tuned else "-",
                        runs_cell(tuned, lambda r: fmt_ms(r["p99_ms"])) if tuned else "-",
                        runs_cell(tuned, lambda r: setting(r["final"]), sep="; ") if tuned else "-",
                        f"{ratio:.2f}x" if tuned else "-",
                        fresh_cell(level, tuned),
                        within,
                        "ok" if tuned and ratio >= 0.95 and within != "NO" else "MISS" if tuned else "-",
                        plan_text(plan),
                    ]
                )
                for again in level.get("repeat", []):
                    one = next(
                        x
                        for x in level["static"]
                        if (x["max_batch_size"], x["delay_ms"]) == (again["max_batch_size"], again["delay_ms"])
                    )
                    change = again["rps"] / one["rps"] - 1 if one["rps"] else math.nan
                    noise.append(
                        [
                            m,
                            enc,
                            int(c),
                            f"{one['max_batch_size']} / {one['delay_ms']} ms",
                            f"{one['rps']:.0f} / {fmt_ms(one['p99_ms'])}",
                            f"{again['rps']:.0f} / {fmt_ms(again['p99_ms'])}",
                            f"{change:+.0%}",
                        ]
                    )
                for x in level["static"]:
                    sweeps.append(
                        [
                            m,
                            enc,
                            int(c),
                            f"{x['max_batch_size']} / {x['delay_ms']} ms",
                            f"{x['rps']:.0f}",
                            fmt_ms(x["p99_ms"]) + ("" if meets(x, slo) else " ✗"),
                        ]
                    )
            if ratios:
                mean = float(np.mean([x for x, _ in ratios]))
                worst = min(ratios)
                verdicts.append(
                    f"- levels, {m} {enc} bodies: mean ratio autotuned / oracle {mean:.2f}x over {len(ratios)} levels "
                    f"(target >= 1.0: {'met' if mean >= 1.0 else 'NOT met'}); lowest {worst[0]:.2f}x at {worst[1]} "
                    f"conns (target >= 0.95 at every level: {'met' if worst[0] >= 0.95 else 'NOT met'}); p99 within "
                    f"{slo:g} ms at {slo_met}/{slo_levels} levels where some static setting meets it "
                    f"({'met' if slo_met == slo_levels else 'NOT met'})"
                )
                if seconds:
                    # The sweep picks the best of ~30 noisy first runs, so the oracle's first run is biased upwards
                    # (the winner's curse); its second run was measured after the pick, free of it.
                    verdicts.append(
                        f"  - the oracle's second runs averaged {np.mean(bias):.2f}x its first (the sweep's pick of "
                        f"the best of many noisy runs); against the second run alone the autotuner averaged "
                        f"{np.mean(seconds):.2f}x (lowest {min(seconds):.2f}x)"
                    )
                if solos:
                    verdicts.append(
                        f"  - the oracle's setting in a fresh one-model server (served and measured as the autotuned "
                        f"model is, just before and just after it): the autotuner averaged {np.mean([a for a, _ in solos]):.2f}x it "
                        f"(lowest {min(a for a, _ in solos):.2f}x, >= 0.95x at {sum(a >= 0.95 for a, _ in solos)}/"
                        f"{len(solos)} levels); the grid server's oracle read {np.mean([g for _, g in solos]):.2f}x it"
                    )
                if pairs:
                    verdicts.append(
                        f"  - each autotuned run against the two fresh-server runs that bracket it: {len(pairs)} pairs, "
                        f"mean {np.mean(pairs):.2f}x, median {np.median(pairs):.2f}x, range {min(pairs):.2f}-"
                        f"{max(pairs):.2f}x; >= 0.95x in {sum(x >= 0.95 for x in pairs)}"
                    )
    cfg = next(lv_all[m] for m in MODELS if m in lv_all)["config"]  # the one `differing` names
    headers = [
        "model",
        "body",
        "conns",
        "oracle setting",
        "oracle req/s (run 1 / run 2)",
        "oracle p99 ms (run 1 / run 2)",
        "autotuned req/s",
        "autotuned p99 ms",
        "autotuned final setting",
        "ratio",
        "oracle's setting, fresh servers: req/s before / after each autotuned run (ratio)",
        "autotuned p99 <= SLO",
        ">= 0.95x & SLO",
    ]
    if plan_cells:
        headers.append("planner's prediction (autotune.plan, final)")
    else:
        rows = [row[:-1] for row in rows]
    text = [
        "## 1. Closed loop per level: the oracle (best static setting, this run) vs the autotuner",
        f"wrk, one connection per client, the same body every request. Static settings: max batch sizes up to the "
        f"level plus the next power of two x delays {cfg['delays_ms']} ms (size 1 at 0 ms only), each a model of its "
        f"own in one server, {cfg['static_s']} s each"
        + (f" after a one-time {cfg['grid_warmup_s']}-s warm-up per grid model" if cfg["grid_warmup_s"] else "")
        + f"; then the top {cfg['top']} of each level (within the SLO first) measured a second time. Oracle = the best "
        "mean of those two runs whose p99 met the SLO in both (* = in the first run only); its req/s is that mean. "
        f"Autotuned: the model alone in a fresh server, cold, {cfg.get('tuned_runs', 1)} run(s) per level (req/s: "
        f"their mean; p99: each); the first {cfg['settle_s']} s are discarded "
        f"as the tuner's settling, the next {cfg['tuned_s'] - cfg['settle_s']} s measured. SLO per model: "
        + ", ".join(f"{m} {lv_all[m]['slo_ms']:g} ms" for m in MODELS if m in lv_all)
        + "."
        + differing(lv_all, "levels delays_ms static_s grid_warmup_s top tuned_s settle_s"),
        table(headers, rows),
        "![throughput ratio and p99 per level](autotune-levels.png)",
        f"### The oracle's noise: the top {cfg['top']} static settings of each level, run 1 and run 2 (req/s / p99 ms)",
        table(["model", "body", "conns", "setting", "run 1", "run 2", "change"], noise),
        "<details><summary>Every static setting's first run (req/s, p99 ms; ✗ = over the SLO or errors)</summary>\n\n"
        + table(["model", "body", "conns", "setting", "req/s", "p99 ms"], sweeps)
        + "\n\n</details>",
    ]
    return text, verdicts


def differing(entries: dict[str, Any], relevant: str) -> str:
    """A caveat when a phase's models were measured with different settings (`relevant`: the config keys
    that matter to it; by different runs): the section's text states the first model's."""
    models = [m for m in MODELS if m in entries]
    configs = [entries[m]["config"] for m in models]
    keys = [k for k in relevant.split() if any(c.get(k) != configs[0].get(k) for c in configs)]
    first = models[0]
    verb = "differs" if len(keys) == 1 else "differ"
    return f" (Settings as for {first}; {', '.join(keys)} {verb} between the models: see the runs.)" if keys else ""


def runs_cell(tuned: dict[str, Any], cell: Callable[[dict[str, Any]], str], head: str = "", sep: str = " / ") -> str:
    """One cell for the autotuned runs: each run's value (after `head`, their summary, when there are several)."""
    each = [cell(r) for r in tuned["runs"]]
    if len(each) == 1:
        return each[0]
    return f"{head} ({sep.join(each)})" if head else sep.join(each)


def plan_text(plan: Any) -> str:
    if not isinstance(plan, dict):
        return "-" if plan is None else str(plan)[:80]
    return ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in plan.items()
        if isinstance(v, (int, float, str, bool))
    )[:120]


def open_section(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    op = results.get("open", {})
    if not op:
        return [], []
    rows, verdicts = [], []
    for m in (m for m in MODELS if m in op):
        r, slo = op[m], op[m]["slo_ms"]
        for x in sorted(r["rows"], key=lambda x: (x["load"], x["mode"] != "static", x.get("run", 0))):
            rows.append(
                [
                    m,
                    f"{x['load']:.0%}",
                    f"{x['offered_rps']:.0f}",
                    x["mode"],
                    x.get("run", 0) + 1,
                    x["setting"],
                    f"{x['rps']:.0f}",
                    fmt_ms(x["p50_ms"]),
                    fmt_ms(x["p99_ms"]),
                    "yes" if x["p99_ms"] <= slo else "NO",
                    ", ".join(f"{'no answer' if k == '0' else k} x{v}" for k, v in x["errors_by_status"].items())
                    or "0",
                    x["unfinished"],
                    lag_text(x["lag_p99_ms"]),
                ]
            )
        for load in sorted({x["load"] for x in r["rows"]}):
            runs = {
                mode: [x for x in r["rows"] if x["load"] == load and x["mode"] == mode]
                for mode in ("autotuned", "static")
            }
            if all(runs.values()):
                verdicts.append(
                    f"- open loop, {m} at {load:.0%} (SLO {slo:g} ms): "
                    + "; ".join(
                        f"{mode} within it in {sum(x['p99_ms'] <= slo for x in xs)} of {len(xs)} run(s), p99 "
                        + " / ".join(fmt_ms(x["p99_ms"]) for x in xs)
                        + f" ms, errors {sum(sum(x['errors_by_status'].values()) for x in xs)}, achieved "
                        + " / ".join(f"{x['rps'] / x['offered_rps']:.0%}" for x in xs)
                        + " of the offered rate"
                        for mode, xs in runs.items()
                    )
                )
    cfg = next(op[m] for m in MODELS if m in op)["config"]  # the one `differing` names
    caps = "; ".join(capacity_text(m, op[m]["capacity"]) for m in MODELS if m in op)
    return [
        "## 2. Open loop (Poisson arrivals): static best setting vs autotuned",
        "The loads are fractions of the **open-loop capacity**: the highest Poisson arrival rate at which the "
        "static setting below holds p99 within the SLO with no refusals and no errors, measured with the same "
        "asyncio open-loop client as the rows (a search from the closed-loop throughput: each probe "
        f"{cfg.get('cap_warmup_s', '?')} s of warm-up at its rate, then {cfg.get('cap_window_s', '?')} s judged on "
        "the requests scheduled in it, those answered after it included; down while probes fail, then bisecting to "
        f"5%; at most {cfg.get('cap_probes', '?')} probes and {cfg.get('cap_budget_s', '?')} s per model"
        + (
            f"; the rate found then held for {cfg['cap_confirm_s']:g} s after the same warm-up, 5% lower (or 95% "
            "of the answers per second that window achieved, when lower) after a failed window, at most "
            f"{cfg['cap_confirm_tries']} window{'s' if cfg['cap_confirm_tries'] != 1 else ''}"
            if cfg.get("cap_confirm_s")
            else ""
        )
        + "), unless given on the command line. The closed-loop figure (wrk; the levels oracle of the highest level, whose "
        "setting the static server holds) is shown for reference only: an open loop queues what a closed loop "
        f"never offers. Capacity: {caps}. Each rate runs "
        f"{cfg['static_warm_s']} s (discarded) then {cfg['open_s']:g} s measured. Autotuned: a fresh server per "
        f"rate, the first {cfg['settle_s']} s discarded, then {cfg['open_s']:g} s measured. "
        f"{cfg.get('open_runs', 1)} run(s) of every row: each run the static rows (a fresh static server after the "
        "first, whose rows follow the capacity search), then the autotuned ones. Asyncio client "
        f"({cfg['client_encoding']} bodies), keep-alive connections opened as needed; latency counts from each "
        "request's scheduled arrival (the client's own lateness included). Client lag = when a request was "
        "written minus its scheduled arrival, p99 per run; above "
        f"{LAG_LIMIT_MS:g} ms the row says client behind (the load generator, not the server, set the pace). "
        "Achieved = answers with status 200 per second; errors = non-200 answers by status and requests with no "
        "answer; unfinished = still unanswered 10 s after the last arrival."
        + differing(
            op,
            "open_loads open_s open_runs settle_s client_encoding cap_warmup_s cap_window_s cap_probes cap_budget_s cap_confirm_s "
            "cap_confirm_tries",
        ),
        table(
            [
                "model",
                "load",
                "offered /s",
                "mode",
                "run",
                "setting (final)",
                "achieved req/s",
                "p50 ms",
                "p99 ms",
                "p99 <= SLO",
                "errors",
                "unfinished",
                "client lag p99 ms",
            ],
            rows,
        ),
    ], verdicts


def capacity_text(model: str, cap: dict[str, Any]) -> str:
    """One model's capacity for the page: the open-loop figure, its basis, and the closed-loop one beside it."""
    closed = cap.get("closed_loop")
    if closed is None:  # results of an older run: the capacity was the closed-loop figure itself
        return f"{model} {cap['rps']:.0f} req/s (closed loop: {cap['source']})"
    n, d = cap["setting"]
    closed_text = f"{closed['rps']:.0f} req/s ({closed['source']})" if closed.get("rps") else closed["source"]
    probes = cap.get("search", {}).get("probes", []) if cap.get("search") else []
    tried = ", ".join(f"{p['rate']:.0f}{'' if p['passed'] else ' ✗'}" for p in probes)
    return (
        f"{model} **{cap['rps']:.0f} req/s** open loop at {n} / {d} ms ({cap['source']}"
        + (f"; rates tried /s: {tried}" if tried else "")
        + f"), closed-loop figure {closed_text}"
    )


def step_stats(
    kind: str, step: dict[str, Any], polls: list[dict[str, Any]], slo: float, skip_s: float
) -> dict[str, Any]:
    """One load step: time until the SLO and the throughput target hold (3 windows in a row; closed loop:
    >= 95% of the level's oracle, open loop: >= 95% of the window's own arrivals), SLO attainment of the 1-s
    windows after the step's first `skip_s`, and parameter changes per minute once settled."""
    ws, target = step["windows"], step["target_rps"]

    def good(w: dict[str, Any]) -> bool:
        floor = 0.95 * (w["sent_per_s"] if kind == "open" else target or 0.0)
        return bool(w["p99_ms"] <= slo and w["requests_per_s"] >= floor)

    hit = next((i for i in range(len(ws)) if all(good(w) for w in ws[i : i + 3])), None)
    settled = hit + 1.0 if hit is not None else None
    late = [w for w in ws if w["start_s"] >= step["start_s"] + skip_s]
    since = step["start_s"] + (settled if settled is not None else skip_s)
    minutes = (step["end_s"] - since) / 60
    return {
        "settled_s": settled,
        "late_windows": len(late),
        "late_in_slo": sum(w["p99_ms"] <= slo for w in late),
        "late_rps": float(np.mean([w["requests_per_s"] for w in late])) if late else math.nan,
        "late_median_p99_ms": float(np.median([w["p99_ms"] for w in late])) if late else math.nan,
        "changes_per_min": param_changes(polls, since, step["end_s"]) / minutes if minutes > 0 else math.nan,
    }


def step_rows(model: str, kind: str, run: dict[str, Any], slo: float, skip_s: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for step in run["steps"]:
        x, target = step_stats(kind, step, run["polls"], slo, skip_s), step["target_rps"]
        rows.append(
            [
                model,
                kind,
                f"{step['level']:.0f} clients" if kind == "closed" else f"{step['level']:.0f} /s",
                f"{step['start_s']:.0f}-{step['end_s']:.0f}",
                f"{target:.0f} ({step['target_source']})" if target else step["target_source"],
                "never" if x["settled_s"] is None else f"{x['settled_s']:.0f} s",
                f"{x['late_in_slo']}/{x['late_windows']} = {x['late_in_slo'] / max(1, x['late_windows']):.0%}",
                f"{x['late_rps']:.0f}" + (f" = {x['late_rps'] / target:.0%}" if target else ""),
                fmt_ms(x["late_median_p99_ms"]),
                f"{x['changes_per_min']:.1f}",
            ]
        )
    return rows


def steps_caps(st: dict[str, Any]) -> str:
    """The steps phase's capacities and its open schedules' client lateness, for the section's text."""
    parts = []
    for m in (m for m in MODELS if m in st and st[m].get("capacity")):
        cap = st[m]["capacity"]
        basis = cap.get("basis", "closed loop (an older run)")
        lag = f", client lag p99 {lag_text(st[m]['open']['lag_p99_ms'])} ms" if "open" in st[m] else ""
        parts.append(f"{m} {cap['rps']:.0f} req/s, {basis}{lag}")
    return "; ".join(parts) or "none"


def steps_section(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    st = results.get("steps", {})
    if not st:
        return [], []
    rows, verdicts = [], []
    cfg = next(st[m] for m in MODELS if m in st)["config"]  # the one `differing` names
    for m in (m for m in MODELS if m in st):
        for kind in ("closed", "open"):
            if kind in st[m]:
                run, slo = st[m][kind], st[m]["slo_ms"]
                rows += step_rows(m, kind, run, slo, cfg["skip_s"])
                stats = [step_stats(kind, step, run["polls"], slo, cfg["skip_s"]) for step in run["steps"]]
                worst = min(x["late_in_slo"] / max(1, x["late_windows"]) for x in stats)
                settled = ", ".join("never" if x["settled_s"] is None else f"{x['settled_s']:.0f} s" for x in stats)
                verdicts.append(
                    f"- steps, {m} {kind} loop: worst step within the SLO in {worst:.0%} of its 1-s windows after "
                    f"{cfg['skip_s']:g} s; time to SLO & >= 95% per step: {settled}; changes/min once settled: "
                    + ", ".join(f"{x['changes_per_min']:.1f}" for x in stats)
                )
    return [
        "## 4. Load steps (autotuned, one fresh server per schedule)",
        f"Closed loop {' -> '.join(map(str, cfg['step_clients']))} clients and open loop r -> 3r -> r with r = "
        f"{cfg['step_rate']:g} x the open-loop capacity ({steps_caps(st)}), {cfg['step_s']:g} s per step; asyncio client "
        f"({cfg['client_encoding']} bodies). Target = the levels oracle's setting at the step's connections served "
        "statically through the same steps by the same asyncio client, over the same windows (closed; wrk's figure "
        "beside it: wrk costs less per request), or the offered rate (open). Time to target = end "
        "of the first 1-s window of the first 3 in a row with p99 <= SLO and >= 95% of the target (open loop: of "
        "that window's own arrivals, which Poisson noise moves by several %), from the step's start. SLO "
        f"attainment and req/s over the windows after the step's first {cfg['skip_s']:g} s. Changes/min = "
        "parameter changes seen by polling /batching every 0.5 s, from the time to target on (from "
        f"{cfg['skip_s']:g} s when never reached)."
        + differing(st, "step_clients step_rate step_s skip_s client_encoding"),
        table(
            [
                "model",
                "loop",
                "level",
                "span s",
                "target req/s",
                "time to SLO & >= 95%",
                f"windows p99 <= SLO after {cfg['skip_s']:g} s",
                "req/s after that",
                "median p99 ms",
                "changes/min settled",
            ],
            rows,
        ),
        "![parameters and p99 over time](autotune-steps.png)",
    ], verdicts


def two_section(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    two = results.get("two")
    if not two:
        return [], []
    rows, verdicts = [], []
    for m in MODELS:
        for mode in ("autotuned", "static"):
            r = two[mode][m]
            rows.append(
                [
                    m,
                    mode,
                    r["setting"] + (f" ({two['static_source'][m]})" if mode == "static" else " (final)"),
                    f"{r['mean_batch']:.1f}" if "mean_batch" in r else "-",
                    f"{r['rps']:.0f}",
                    fmt_ms(r["p99_ms"]),
                    f"{r['windows_in_slo']}/{r['windows']} = {r['windows_in_slo'] / max(1, r['windows']):.0%}",
                    sum(r["errors_by_status"].values()),
                ]
            )
        a, s = two["autotuned"][m], two["static"][m]
        verdicts.append(
            f"- two models, {m}: autotuned {a['rps']:.0f} req/s ({a['rps'] / max(s['rps'], 1e-9):.2f}x the static "
            f"pair's), windows within {two['slo_ms'][m]:g} ms {a['windows_in_slo']}/{a['windows']} vs "
            f"{s['windows_in_slo']}/{s['windows']}"
        )
    cfg = two["config"]
    sweep = two.get("sweep", [])
    pair_rows = [
        [
            *(
                f"{r[m]['setting'][0]} / {r[m]['setting'][1]} ms: {r[m]['rps']:.0f} req/s, p99 {fmt_ms(r[m]['p99_ms'])}"
                for m in MODELS
            ),
            f"{r['held']:.0%}",
        ]
        for r in sweep
    ]
    if sweep:
        verdicts.append(
            f"- two models: {sum(r['held'] == 1.0 for r in sweep)} of {len(sweep)} static pairs swept held both SLOs in "
            f"every window (the best held both in {sweep[0]['held']:.0%})"
        )
    swept = (
        [
            f"The static pairs swept ({cfg['two_sweep_s']:g} s each after {cfg['static_warm_s']} s, one server, best "
            "first: the share of windows within the SLO of the model that held it least, then req/s):",
            table([*MODELS, "both within the SLO"], pair_rows),
        ]
        if sweep
        else []
    )
    return [
        "## 5. Two models in one server (one core), both loaded at once",
        f"Each model driven by its own {two['clients']} closed-loop clients (asyncio, {cfg['client_encoding']} "
        f"bodies, one client process) at the same time; {cfg['two_s']:g} s measured after {cfg['settle_s']} s "
        f"(autotuned) or {cfg['static_warm_s']} s (static). SLO attainment = the share of 1-s windows whose p99 is "
        "within the model's SLO.",
        table(["model", "mode", "setting", "mean batch", "req/s", "p99 ms", "windows within SLO", "errors"], rows),
        *swept,
    ], verdicts


def single_section(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    sg = results.get("single", {})
    if not sg:
        return [], []
    rows, verdicts = [], []
    for m in (m for m in MODELS if m in sg):
        a, b = sg[m]["autotune"], sg[m]["no batching"]
        limit = 1.1 * b["mean_ms"] + 1.0
        rows.append(
            [
                m,
                a["mean_ms"],
                a["p50_ms"],
                a["p99_ms"],
                f"{a['params'][0]} / {a['params'][1] / 1e3:g} ms",
                b["mean_ms"],
                b["p50_ms"],
                b["p99_ms"],
                limit,
            ]
        )
        verdicts.append(
            f"- one client, {m}: mean {a['mean_ms']:.2f} ms with autotune vs {b['mean_ms']:.2f} ms without batching "
            f"(target <= {limit:.2f} ms: {'met' if a['mean_ms'] <= limit else 'NOT met'})"
        )
    cfg = next(sg[m] for m in MODELS if m in sg)["config"]  # the one `differing` names
    return [
        f"## 6. One client alone ({cfg['single_s']:g} s after {min(3, cfg['settle_s'])} s of warm-up)",
        f"A closed-loop asyncio client ({cfg['client_encoding']} bodies), one request at a time."
        + differing(sg, "single_s settle_s client_encoding"),
        table(
            [
                "model",
                "autotune mean ms",
                "p50",
                "p99",
                "final setting",
                "no batching mean ms",
                "p50",
                "p99",
                "limit (1.1x + 1 ms)",
            ],
            rows,
        ),
    ], verdicts


SECTIONS = {
    "levels": levels_section,
    "open": open_section,
    "steps": steps_section,
    "two": two_section,
    "single": single_section,
}


def report(results: dict[str, Any], out: Path) -> str:
    machine_line = f"{machine()}, torch {torch.__version__}"
    runs = "\n".join(
        f"- {r['when']}: `{r['command']}` (phases {', '.join(r['phases']) or 'none'}); 1-minute load average "
        f"before {r['load_before']}, after {r.get('load_after', '?')}; "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in r.get("phase_s", {}).items())
        for r in results.get("_runs", [])
    )
    body, verdicts = [], []
    for name, section in SECTIONS.items():
        text, v = section(results)
        body += text
        verdicts += v
        if name == "open" and text:
            body += [
                "## 3. Soak",
                "`bench/soak.py` (not run here): 10 minutes open loop at 85% of the open-loop capacity (the static "
                "demo setting's, found as in table 2 and confirmed over a 60-s window), reporting errors, refusals, "
                "p99 vs the SLO, the client's lateness and the server's RSS over time: "
                "`.venv/bin/python bench/soak.py --model resnet-mini --duration 600 --load 0.85 --capacity-window 60`",
            ]
    page = "\n\n".join(
        [
            "# Autotuner benchmark",
            f"Machine: {machine_line}. Server pinned to core {SERVER_CPU} (`taskset`, torch 1 thread), the load "
            f"generator (wrk, or this script's asyncio clients) on core {CLIENT_CPU}, as in the peers benchmark. "
            "Every server phase held /tmp/batchpilot-bench.lock; other work on the machine that does not take the "
            "lock still shares the 2 cores, so compare the load averages. Runs that produced these results:\n" + runs,
            *body,
            "## Targets",
            "\n".join(verdicts) or "-",
            *(["## Notes", "\n".join(f"- {n}" for n in results["_notes"])] if results.get("_notes") else []),
        ]
    )
    plot_levels(results, out / "autotune-levels.png")
    plot_steps(results, out / "autotune-steps.png")
    (out / "autotune.md").write_text(page + "\n")
    return page


def plot_levels(results: dict[str, Any], path: Path) -> None:
    lv_all = results.get("levels", {})
    if not lv_all:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    models = [m for m in MODELS if m in lv_all]
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 7), squeeze=False, sharex="col")
    for col, m in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        slo = lv_all[m]["slo_ms"]
        for i, (enc, e) in enumerate(lv_all[m]["encodings"].items()):
            xs, ratio, p99_o, p99_t, paired = [], [], [], [], []
            for c, level in sorted(e["levels"].items(), key=lambda kv: int(kv[0])):
                best, tuned = oracle(level, slo), tuned_summary(level)
                if best and tuned:
                    xs.append(int(c))
                    ratio.append(tuned["rps"] / best["rps"] if best["rps"] else math.nan)
                    p99_o.append(best["p99_ms"])
                    p99_t.append(tuned["p99_ms"])
                    paired.append(pair_ratios(level) or [math.nan])
            color = f"C{i}"
            top.plot(xs, ratio, "o-", color=color, label=f"{enc} bodies, / the oracle")
            if any(not math.isnan(x) for p in paired for x in p):
                mid = [float(np.mean(p)) for p in paired]
                spread = [
                    [x - min(p) for x, p in zip(mid, paired, strict=True)],
                    [max(p) - x for x, p in zip(mid, paired, strict=True)],
                ]
                top.errorbar(
                    xs,
                    mid,
                    yerr=spread,
                    fmt="^--",
                    color=color,
                    alpha=0.6,
                    capsize=3,
                    label=f"{enc} bodies, / its setting in the fresh servers beside each run (mean, range)",
                )
            bottom.plot(xs, p99_t, "o-", color=color, label=f"autotuned, {enc}")
            bottom.plot(xs, p99_o, "s--", color=color, alpha=0.6, label=f"oracle (worse of 2 runs), {enc}")
        top.axhline(1.0, color="grey", linestyle=":")
        top.axhline(0.95, color="red", linestyle=":", label="0.95x")
        top.set(title=f"{m}: autotuned throughput / static", ylabel="ratio")
        bottom.axhline(slo, color="red", linestyle=":", label=f"SLO {slo:g} ms")
        bottom.set(yscale="log", xlabel="closed-loop connections (wrk)", ylabel="p99 ms")
        bottom.set_xscale("log", base=2)
        bottom.yaxis.set_major_formatter(ScalarFormatter())
        bottom.yaxis.set_minor_formatter(ScalarFormatter())
        levels = sorted({int(c) for e in lv_all[m]["encodings"].values() for c in e["levels"]})
        bottom.set_xticks(levels, [str(c) for c in levels])
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_steps(results: dict[str, Any], path: Path) -> None:
    st = results.get("steps", {})
    runs = [(m, kind, st[m]) for m in MODELS if m in st for kind in ("closed", "open") if kind in st[m]]
    if not runs:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(2, len(runs), figsize=(5.5 * len(runs), 6.5), sharex="col", squeeze=False)
    for col, (m, kind, r) in enumerate(runs):
        run, slo = r[kind], r["slo_ms"]
        top, bottom = axes[0][col], axes[1][col]
        t = [w["start_s"] + 0.5 for w in run["windows"]]
        top.plot(t, [w["p99_ms"] for w in run["windows"]], "r.-", label="p99 per 1-s window")
        top.axhline(slo, color="r", linestyle=":", label=f"SLO {slo:g} ms")
        top.set(yscale="log", ylabel="p99 ms", title=f"{m}: {kind} loop steps")
        top.yaxis.set_major_formatter(ScalarFormatter())
        top.yaxis.set_minor_formatter(ScalarFormatter())
        rate = top.twinx()
        rate.plot(t, [w["requests_per_s"] for w in run["windows"]], "b-", alpha=0.6, label="req/s")
        for step in run["steps"]:
            if step["target_rps"]:
                rate.hlines(
                    0.95 * step["target_rps"], step["start_s"], step["end_s"], colors="b", linestyles=":", linewidth=1
                )
        rate.set_ylabel("req/s (dotted: 95% of the target)")
        top.legend(loc="upper left", fontsize=7)
        rate.legend(loc="upper right", fontsize=7)
        pt = [p["t_s"] for p in run["polls"]]
        bottom.step(pt, [p["max_batch_size"] for p in run["polls"]], "g-", where="post", label="max_batch_size")
        bottom.set_ylabel("max batch size")
        bottom.set_yscale("log", base=2)
        delay = bottom.twinx()
        delay.step(pt, [p["delay_ms"] for p in run["polls"]], "m-", where="post", label="max queue delay ms")
        delay.set_ylabel("delay ms")
        for step in run["steps"]:
            bottom.axvline(step["start_s"], color="grey", linestyle="--", linewidth=0.8)
            unit = "clients" if kind == "closed" else "/s"
            bottom.annotate(f"{step['level']:.0f} {unit}", (step["start_s"], 1), fontsize=7)
        bottom.set_xlabel("seconds since start")
        bottom.legend(loc="upper left", fontsize=7)
        delay.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the plan (how long a run takes) and main -------------------------------------------------------------
SERVER_START_S = 6.0  # a fresh one-model server: python + torch import, load, warm-up, and its stop
GRID_MODEL_START_S = 0.5  # per model of a grid server
WRK_OVERHEAD_S = 0.3  # per wrk run: process start, connections


def plan_seconds(cfg: Config, phases: list[str]) -> dict[str, float]:
    """An estimate of each phase's wall time from the settings (no lock waits)."""
    n_models = len(cfg.models)
    plan: dict[str, float] = {}
    if "levels" in phases:
        settings = sum(len(level_settings(c, cfg.delays_ms)) for c in cfg.levels)
        grid = len({s for c in cfg.levels for s in level_settings(c, cfg.delays_ms)})
        runs = len(cfg.encodings) * (settings + cfg.top * len(cfg.levels))
        tuned = len(cfg.encodings) * len(cfg.levels) * cfg.tuned_runs
        fresh = len(cfg.encodings) * len(cfg.levels) * (cfg.tuned_runs + 1)
        plan["levels"] = n_models * (
            SERVER_START_S
            + grid * (GRID_MODEL_START_S + (cfg.grid_warmup_s + WRK_OVERHEAD_S if cfg.grid_warmup_s else 0))
            + runs * (cfg.static_s + WRK_OVERHEAD_S)
            + tuned * (SERVER_START_S + cfg.tuned_s + 2 * WRK_OVERHEAD_S)
            + fresh * (SERVER_START_S + cfg.static_warm_s + cfg.tuned_s - cfg.settle_s + 2 * WRK_OVERHEAD_S)
        )
    search = min(cfg.cap_budget_s, cfg.cap_probes * (cfg.cap_warmup_s + cfg.cap_window_s + 0.5))  # at most
    search += cfg.cap_confirm_tries * (cfg.cap_warmup_s + cfg.cap_confirm_s + 0.5) if cfg.cap_confirm_s else 0.0
    if "open" in phases:
        k = len(cfg.open_loads)
        runs = cfg.open_runs
        plan["open"] = n_models * (
            (k + 1) * runs * SERVER_START_S + search + runs * k * (cfg.static_warm_s + cfg.settle_s + 2 * cfg.open_s)
        )
    if "steps" in phases:
        own_search = 0.0 if "open" in phases else SERVER_START_S + search
        schedule = SERVER_START_S + len(cfg.step_clients) * cfg.step_s
        # the closed and open schedules, and the closed one run statically for each level's target
        plan["steps"] = n_models * (own_search + (2 + len(set(cfg.step_clients))) * schedule)
    if "two" in phases:
        pairs = (len(parse_settings(cfg.two_settings)) + 2) ** 2  # at most: the demo's and the oracle's settings added
        sweep = SERVER_START_S + pairs * (cfg.static_warm_s + cfg.two_sweep_s + 1)
        plan["two"] = sweep + 2 * (SERVER_START_S + 4) + cfg.settle_s + cfg.static_warm_s + 2 * cfg.two_s
    if "single" in phases:
        plan["single"] = n_models * 2 * (SERVER_START_S + min(3, cfg.settle_s) + cfg.single_s)
    return plan


def parse_list(text: str, kind: type) -> list[Any]:
    return [kind(x) for x in text.split(",") if x.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shrink everything to prove the script works (~3-4 min)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    parser.add_argument(
        "--plan", action="store_true", help="print the settings and the estimated wall time, run nothing"
    )
    parser.add_argument("--slo", action="append", default=[], metavar="MODEL=MS", help="p99 SLO (default: the spec's)")
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="MODEL=RPS[,MODEL=RPS]",
        help="open-loop capacity (req/s) for the open and steps phases: skips the search (and, without levels "
        "results, the closed-loop measurement: the static setting is then the demo's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench", help="results folder (default docs/bench)")
    parser.add_argument("--note", action="append", default=[], help="a line for the page's notes (kept)")
    parser.add_argument(
        "--logs",
        type=Path,
        default=Path(tempfile.gettempdir()) / "batchpilot-autotune-logs",
        help="server logs (the autotune event lines) are kept here",
    )
    lists = {"models": str, "encodings": str, "levels": int, "delays_ms": int, "open_loads": float, "step_clients": int}
    for f in fields(Config):
        default = getattr(FULL, f.name)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=str if f.name in lists else type(default),
            default=None,
            help=f"default {shown} (--quick: {getattr(QUICK, f.name)})".replace("%", "%%"),
        )
    args = parser.parse_args()
    try:
        capacities = {
            m.strip(): float(v) for item in args.capacity for m, v in (x.split("=") for x in item.split(",") if x)
        }
    except ValueError:
        parser.error(f"--capacity wants MODEL=RPS[,MODEL=RPS]: {args.capacity}")
    if bad := set(capacities) - set(MODELS):
        parser.error(f"--capacity: unknown models {sorted(bad)}")
    given: dict[str, Any] = {
        f.name: parse_list(v, lists[f.name]) if f.name in lists else v
        for f in fields(Config)
        if (v := getattr(args, f.name)) is not None
    }
    cfg = replace(QUICK if args.quick else FULL, **given)
    phases = [p for p in args.phases.split(",") if p]
    if unknown := set(phases) - set(PHASES) or set(cfg.models) - set(MODELS) or set(cfg.encodings) - set(ENCODINGS):
        parser.error(f"unknown {sorted(unknown)}: phases {PHASES}, models {MODELS}, encodings {ENCODINGS}")
    if cfg.tuned_runs < 1:  # (the levels phase indexes each level's first autotuned run)
        parser.error(f"--tuned-runs must be 1 or more, not {cfg.tuned_runs}")
    plan = plan_seconds(cfg, phases)
    print(f"settings: {asdict(cfg)}")
    print(
        "planned wall time (no lock waits): "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in plan.items())
        + f"; total {sum(plan.values()) / 60:.0f} min",
        flush=True,
    )
    if args.plan:
        return 0

    specs = {name: spec for name, (spec, _) in build_demo_modules().items()}
    slos = {m: specs[m].autotune.latency_slo_p99_ms for m in MODELS} | {
        m: float(v) for m, v in (s.split("=") for s in args.slo)
    }
    args.out.mkdir(parents=True, exist_ok=True)
    args.logs.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "autotune.json"
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    if results and results.get("_format") != FORMAT:
        print(f"{results_path} holds an older layout (keyed by model): starting afresh (git keeps the old one)")
        results = {}
    results["_format"] = FORMAT
    results.setdefault("_notes", []).extend(args.note)
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    run: dict[str, Any] = {}
    if phases:
        run = {
            "command": shlex.join([".venv/bin/python", "bench/autotune_bench.py", *sys.argv[1:]]),
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "phases": phases,
            "config": cfg.dump(),
            "slo_ms": slos,
            "load_before": [round(x, 2) for x in os.getloadavg()],
            "planned_s": plan,
            "phase_s": {},
        }
        results.setdefault("_runs", []).append(run)

    def save() -> None:
        run["load_after"] = [round(x, 2) for x in os.getloadavg()]
        results_path.write_text(json.dumps(results, indent=1))

    with tempfile.TemporaryDirectory(prefix="bp-autotune-") as tmp_name:
        work = Path(tmp_name)
        repo = work / "models"
        if phases:
            write_demo_repository(repo)
        for phase in (p for p in PHASES if p in phases):
            started = time.monotonic()
            targets = ["both"] if phase == "two" else cfg.models
            for model in targets:
                with bench_lock() as waited:  # one lock hold per phase and model
                    print(f"== {phase} {model}: waited {waited:.0f} s for {BENCH_LOCK}", flush=True)
                    run_phase(phase, model, results, repo, work, args.logs, specs, slos, cfg, capacities)
                save()  # a partial run keeps what it measured
            run["phase_s"][phase] = round(time.monotonic() - started)
            save()
            text, verdicts = SECTIONS[phase](results)
            print("\n" + "\n\n".join([*text, "\n".join(verdicts)]) + "\n", flush=True)
    if not phases:
        results_path.write_text(json.dumps(results, indent=1))  # keeps --note
    page = report(results, args.out)
    print(f"wrote {args.out / 'autotune.md'}, {results_path}, autotune-levels.png, autotune-steps.png")
    if not phases:
        print("\n" + page)
    return 0


def run_phase(
    phase: str,
    model: str,
    results: dict[str, Any],
    repo: Path,
    work: Path,
    logs: Path,
    specs: dict[str, ModelSpec],
    slos: dict[str, float],
    cfg: Config,
    capacities: dict[str, float],
) -> None:
    tmp = work / "wrk"
    tmp.mkdir(exist_ok=True)
    if phase == "two":
        results["two"] = two_phase(repo, work, logs, specs, slos, cfg, results)
        return
    spec, slo, into = specs[model], slos[model], results.setdefault(phase, {})
    if phase == "levels":
        into[model] = levels_phase(repo, work, logs, spec, slo, cfg, tmp)
    elif phase == "single":
        into[model] = single_phase(repo, work, spec, slo, cfg)
    else:
        given = capacities.get(model)
        closed = closed_basis(results, repo, work, spec, slo, cfg, tmp, given is not None)
        if phase == "open":
            into[model] = open_phase(repo, work, logs, spec, slo, cfg, closed, given)
        else:
            cap = steps_capacity(repo, work, spec, slo, cfg, closed, given)
            into[model] = steps_phase(repo, work, logs, spec, slo, cfg, results, cap)


if __name__ == "__main__":
    sys.exit(main())
