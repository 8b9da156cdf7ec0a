"""Freed heap memory goes back to the OS: the trimmer itself, and a served model fed many input shapes; and between
trims a batch's freed memory stays for the next batch.

Each new textcls length builds oneDNN kernels whose short-lived buffers glibc would otherwise keep; the
served test feeds the same 240 new shapes to a server that trims every half second and to one that never
trims, and compares what their RSS grew by. The last test counts a served model's page faults a batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from batchpilot.runtime.demo_models import image_spec
from batchpilot.runtime.heap import (
    KERNEL_CACHE_ENV,
    ONEDNN_KERNEL_CACHE,
    heap_trimmer,
    keep_freed_blocks,
    resident_bytes,
)
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.loadgen import run_load
from batchpilot.testing.requests import demo_requests
from test_connection_limits import metric
from test_hardening_server import http_post, server_process

MIB = 1 << 20
INFER = "/v2/models/textcls/infer"
glibc_only = pytest.mark.skipif(heap_trimmer() is None, reason="malloc_trim is glibc's")


def test_resident_bytes_reads_this_process() -> None:
    assert 10 * MIB < resident_bytes() < 64 * 1024 * MIB


@glibc_only
def test_the_trimmer_gives_back_freed_memory_that_small_survivors_pin() -> None:
    # In a child: large blocks from the heap (no mmap), each followed by a small block that stays; freeing the
    # large ones leaves holes glibc keeps until trimmed.
    script = textwrap.dedent(
        """
        import ctypes, json
        from batchpilot.runtime.heap import heap_trimmer, resident_bytes
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: large blocks come from the heap
        big, small = [], []
        for _ in range(200):
            p = libc.malloc(1 << 20)
            ctypes.memset(p, 1, 1 << 20)  # touch every page
            big.append(p)
            small.append(libc.malloc(64))
        before = resident_bytes()
        for p in big:
            libc.free(p)
        freed = resident_bytes()
        released = heap_trimmer()()
        print(json.dumps({"before": before, "freed": freed, "released": released, "after": resident_bytes()}))
        """
    )
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout)
    assert out["before"] - out["freed"] < 20 * MIB  # free() alone gave almost nothing back
    assert out["released"] > 150 * MIB  # the trim gave back most of the 200 MiB
    assert out["after"] < out["freed"] - 150 * MIB


def kernel_cache_misses(log: str) -> int:
    """oneDNN kernels built anew (ONEDNN_VERBOSE=all logs each build as a cache miss or hit)."""
    return log.count("create:cache_miss")


@pytest.mark.parametrize(
    ("given", "environment", "in_force"),
    [(None, None, ONEDNN_KERNEL_CACHE), (None, "8", 8), (1, "8", 1)],
)
def test_the_kernel_cache_bound_is_what_onednn_keeps(given: int | None, environment: str | None, in_force: int) -> None:
    # Two GELU shapes in turn: a cache of one builds every call's kernel anew, a larger one builds each shape once.
    script = textwrap.dedent(
        f"""
        from batchpilot.runtime.heap import cap_kernel_cache
        print("in force", cap_kernel_cache({given}))
        import torch
        for n in (3, 5, 3, 5, 3, 5):
            torch.nn.functional.gelu(torch.randn(n, 64, 128))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != KERNEL_CACHE_ENV} | {"ONEDNN_VERBOSE": "all"}
    if environment is not None:
        env[KERNEL_CACHE_ENV] = environment
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, text=True, env=env).stdout
    assert f"in force {in_force}" in out
    assert kernel_cache_misses(out) == (6 if in_force == 1 else 2)


@pytest.mark.parametrize(("given", "environment"), [(-1, None), (None, "lots"), (None, "-5")])
def test_a_bad_kernel_cache_bound_stops_serve_with_a_clear_error(
    given: int | None,
    environment: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from batchpilot.cli import main

    monkeypatch.delenv(KERNEL_CACHE_ENV, raising=False)
    if environment is not None:
        monkeypatch.setenv(KERNEL_CACHE_ENV, environment)
    flag = [] if given is None else ["--kernel-cache", str(given)]
    assert main(["serve", "--model-repository", str(tmp_path), *flag]) == 2
    assert "kernel cache's bound" in capsys.readouterr().err
    assert os.environ.get(KERNEL_CACHE_ENV) == environment  # nothing set on the way out


def test_serve_bounds_the_kernel_cache_before_the_models_run(demo_repository: Path, tmp_path: Path) -> None:
    """The same request three times: with the default bound every kernel of the second and third is a cache hit;
    `--kernel-cache 1` builds them again on every call, so the flag reached oneDNN before the model ran."""
    misses = {}
    for bound in ("default", "1"):
        log = tmp_path / f"{bound}.log"
        extra = () if bound == "default" else ("--kernel-cache", bound)
        with server_process(demo_repository, log, *extra, env={"ONEDNN_VERBOSE": "all"}) as served:
            assert http_post(served.http, INFER, tokens_doc(20)) == 200
            first = kernel_cache_misses(log.read_text(errors="replace"))
            for _ in range(2):
                assert http_post(served.http, INFER, tokens_doc(20)) == 200
            assert served.stop() == 0
        misses[bound] = (first, kernel_cache_misses(log.read_text(errors="replace")))
    assert misses["default"][0] > 0 and misses["default"][1] == misses["default"][0], misses
    assert misses["1"][1] >= misses["1"][0] + 2, misses


def tokens_doc(length: int) -> dict[str, object]:
    return {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, length], "data": [7] * length}]}


