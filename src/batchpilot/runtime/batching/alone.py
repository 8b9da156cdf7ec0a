"""A model's batch latency d(n) timed alone at load: the shape the autotuner falls back on where its live batches
cannot give one (`BatchMemory.fit`).

Timed as the executor times a batch (wall clock, and the calling thread's CPU time), on the kind's example inputs,
nothing else running: the median of a few calls per size, after one untimed call at that size.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np
import torch

from batchpilot.runtime.autotune_model import AloneFits, fit_batch_latency
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.repository import example_inputs

log = logging.getLogger("batchpilot.tuning")
LARGEST = 32  # the largest size timed: enough to fix a line, cheap for a model served at all
CALLS = 5  # timed calls per size


def time_alone(executor: Executor, max_batch_size: int) -> AloneFits | None:
    """d(n) at sizes 1, 2, 4, ... up to min(`max_batch_size`, LARGEST); None where fewer than three sizes fit or the
    model fails (its first batches meet the failure where it is handled)."""
    sizes = [1 << k for k in range(LARGEST.bit_length()) if 1 << k <= min(max_batch_size, LARGEST)]
    if len(sizes) < 3:
        return None
    rows: list[tuple[int, float, float]] = []
    try:
        with torch.inference_mode():
            for n in sizes:
                args = example_inputs(executor.spec, n, executor.device)
                executor.module(*args)
                walls, cpus = [], []
                for _ in range(CALLS):
                    c0, t0 = time.thread_time(), time.perf_counter()
                    executor.module(*args)
                    if executor.device.type == "cuda":
                        torch.cuda.synchronize(executor.device)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.thread_time() - c0)
                rows.append((n, statistics.median(walls), statistics.median(cpus)))
    except Exception as exc:  # out of memory at a size, a model that rejects zeros...: no shape, no harm
        log.warning("model %s not timed alone: %s", executor.spec.name, type(exc).__name__)
        return None
    arr = np.asarray(rows, dtype=float)
    wall, cpu = fit_batch_latency(arr[:, 0], arr[:, 1]), fit_batch_latency(arr[:, 0], arr[:, 2])
    if wall is None or cpu is None:
        return None
    log.info(
        "model %s alone: d(n) = %.3f ms/item * n + %.3f ms (wall), %.3f * n + %.3f (CPU)",
        executor.spec.name,
        wall.a_s * 1e3,
        wall.b_s * 1e3,
        cpu.a_s * 1e3,
        cpu.b_s * 1e3,
    )
    return AloneFits(wall, cpu)
