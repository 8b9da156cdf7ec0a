"""Give freed heap memory back to the operating system now and then (glibc's `malloc_trim`).

Why: variable input shapes (NLP lengths, autotuned batch sizes) make torch's oneDNN kernels be built per
shape, and building one allocates large short-lived buffers. glibc keeps what they freed in the heap, pinned
there by the small objects that stay (the cached kernels), so the server's RSS climbs with every new shape
although little of it is in use. Measured with textcls on one thread: 600 new shapes grew RSS by about
400 MiB of which about 20 MiB was live; one `malloc_trim(0)` gave the rest back in about 30 ms. Lowering the
mmap threshold instead kept RSS flat but cost 50% of the model's speed (every activation mmapped anew).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

from batchpilot.runtime.metrics import RuntimeMetrics

log = logging.getLogger("batchpilot.heap")
DEFAULT_INTERVAL_S = 10.0
KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_KERNEL_CACHE = 1024  # oneDNN's own bound on its built kernels (one per input shape), unless told otherwise
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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


def heap_trimmer() -> Callable[[], int] | None:
    """A function that trims the heap and returns the bytes of RSS it gave back; None without glibc."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        trim = None
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
