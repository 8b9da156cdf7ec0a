"""Running NVIDIA perf_analyzer (installed by tools/install-perf-analyzer.sh) and reading its CSV report.

perf_analyzer 2.41 stops at the first failed request and exits non-zero ("Thread [0] had error"),
and its CSV has no error column: a report returned by `run_perf_analyzer` therefore means that every
request of the run succeeded. Its latency columns are in microseconds.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

#: One load level of a report: numeric cells as int or float, anything else (e.g. per-GPU metrics) as text.
Row = dict[str, Any]

_REPO_BINARY = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "perf_analyzer"

# perf_analyzer's CSV headers for the figures callers use most, under short stable keys; any other
# column keeps its header in snake_case (e.g. "Server Queue" -> "server_queue").
_KNOWN_COLUMNS = {
    "Concurrency": "concurrency",
    "Request Rate": "request_rate",
    "Inferences/Second": "infer_per_s",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
}


_UNSTABLE = "Failed to obtain stable measurement"


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer failed, timed out or wrote no report; the message carries its output's tail."""


def find_perf_analyzer() -> Path | None:
    """$PERF_ANALYZER, else the repository's .tools/bin/perf_analyzer, else one on PATH."""
    candidates = [os.environ.get("PERF_ANALYZER"), str(_REPO_BINARY), shutil.which("perf_analyzer")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def perf_analyzer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run perf_analyzer in: libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel
    on LD_LIBRARY_PATH (the binary links it even on the CPU). Unchanged if the wheel is absent."""
    env = dict(os.environ if base is None else base)
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is None or not spec.submodule_search_locations:
        return env
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if lib_dir.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib_dir), env.get("LD_LIBRARY_PATH")]))
    return env


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _column_key(header: str) -> str:
    return _KNOWN_COLUMNS.get(header) or re.sub(r"[^a-z0-9]+", "_", header.lower()).strip("_")


def parse_csv_report(text: str) -> list[Row]:
    """One dict per load level from perf_analyzer's `-f` CSV.

    Only the first block is read: further blocks, separated by a blank line, describe the composing
    models of an ensemble. perf_analyzer orders rows by throughput; they come back ordered by load level.
    """
    block = text.strip().split("\n\n", 1)[0]
    rows = [
        {_column_key(header.strip()): _number(value.strip()) for header, value in row.items()}
        for row in csv.DictReader(io.StringIO(block))
    ]
    level = next((key for key in ("concurrency", "request_rate") if rows and key in rows[0]), None)
    return sorted(rows, key=lambda row: row[level]) if level else rows


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: Literal["http", "grpc"] = "http",
    concurrency_range: str | Sequence[int] = "1:8:2",
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
    require_stable: bool = True,
) -> list[Row]:
    """Run a concurrency sweep (`start:end:step`, or a sequence of those numbers) and return its rows.

    `url` is host:port without a scheme (perf_analyzer's `-u`). Raises PerfAnalyzerError when the binary
    is missing, exits non-zero (any failed request does that), times out, writes no report or (unless
    `require_stable` is false: then the level is left out of the rows) cannot stabilize a load level.
    """
    binary = find_perf_analyzer()
    if binary is None:
        raise PerfAnalyzerError("perf_analyzer not found: run tools/install-perf-analyzer.sh")
    if not isinstance(concurrency_range, str):
        concurrency_range = ":".join(str(n) for n in concurrency_range)
    with tempfile.TemporaryDirectory(prefix="perfa-") as tmp:
        report = Path(tmp) / "report.csv"
        command = [
            str(binary),
            "-m",
            model,
            "-u",
            url,
            "-i",
            protocol,
            "--concurrency-range",
            concurrency_range,
            "-f",
            str(report),
            *extra_args,
        ]
        try:
            done = subprocess.run(
                command, env=perf_analyzer_env(), cwd=tmp, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
            raise PerfAnalyzerError(f"perf_analyzer timed out after {timeout}s:\n{output[-2000:]}") from exc
        output = (done.stdout + done.stderr)[-4000:]
        if done.returncode != 0:
            raise PerfAnalyzerError(f"perf_analyzer exited {done.returncode}: {' '.join(command)}\n{output}")
        if not report.exists():
            raise PerfAnalyzerError(f"perf_analyzer wrote no report:\n{output}")
        # A level that never stabilizes is left out of the report while the exit status stays 0;
        # a sweep with silent holes would mislead, so fail (-s / -p in extra_args loosen it).
        if require_stable and _UNSTABLE in done.stdout + done.stderr:
            raise PerfAnalyzerError(f"perf_analyzer could not stabilize a load level:\n{output}")
        return parse_csv_report(report.read_text())
