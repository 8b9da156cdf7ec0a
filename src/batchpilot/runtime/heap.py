"""Give freed heap memory back to the operating system now and then (glibc's `malloc_trim`).

Why: variable input shapes (NLP lengths, autotuned batch sizes) make torch's oneDNN kernels be built per
shape, and building one allocates large short-lived buffers. glibc keeps what they freed in the heap, pinned
there by the small objects that stay (the cached kernels), so the server's RSS climbs with every new shape
although little of it is in use. Measured with textcls on one thread: 600 new shapes grew RSS by about
400 MiB of which about 20 MiB was live; one `malloc_trim(0)` gave the rest back in about 30 ms. Lowering the
mmap threshold instead kept RSS flat but cost 50% of the model's speed (every activation mmapped anew).

Between trims, freed blocks stay (`keep_freed_blocks`): left to glibc's own thresholds, the executor thread handed a
batch's activations back to the kernel as the batch ended and faulted them in again in the next one.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping

from batchpilot.runtime.metrics import RuntimeMetrics

log = logging.getLogger("batchpilot.heap")
DEFAULT_INTERVAL_S = 10.0
KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_KERNEL_CACHE = 1024  # oneDNN's own bound on its built kernels (one per input shape), unless told otherwise
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# mallopt's parameters, and what `keep_freed_blocks` sets them to: blocks up to glibc's ceiling for the mmap
# threshold on 64-bit come from the heap, and free() never shrinks it (the periodic trim does).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes a C int: the largest there is
# glibc's settings that fix these (any one stops it adapting the thresholds): a user's own choice of one, as
# `MALLOC_<NAME>_` or `GLIBC_TUNABLES=glibc.malloc.<name>=...`, is left in force by `keep_freed_blocks`.
MALLOC_SETTINGS = ("trim_threshold", "mmap_threshold", "top_pad", "mmap_max")


def resident_bytes() -> int:
    """This process's resident set size (bytes), 0 where /proc is missing."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cap_kernel_cache(capacity: int | None) -> int:
    """Bound oneDNN's cache of built kernels for this process to `capacity` (None: what the environment says, else
    oneDNN's own bound); returns the bound in force. oneDNN reads it when torch builds its first kernel, so this must
    run before any model does. Not lowered by default: with the heap trimmed, a 10-minute textcls soak held RSS as
    flat at oneDNN's 1,024 as at 256 (docs/bench/autotune-history.md, run W), and every evicted shape is built again."""
    raw = str(capacity) if capacity is not None else os.environ.get(KERNEL_CACHE_ENV, str(ONEDNN_KERNEL_CACHE))
    if not raw.strip().isdigit():
        raise ValueError(
            f"the kernel cache's bound (--kernel-cache, ${KERNEL_CACHE_ENV}) must be 0 or more, not {raw!r}"
        )
    if capacity is not None:
        os.environ[KERNEL_CACHE_ENV] = raw
    return int(raw)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def keep_freed_blocks(environ: Mapping[str, str] = os.environ) -> str:
    """Keep the memory a batch frees in the heap for the next one: glibc's mmap threshold raised to its ceiling and
    its trim threshold out of reach, before the models load. Returns what was done: "set", "user" (the environment
    sets glibc's malloc thresholds itself: left as they are) or "unavailable" (not glibc).

    Why: with glibc's own (adaptive) thresholds, the executor thread gave the freed activations of every batch back
    to the kernel and faulted them in anew in the next. Measured on the server's one core, resnet-mini at 32
    closed-loop clients under 32 / 10 ms: 99 minor page faults an item (3,150 a batch), a batch of 32 taking 35 ms
    where it takes 26-29 ms without them, so 32 / 10 ms served 804-863 req/s against 16 / 10 ms's 857-940 (16 saw
    3-5 faults an item); with the thresholds set, 0.1 faults an item and 937-1,075 req/s. Either threshold alone
    made it worse (160 and 268 faults an item). RSS stays bounded by the periodic trim."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(f"MALLOC_{k.upper()}_" in environ or f"glibc.malloc.{k}" in tunables for k in MALLOC_SETTINGS):
        log.info("glibc's malloc thresholds are the environment's: left as they are")
        return "user"
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "malloc_trim"):  # musl has mallopt as a stub; malloc_trim is glibc's
        return "unavailable"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        log.warning("glibc refused the malloc thresholds: freed activations may go back to the kernel every batch")
        return "unavailable"
    return "set"


def heap_trimmer() -> Callable[[], int] | None:
    """A function that trims the heap and returns the bytes of RSS it gave back; None without glibc."""
    trim = getattr(_libc(), "malloc_trim", None)  # not glibc (musl, macOS): nothing to trim with
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def trim_heap() -> int:
        before = resident_bytes()
        trim(0)  # ctypes releases the GIL: the event loop and the model threads run meanwhile
        return max(0, before - resident_bytes())

    return trim_heap


async def trim_heap_periodically(metrics: RuntimeMetrics, interval_s: float = DEFAULT_INTERVAL_S) -> None:
    """Every `interval_s`, trim the heap on a worker thread and count what came back."""
    trim = heap_trimmer()
    if trim is None:
        log.info("no malloc_trim (not glibc): freed heap memory stays with the process")
        return
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        released = await loop.run_in_executor(None, trim)
        metrics.heap_trims.inc()
        metrics.heap_released.inc(released)
        # DEBUG: each trim also hands back the batches' freed activations (live, textcls at 460 req/s: ~25 MiB
        # every 10 s), so this is routine; the counters tell the totals.
        log.debug("heap trimmed: %.0f MiB of freed memory given back", released / (1 << 20))
