"""BatchPilot vs its peers: the same TorchScript demo models under the same load, side by side in one run.

Each peer is installed from PyPI into its own virtual environment under `.bench-venvs/<peer>` (torch
pinned to 2.13.0, the CPU build), serves the very model file `batchpilot demo-models` writes, with its
dynamic batching set as its docs recommend (max batch 16, wait 3 ms where a wait can be set), and is
driven by the same `wrk` client: one server core (taskset -c 0), wrk on the other (taskset -c 1), the
same prebuilt POST body, concurrency 1..64. Each system's measurement phases (a server up plus its wrk runs,
one server after the other) hold the machine-wide benchmark lock, so other benchmarks never overlap them.
CPU seconds per 1000 requests come from the server's whole process tree (/proc utime+stime, workers
and reaped children included), read before and after each level.

Usage: .venv/bin/python bench/peers_bench.py [--peers batchpilot,mlserver,kserve,bentoml,ray] [--quick]
Writes docs/bench/peers.md, peers.json, peers-throughput.png and peers-p99.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    CLIENT_CPU,
    ROOT,
    SEQ_LEN,
    SERVER_CPU,
    Workload,
    bench_lock,
    machine,
    pinned,
    process_group,
    process_tree,
    static_specs,
    table,
    tree_cpu_seconds,
    workloads,
    wrk,
)

from batchpilot import __version__ as batchpilot_version
from batchpilot.runtime.demo import batch_counts as model_batch_counts
from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.processes import free_port

CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
QUICK_CONCURRENCY = [1, 8, 32]
SLO_P99_MS = 50.0
MAX_BATCH, MAX_WAIT_MS = 16, 3.0
TORCH_PIN = "torch==2.13.0"  # the CPU build lies in /opt/wheels; anything else pulls a CUDA build
VENVS = ROOT / ".bench-venvs"
PEERS_DIR = ROOT / "bench" / "peers"
LOGS = VENVS / "logs"  # server and pip logs (gitignored with the venvs)
SCRATCH = VENVS / "run"  # the servers' working directory (MLServer writes .metrics/ and .envs/ there)
MODELS = {"resnet-mini": "cv", "textcls": "nlp"}


@dataclass(frozen=True)
class Peer:
    key: str
    label: str
    requirements: tuple[str, ...]
    package: str  # whose version the page reports
    settings: str
    ready_path: str  # "{name}" is the model name
    infer_path: str


PEERS: dict[str, Peer] = {
    p.key: p
    for p in [
        Peer(
            "mlserver",
            "MLServer",
            ("mlserver==1.7.1", "uvloop==0.21.0"),
            "mlserver",
            f"adaptive batching: max_batch_size {MAX_BATCH}, max_batch_time {MAX_WAIT_MS / 1e3} s; default "
            "parallel_workers (1 inference worker process); uvloop pinned to 0.21.0 (0.23 kills the worker)",
            "/v2/models/{name}/ready",
            "/v2/models/{name}/infer",
        ),
        Peer(
            "kserve",
            "stock KServe",
            ("kserve==0.21.0",),
            "kserve",
            "no in-process batching (KServe's batcher is a v1-only sidecar); async predict, one model call per request",
            "/v2/models/{name}/ready",
            "/v2/models/{name}/infer",
        ),
        Peer(
            "bentoml",
            "BentoML",
            ("bentoml==1.4.40",),
            "bentoml",
            f"adaptive batching: batchable API, max_batch_size {MAX_BATCH}, max_latency_ms 1000 (the docs' example; "
            "BentoML picks the wait itself), workers 1",
            "/readyz",
            "/infer",
        ),
        Peer(
            "ray",
            "Ray Serve",
            ("ray[serve]==2.60.0",),
            "ray",
            f"@serve.batch max_batch_size {MAX_BATCH}, batch_wait_timeout_s {MAX_WAIT_MS / 1e3}; "
            f"max_ongoing_requests {2 * MAX_BATCH}; ray.init(num_cpus=1)",
            "/",
            "/",
        ),
    ]
}
SYSTEMS = ["batchpilot", *PEERS]


@dataclass
class Level:
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_s_per_1000: float
    mean_batch: float | None = None


@dataclass
class Row:
    system: str  # as shown in the tables
    model: str
    body: str
    levels: list[Level] = field(default_factory=list)

    def best_within(self, p99_ms: float) -> Level | None:
        ok = [lv for lv in self.levels if lv.p99_ms <= p99_ms and lv.errors == 0]
        return max(ok, key=lambda lv: lv.requests_per_s) if ok else None


@dataclass
class Phase:
    """One server up, measured while this run holds the benchmark lock."""

    system: str
    command: list[str]
    load_before: tuple[float, float, float]
    lock_wait_s: float
    error: str | None = None
    processes: int = 0  # in the server's tree once ready
    cpus: str = ""  # the cores they may run on (taskset is inherited)
    started: str = ""  # when it began (ISO, minutes) and on what machine: a merged page's rows may come from
    machine: str = ""  # several runs; empty in results saved before these were kept


def provenance(phases: list[Phase]) -> str:
    """When and where the phases ran, one clause per machine; phases saved without it count as this run's."""
    now, here = datetime.datetime.now().isoformat(timespec="minutes"), machine()
    runs: dict[str, list[str]] = {}
    for p in phases:
        runs.setdefault(p.machine or here, []).append(p.started or now)
    runs = runs or {here: [now]}
    return "; ".join(
        f"Run {min(at)}" + (f" to {max(at)}" if max(at) != min(at) else "") + f". Machine: {m}"
        for m, at in runs.items()
    )


