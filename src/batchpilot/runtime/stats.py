"""Triton-style per-model statistics (`GET /v2/models/{m}/stats`, gRPC `ModelStatistics`).

perf_analyzer samples these counters before and after each measurement window and reports the
difference (queue, compute input/infer/output per request), so they must be cumulative and the
per-request and per-execution figures must be recorded apart, as Triton does:
- per request (`record_success` / `record_failure`): success, fail, queue, compute_* counts are
  requests, durations are that request's share;
- per model execution (`record_execution`): inference_count (+= items), execution_count (+= 1) and
  the batch_stats row of that batch size.
"""

from __future__ import annotations

import threading
import time

_INFERENCE_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_COMPUTE_KEYS = ("compute_input", "compute_infer", "compute_output")


class _Duration:
    """A count and a total in nanoseconds (Triton's StatisticDuration)."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += int(ns)

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class ModelStats:
    """Cumulative statistics of one model version, written by the executor thread and the event loop.

    One lock guards every update: each update is a handful of integer additions, so contention is
    negligible, and a reader never sees a request counted in `success` but not yet in `queue`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inference = {key: _Duration() for key in _INFERENCE_KEYS}
        self._batches: dict[int, dict[str, _Duration]] = {}
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0

    def record_success(
        self, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int, total_ns: int
    ) -> None:
        """One request answered successfully; the compute figures are its share of its batch."""
        now_ms = time.time_ns() // 1_000_000
        stats = self._inference
        with self._lock:
            stats["success"].add(total_ns)
            stats["queue"].add(queue_ns)
            stats["compute_input"].add(compute_input_ns)
            stats["compute_infer"].add(compute_infer_ns)
            stats["compute_output"].add(compute_output_ns)
            self._last_inference_ms = now_ms

    def record_successes(
        self,
        count: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        total_ns: int,
    ) -> None:
        """`count` requests of one batch answered successfully, at once: `queue_ns` and `total_ns` are their
        sums, the compute figures each request's share of the batch (as `record_success`, `count` times)."""
        now_ms = time.time_ns() // 1_000_000
        stats = self._inference
        with self._lock:
            stats["success"].add(total_ns, count)
            stats["queue"].add(queue_ns, count)
            stats["compute_input"].add(compute_input_ns * count, count)
            stats["compute_infer"].add(compute_infer_ns * count, count)
            stats["compute_output"].add(compute_output_ns * count, count)
            self._last_inference_ms = now_ms

    def record_failure(self, total_ns: int) -> None:
        """One request that failed (rejected, timed out, or its model call raised)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._inference["fail"].add(total_ns)
            self._last_inference_ms = now_ms

    def record_execution(
        self, batch_size: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One successful model call on `batch_size` items."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        with self._lock:
            row = self._batches.get(batch_size)
            if row is None:
                row = self._batches[batch_size] = {key: _Duration() for key in _COMPUTE_KEYS}
            row["compute_input"].add(compute_input_ns)
            row["compute_infer"].add(compute_infer_ns)
            row["compute_output"].add(compute_output_ns)
            self._inference_count += batch_size
            self._execution_count += 1

    def to_json(self, name: str, version: str = "1") -> dict:
        """This model's entry of Triton's `model_stats` list.

        `version` must be a decimal string: perf_analyzer parses it as an integer to pick the
        latest version when the client names none.
        """
        with self._lock:
            return {
                "name": name,
                "version": version,
                "last_inference": self._last_inference_ms,
                "inference_count": self._inference_count,
                "execution_count": self._execution_count,
                "inference_stats": {key: d.to_json() for key, d in self._inference.items()},
                "batch_stats": [
                    {"batch_size": size, **{key: d.to_json() for key, d in row.items()}}
                    for size, row in sorted(self._batches.items())
                ],
            }