def rss_growth_over_new_shapes(repository: Path, log: Path, interval_s: float) -> tuple[float, float]:
    """(RSS growth in MiB over 240 new lengths, MiB the server says its trims gave back)."""
    with server_process(repository, log, "--heap-trim-interval", str(interval_s)) as served:
        for length in (8, 9, 8, 9):  # warm-up: first calls allocate what every call reuses
            assert http_post(served.http, INFER, tokens_doc(length)) == 200
        time.sleep(2 * interval_s)
        start = served.rss_mib()
        for length in range(16, 256):
            assert http_post(served.http, INFER, tokens_doc(length)) == 200
        time.sleep(3 * interval_s)  # a trim or two after the last one
        growth = served.rss_mib() - start
        released = metric(served.http, "batchpilot_heap_released_bytes") / MIB
        if interval_s > 0:
            assert metric(served.http, "batchpilot_heap_trims") >= 2
        assert served.stop() == 0
    return growth, released


@glibc_only
def test_a_served_model_fed_new_shapes_keeps_its_rss_when_the_heap_is_trimmed(
    demo_repository: Path, tmp_path: Path
) -> None:
    kept, none_released = rss_growth_over_new_shapes(demo_repository, tmp_path / "untrimmed.log", 0)
    trimmed, released = rss_growth_over_new_shapes(demo_repository, tmp_path / "trimmed.log", 0.5)
    assert none_released == 0
    assert released > 20, f"trims gave back {released:.0f} MiB"
    assert kept > 40, f"without trims RSS grew {kept:.0f} MiB: the shapes no longer bloat the heap"
    assert trimmed < kept / 2, f"RSS grew {trimmed:.0f} MiB with trims, {kept:.0f} MiB without"


@pytest.mark.parametrize(
    "environment",
    [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}],
)
def test_a_users_own_malloc_thresholds_are_left_in_force(environment: dict[str, str]) -> None:
    assert keep_freed_blocks(environment) == "user"


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far, every thread's (field 10 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[7])


def faults_per_item(repository: Path, log: Path, env: dict[str, str]) -> float:
    """resnet-mini fixed at batches of up to 32 (a 50-ms window), 32 clients back to back for 3 s after a warm-up:
    the server's minor page faults per answered request."""
    spec = image_spec().model_dump(by_alias=True, mode="json")
    spec["batching"].update(maxBatchSize=32, maxQueueDelayMicroseconds=50_000)
    spec["autotune"]["enabled"] = False
    with server_process(repository, log, env={SPECS_ENV: json.dumps([spec]), **env}) as served:
        requests = demo_requests("resnet-mini", f"127.0.0.1:{served.http}", count=8)
        asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=32, duration_s=1.0))
        before = minor_faults(served.proc.pid)
        result = asyncio.run(run_load("127.0.0.1", served.http, requests, concurrency=32, duration_s=3.0))
        faults = minor_faults(served.proc.pid) - before
        assert served.stop() == 0
    assert result.errors == 0 and result.ok > 100, result.statuses
    return faults / result.ok


@glibc_only
def test_a_served_batch_reuses_the_memory_the_last_one_freed(demo_repository: Path, tmp_path: Path) -> None:
    # Live (one core, 32 clients under 32 / 10 ms) glibc's own thresholds cost 99 faults an item, a batch of 32 took
    # 35 ms instead of 26-29, and 32 / 10 ms served less than 16 / 10 ms. The server sets the thresholds itself; a
    # user's own (here: glibc's initial thresholds, fixed) win.
    kept = faults_per_item(demo_repository, tmp_path / "kept.log", {})
    defaults = "glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072"
    given_back = faults_per_item(demo_repository, tmp_path / "given-back.log", {"GLIBC_TUNABLES": defaults})
    assert kept < 5, f"{kept:.1f} page faults an item with the server's thresholds"
    assert given_back > 4 * max(kept, 5), f"{given_back:.1f} page faults an item with glibc's, {kept:.1f} with ours"