# -- installs (outside the lock) ------------------------------------------------------------------------------
def venv_python(peer: Peer) -> Path:
    return VENVS / peer.key / "bin" / "python"


def ensure_venv(peer: Peer, log: Path) -> str | None:
    """Create or reuse `.bench-venvs/<peer>`; returns None, or the exact error when pip fails."""
    folder = VENVS / peer.key
    requirements = [TORCH_PIN, *peer.requirements]
    stamp = folder / ".requirements"
    if stamp.exists() and stamp.read_text().split() == requirements:
        return None
    print(f"installing {peer.label}: pip install {' '.join(requirements)} ...", flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    # cwd elsewhere: the repository's `operator/` folder would shadow the standard library's
    steps = [
        [base, "-m", "venv", "--clear", str(folder)],
        [str(venv_python(peer)), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *requirements],
    ]
    for step in steps:
        done = subprocess.run(step, cwd=tempfile.gettempdir(), capture_output=True, text=True)
        log.write_text(done.stdout + done.stderr)
        if done.returncode:
            errors = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln or "Error" in ln]
            return f"`{shlex.join(step)}` failed: " + " / ".join(errors[-3:] or [f"exit {done.returncode}"])
    stamp.write_text("\n".join(requirements) + "\n")
    return None


def versions(python: Path, packages: list[str]) -> dict[str, str]:
    """Installed versions of those `packages` that `python` has."""
    code = (
        "import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    done = subprocess.run(
        [str(python), "-c", code, *packages], cwd=tempfile.gettempdir(), capture_output=True, text=True
    )
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()[-200:]}


# -- servers --------------------------------------------------------------------------------------------------
def batchpilot_specs(autotune: bool) -> str:
    """`BATCHPILOT_MODEL_SPECS`: static 16 / 3 ms with the autotuner off, or the demo specs with it on."""
    if not autotune:
        return static_specs((MAX_BATCH, MAX_WAIT_MS))
    return json.dumps([spec.model_dump(mode="json", by_alias=True) for spec, _ in build_demo_modules().values()])


def batchpilot_command(repo: Path, port: int) -> list[str]:
    return pinned(
        SERVER_CPU,
        [
            sys.executable,
            "-m",
            "batchpilot",
            "--log-level",
            "INFO",  # the autotuner's decisions, one line each, in LOGS/BatchPilot_autotune.log
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            str(port),
            "--grpc-port",
            str(free_port()),
            "--host",
            "127.0.0.1",
            "--torch-threads",
            "1",
        ],
    )


def peer_command(peer: Peer, repo: Path, model: str, port: int) -> list[str]:
    return pinned(
        SERVER_CPU,
        [
            str(venv_python(peer)),
            str(PEERS_DIR / f"{peer.key}_server.py"),
            "--model-path",
            str(repo / model / "model.pt"),
            "--name",
            model,
            "--kind",
            MODELS[model],
            "--port",
            str(port),
            "--grpc-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--max-batch-size",
            str(MAX_BATCH),
            "--max-wait-ms",
            str(MAX_WAIT_MS),
        ],
    )


def allowed_cpus(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "?"
    return next(ln.split(":")[1].strip() for ln in status.splitlines() if ln.startswith("Cpus_allowed_list"))


def sweep(
    url: str,
    work: Workload,
    pid: int,
    levels: list[int],
    duration_s: int,
    tmp: Path,
    batch_counts: Callable[[], tuple[int, int]] | None,
) -> list[Level]:
    wrk(url, work.body, work.headers, connections=8, duration_s=2, workdir=tmp)  # warm-up, not counted
    out = []
    for c in levels:
        counts, cpu = batch_counts() if batch_counts else None, tree_cpu_seconds(pid)
        r = wrk(url, work.body, work.headers, connections=c, duration_s=duration_s, workdir=tmp)
        cpu = tree_cpu_seconds(pid) - cpu
        mean_batch = None
        if batch_counts and counts:
            after = batch_counts()
            mean_batch = (after[0] - counts[0]) / max(1, after[1] - counts[1])
        done = max(1.0, r.requests_per_s * duration_s)
        out.append(Level(c, r.requests_per_s, r.p50_ms, r.p99_ms, r.errors, 1000 * cpu / done, mean_batch))
        print(
            f"    c={c:3d} {r.requests_per_s:8.1f} req/s  p50 {r.p50_ms:7.2f}  p99 {r.p99_ms:7.2f} ms  "
            f"err {r.errors}  cpu {1000 * cpu / done:.2f} s/1000" + (f"  batch {mean_batch:.1f}" if mean_batch else ""),
            flush=True,
        )
    return out


def measure_phase(
    system: str,
    command: list[str],
    ready_url: str,
    runs: list[tuple[str, str, Workload]],
    args: argparse.Namespace,
    tmp: Path,
    batch_counts: Callable[[str], tuple[int, int]] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[Phase, list[Row]]:
    """Start the server, sweep each (label, url, workload) run, stop it (the caller holds the benchmark lock)."""
    rows = []
    with ExitStack() as stack:
        phase = Phase(system, command, os.getloadavg(), 0.0)
        phase.started, phase.machine = datetime.datetime.now().isoformat(timespec="minutes"), machine()
        print(f"== {system}: load {phase.load_before[0]:.2f}", flush=True)
        log = LOGS / f"{system.replace(' ', '_').replace(',', '')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            SCRATCH.mkdir(parents=True, exist_ok=True)
            server: ContextManager = process_group(command, ready_url, env=env, log=log, cwd=SCRATCH)
            proc = stack.enter_context(server)
            tree = process_tree(proc.pid)
            phase.processes, phase.cpus = len(tree), ",".join(sorted(set(map(allowed_cpus, tree))))
        except (RuntimeError, TimeoutError) as exc:
            tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            phase.error = f"{exc}: {tail}"
            print(f"   FAILED: {phase.error}", flush=True)
            return phase, rows
        for label, url, work in runs:
            print(f"  {label} / {work.model} / {work.body_label}", flush=True)
            counter = (lambda m=work.model: batch_counts(m)) if batch_counts else None
            try:
                levels = sweep(url, work, proc.pid, args.levels, args.duration, tmp, counter)
            except (subprocess.SubprocessError, AttributeError, OSError) as exc:  # wrk failed or no answer
                phase.error = f"{label} {work.model}: {type(exc).__name__}: {exc}"
                print(f"   FAILED: {phase.error}", flush=True)
                continue
            rows.append(Row(label, work.model, work.body_label, levels))
    return phase, rows


def batchpilot_phases(repo: Path, args: argparse.Namespace, tmp: Path) -> Iterator[tuple[Phase, list[Row]]]:
    bodies = workloads()
    for autotune in (False, True):
        port = free_port()
        label = "BatchPilot " + ("autotune" if autotune else "static 16/3ms")
        runs = [(label, f"http://127.0.0.1:{port}/v2/models/{w.model}/infer", w) for w in bodies["json"]]
        if not autotune:
            runs += [
                (label + ", binary", f"http://127.0.0.1:{port}/v2/models/{w.model}/infer", w) for w in bodies["binary"]
            ]
        yield measure_phase(
            label,
            batchpilot_command(repo, port),
            f"http://127.0.0.1:{port}/v2/health/ready",
            runs,
            args,
            tmp,
            batch_counts=lambda m, p=port: model_batch_counts(p, m),
            env={SPECS_ENV: batchpilot_specs(autotune)},
        )


def peer_phases(peer: Peer, repo: Path, args: argparse.Namespace, tmp: Path) -> Iterator[tuple[Phase, list[Row]]]:
    label = f"{peer.label} {args.versions.get(peer.key, {}).get(peer.package, '')}".strip()
    for work in workloads()["json"]:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        path = peer.infer_path.format(name=work.model)
        env = {"RAY_USAGE_STATS_ENABLED": "0", "BENTOML_DO_NOT_TRACK": "True", "PYTHONUNBUFFERED": "1"}
        yield measure_phase(
            f"{label} {work.model}",
            peer_command(peer, repo, work.model, port),
            base + peer.ready_path.format(name=work.model),
            [(label, base + path, work)],
            args,
            tmp,
            env=env,
        )


# -- report ---------------------------------------------------------------------------------------------------
def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, xy, xlabel, ylabel in (
        (
            "peers-throughput.png",
            lambda r: ([lv.concurrency for lv in r.levels], [lv.requests_per_s for lv in r.levels]),
            "concurrent connections (wrk)",
            "requests / s",
        ),
        (
            "peers-p99.png",
            lambda r: ([lv.requests_per_s for lv in r.levels], [lv.p99_ms for lv in r.levels]),
            "requests / s",
            "p99 latency, ms (log)",
        ),
    ):
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for ax, model in zip(axes, MODELS, strict=False):
            for row in (r for r in rows if r.model == model):
                x, y = xy(row)
                ax.plot(x, y, "o--" if "binary" in row.system else "o-", label=row.system, markersize=3)
            if name == "peers-throughput.png":
                ax.set_xscale("log", base=2)
            else:
                ax.set_yscale("log")
                ax.axhline(SLO_P99_MS, color="red", linestyle=":", label=f"SLO p99 {SLO_P99_MS:.0f} ms")
            ax.set(title=model, xlabel=xlabel, ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def ratio_lines(rows: list[Row]) -> list[str]:
    lines = []
    for model in MODELS:
        peers = [
            (r, r.best_within(SLO_P99_MS)) for r in rows if r.model == model and not r.system.startswith("BatchPilot")
        ]
        peers = [(r, lv) for r, lv in peers if lv is not None]
        if not peers:
            lines.append(f"- {model}: no peer met the SLO, no ratio")
            continue
        best_row, best = max(peers, key=lambda p: p[1].requests_per_s)
        for ours in (r for r in rows if r.model == model and r.system.startswith("BatchPilot")):
            at_slo, at_peer_p99 = ours.best_within(SLO_P99_MS), ours.best_within(best.p99_ms)
            fmt = lambda lv, ref: (  # noqa: E731
                f"{lv.requests_per_s:,.0f} req/s (p99 {lv.p99_ms:.1f} ms, {lv.concurrency} conns) = "
                f"{lv.requests_per_s / ref:.2f}x"
                if lv
                else "none"
            )
            lines.append(
                f"- {model}, {ours.system}: within the {SLO_P99_MS:.0f} ms SLO {fmt(at_slo, best.requests_per_s)}; "
                f"at p99 <= {best.p99_ms:.1f} ms (the best peer's) {fmt(at_peer_p99, best.requests_per_s)} "
                f"the best peer, {best_row.system} ({best.requests_per_s:,.0f} req/s at {best.concurrency} conns)"
            )
    return lines


def report(
    rows: list[Row], phases: list[Phase], install_errors: dict[str, str], args: argparse.Namespace, command: str
) -> str:
    summary = []
    for model in MODELS:
        for r in (r for r in rows if r.model == model):
            best = r.best_within(SLO_P99_MS)
            top = max(r.levels, key=lambda lv: lv.requests_per_s)
            summary.append(
                [
                    r.system,
                    model,
                    f"{best.requests_per_s:,.0f} @ {best.concurrency}" if best else "none",
                    f"{best.p99_ms:.1f}" if best else "-",
                    f"{best.cpu_s_per_1000:.2f}" if best else "-",
                    f"{top.requests_per_s:,.0f} @ {top.concurrency}",
                    f"{top.p99_ms:.1f}",
                ]
            )
    full = [
        [
            r.system,
            r.model,
            lv.concurrency,
            lv.requests_per_s,
            lv.p50_ms,
            lv.p99_ms,
            lv.errors,
            f"{lv.cpu_s_per_1000:.2f}",
            f"{lv.cpu_s_per_1000 * lv.requests_per_s / 10:.0f}%",
            f"{lv.mean_batch:.1f}" if lv.mean_batch else "-",
        ]
        for r in rows
        for lv in r.levels
    ]
    bodies = sorted({(r.system, r.model, r.body) for r in rows})
    failures = [f"- {name}: install failed: {err}" for name, err in install_errors.items()]
    failures += [f"- {p.system}: {p.error}" for p in phases if p.error]
    settings = [
        f"- BatchPilot {batchpilot_version}: static = `BATCHPILOT_MODEL_SPECS` with autotune off, max batch "
        f"{MAX_BATCH}, max queue delay {MAX_WAIT_MS:.0f} ms; autotune = the demo specs (start 16 / 2 ms, "
        "bounds batch 1..64, delay 0..10 ms, p99 SLO 50 ms); one process, torch 1 thread"
    ]
    present = {system_key(r.system) for r in rows} | {system_key(p.system) for p in phases}
    settings += [f"- {p.label}: {p.settings}" for p in PEERS.values() if p.key in present]
    vers = [f"- {k}: " + ", ".join(f"{n} {v}" for n, v in d.items()) for k, d in args.versions.items()]
    commands = [
        f"- {p.system}: `{shlex.join(p.command)}` ("
        + (f"{p.processes} processes on core(s) {p.cpus}; " if p.processes else "")
        + "load average before: "
        f"{' '.join(f'{x:.2f}' for x in p.load_before)}; waited {p.lock_wait_s:.0f} s for the lock)"
        for p in phases
    ]
    return (
        "\n\n".join(
            [
                "# BatchPilot vs its peers (same models, same load generator)",
                f"{provenance(phases)}. Server pinned to core "
                f"{SERVER_CPU} (`taskset -c {SERVER_CPU}`, its whole process tree; torch 1 thread), `wrk -t1` pinned to core "
                f"{CLIENT_CPU}, {args.duration} s per level after a 2 s warm-up, concurrency {args.levels}. Every phase (a "
                f"server up plus its wrk runs) held `/tmp/batchpilot-bench.lock`; other engineers' unlocked work (tests) may "
                f"still have shared the cores, see the load averages below. One command reproduces every row: "
                f"`.venv/bin/python bench/peers_bench.py`"
                + ("" if command.endswith("peers_bench.py") else f" (this page was assembled by `{command}`)")
                + ".",
                "Throughput is wrk's requests/s; p50/p99 from `wrk --latency`; CPU s / 1000 req is the server process tree's "
                "utime+stime (children and inference workers included) over the level, per 1000 completed requests. "
                f"'best within SLO' = the highest throughput whose p99 <= {SLO_P99_MS:.0f} ms with no errors.",
                "## Ratios (CV is the headline)",
                "\n".join(ratio_lines(rows)),
                "## Summary",
                table(
                    [
                        "system",
                        "model",
                        f"best req/s within p99 {SLO_P99_MS:.0f} ms @ conns",
                        "p99 ms",
                        "CPU s / 1000 req",
                        "peak req/s @ conns",
                        "p99 ms at peak",
                    ],
                    summary,
                ),
                "## Every level",
                "'server core busy' = CPU s / 1000 req x req/s: well below 100% while latency grows means "
                "the server was starved (other work on the machine) or waits on its own window.",
                table(
                    [
                        "system",
                        "model",
                        "conns",
                        "req/s",
                        "p50 ms",
                        "p99 ms",
                        "errors",
                        "CPU s / 1000 req",
                        "server core busy",
                        "mean batch",
                    ],
                    full,
                ),
                "![throughput vs concurrency](peers-throughput.png)",
                "![p99 vs throughput](peers-p99.png)",
                "## Failures",
                "\n".join(failures) or "none",
                *(["## Notes", "\n".join(f"- {n}" for n in args.note)] if args.note else []),
                "## Request bodies (the same prebuilt body every request; wrk POSTs it from a Lua script)",
                "\n".join(f"- {s} / {m}: {b}" for s, m, b in bodies)
                + f"\n- NLP: a fixed {SEQ_LEN}-token sequence, so every "
                "system runs the same [batch, 32] forward (peers pass an all-ones attention mask; BatchPilot builds the same mask).",
                "## Batching settings",
                "\n".join(settings),
                "## Versions (each peer in its own venv under .bench-venvs/)",
                "\n".join(vers),
                "## Exact server commands",
                "\n".join(commands),
                "wrk: `taskset -c 1 wrk -t1 -cN -dDs --latency -s post.lua URL` (post.lua sets method POST, the body file and headers).",
            ]
        )
        + "\n"
    )


def system_key(label: str) -> str:
    """Which entry of SYSTEMS a row or phase label belongs to."""
    if label.startswith("BatchPilot"):
        return "batchpilot"
    return next(p.key for p in PEERS.values() if label.startswith(p.label))


def load_results(
    path: Path, replaced: set[str], install_errors: dict[str, str], versions_now: dict[str, dict[str, str]]
) -> tuple[list[Row], list[Phase], dict[str, str], dict]:
    """An earlier run's rows and phases, minus those of the systems about to be measured again."""
    if not path.exists():
        return [], [], install_errors, versions_now
    doc = json.loads(path.read_text())
    rows = [Row(r["system"], r["model"], r["body"], [Level(**lv) for lv in r["levels"]]) for r in doc["rows"]]
    phases = [Phase(**{**p, "load_before": tuple(p["load_before"])}) for p in doc["phases"]]

    def keep(label: str) -> bool:
        return system_key(label) not in replaced

    errors = {k: v for k, v in doc.get("install_errors", {}).items() if keep(k)} | install_errors
    return (
        [r for r in rows if keep(r.system)],
        [p for p in phases if keep(p.system)],
        errors,
        {**doc.get("versions", {}), **versions_now},
    )


def save(
    path: Path,
    rows: list[Row],
    phases: list[Phase],
    install_errors: dict[str, str],
    args: argparse.Namespace,
    command: str,
) -> None:
    order = {key: i for i, key in enumerate(SYSTEMS)}
    rows.sort(key=lambda r: order[system_key(r.system)])  # stable: measured order within a system
    path.write_text(
        json.dumps(
            {
                "command": command,
                "levels": args.levels,
                "duration": args.duration,
                "rows": [asdict(r) for r in rows],
                "phases": [asdict(p) for p in phases],
                "install_errors": install_errors,
                "versions": args.versions,
                "notes": args.note,
            },
            indent=1,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument("--quick", action="store_true", help=f"concurrency {QUICK_CONCURRENCY}, 4 s per level")
    parser.add_argument("--duration", type=int, help="seconds per level (default 10, --quick 4)")
    parser.add_argument("--install-only", action="store_true")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other systems' rows of an earlier run (OUT/peers.json); replace only --peers",
    )
    parser.add_argument("--report-only", action="store_true", help="re-render the page and plots from OUT/peers.json")
    parser.add_argument("--note", action="append", default=[], help="a caveat for the page (kept in OUT/peers.json)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    args = parser.parse_args()
    args.systems = [s.strip() for s in args.peers.split(",") if s.strip()]
    if unknown := set(args.systems) - set(SYSTEMS):
        parser.error(f"unknown peers {sorted(unknown)}; choose from {SYSTEMS}")
    args.levels = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    args.duration = args.duration or (4 if args.quick else 10)
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join([".venv/bin/python", "bench/peers_bench.py", *sys.argv[1:]])

    install_errors: dict[str, str] = {}
    stack = ["torch", "numpy", "orjson", "uvicorn", "uvloop", "fastapi", "starlette"]
    args.versions = {"batchpilot": versions(Path(sys.executable), ["batchpilot", "kserve", *stack])}
    for key in args.systems:
        if key in PEERS:
            peer = PEERS[key]
            LOGS.mkdir(parents=True, exist_ok=True)
            if error := ensure_venv(peer, LOGS / f"install-{key}.log"):
                install_errors[peer.label] = error
                print(f"  {peer.label}: {error}", flush=True)
            else:
                args.versions[key] = versions(venv_python(peer), [peer.package, *stack])
    if args.install_only:
        print(json.dumps(args.versions, indent=1))
        return 1 if install_errors else 0

    rows: list[Row] = []
    phases: list[Phase] = []
    saved = args.out / "peers.json"
    if args.merge or args.report_only:
        rows, phases, install_errors, args.versions = load_results(
            saved, set() if args.report_only else set(args.systems), install_errors, args.versions
        )
        if saved.exists():
            args.note = json.loads(saved.read_text()).get("notes", []) + args.note
        if args.report_only and saved.exists():
            run = json.loads(saved.read_text())
            command = run.get("command", command)
            args.levels, args.duration = run.get("levels", args.levels), run.get("duration", args.duration)
    if not args.report_only:
        with tempfile.TemporaryDirectory(prefix="bp-peers-") as tmp_name:
            tmp = Path(tmp_name)
            repo = tmp / "models"
            write_demo_repository(repo)  # what `batchpilot demo-models DIR` writes
            for key in args.systems:
                if key == "batchpilot":
                    measured = batchpilot_phases(repo, args, tmp)
                elif PEERS[key].label in install_errors:
                    continue
                else:
                    measured = peer_phases(PEERS[key], repo, args, tmp)
                # One lock hold per system (its servers one after the other), so other benchmarks wait once.
                with bench_lock() as waited:
                    print(f"= {key}: got the benchmark lock after {waited:.0f} s", flush=True)
                    for i, (phase, phase_rows) in enumerate(measured):
                        phase.lock_wait_s = waited if i == 0 else 0.0
                        phases.append(phase)
                        rows += phase_rows
                        save(saved, rows, phases, install_errors, args, command)  # resume with --merge
    if args.report_only:
        save(saved, rows, phases, install_errors, args, command)  # keeps --note
    page = report(rows, phases, install_errors, args, command)
    plot(rows, args.out)
    (args.out / "peers.md").write_text(page)
    print("\n" + page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
