"""Prometheus metrics of the runtime: every batching decision is visible here (label `model`).

The names are a contract: the Grafana dashboard in the chart and the operator read them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)

#: Outcomes of a request, as counted by batchpilot_requests_total.
OUTCOMES = ("success", "invalid", "rejected", "timeout", "error")
#: Why a batch left the queue, as counted by batchpilot_batch_release_total.
RELEASE_REASONS = ("full", "preferred", "delay", "deadline", "drained")


class RuntimeMetrics:
    """All runtime metrics, registered once per registry (tests may pass their own registry)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        m = ("model",)
        self.requests = Counter(
            "batchpilot_requests", "Inference requests by outcome.", (*m, "outcome"), registry=registry
        )
        self.queue_wait = Histogram(
            "batchpilot_queue_wait_seconds",
            "Time a request waited in the batch queue.",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "batchpilot_compute_seconds",
            "Model execution time of one batch.",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.latency = Histogram(
            "batchpilot_request_latency_seconds",
            "Latency of a request inside the server: from the front-end's read of it to its batch's end.",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "batchpilot_batch_size", "Items per executed batch.", m, buckets=_SIZE_BUCKETS, registry=registry
        )
        self.release = Counter(
            "batchpilot_batch_release", "Batches released, by reason.", (*m, "reason"), registry=registry
        )
        self.queue_depth = Gauge("batchpilot_queue_depth", "Requests waiting in the batch queue.", m, registry=registry)
        self.tokens_useful = Counter(
            "batchpilot_tokens_useful", "Real tokens computed (NLP models).", m, registry=registry
        )
        self.tokens_computed = Counter(
            "batchpilot_tokens_computed",
            "Token slots computed, padding included (NLP models).",
            m,
            registry=registry,
        )
        self.padding_efficiency = Gauge(
            "batchpilot_padding_efficiency",
            "Useful tokens / computed tokens of the last batch (NLP).",
            m,
            registry=registry,
        )
        self.max_batch_size = Gauge("batchpilot_max_batch_size", "Max batch size in force.", m, registry=registry)
        self.max_queue_delay = Gauge(
            "batchpilot_max_queue_delay_seconds", "Max queue delay in force.", m, registry=registry
        )
        self.latency_slo = Gauge(
            "batchpilot_latency_slo_seconds", "p99 latency objective of the model.", m, registry=registry
        )
        self.autotune_changes = Counter(
            "batchpilot_autotune_changes", "Parameter changes made by the autotuner.", m, registry=registry
        )
        self.slo_feasible = Gauge(
            "batchpilot_autotune_slo_feasible",
            "1 while the autotuner can meet the SLO, else 0.",
            m,
            registry=registry,
        )
        self.model_ready = Gauge(
            "batchpilot_model_ready", "1 when the model is loaded and serving.", m, registry=registry
        )
        self.gpu_utilization = Gauge(
            "batchpilot_gpu_utilization_ratio",
            "GPU utilization from NVML (0..1).",
            ("gpu",),
            registry=registry,
        )
        self.gpu_memory_used = Gauge(
            "batchpilot_gpu_memory_used_bytes", "GPU memory in use from NVML.", ("gpu",), registry=registry
        )
        self.connections_timed_out = Counter(
            "batchpilot_connections_timed_out",
            "HTTP connections the server closed for being too slow or idle, by reason (header, body, idle).",
            ("reason",),
            registry=registry,
        )
        self.connections_refused = Counter(
            "batchpilot_connections_refused",
            "HTTP connections refused or ended past a limit, by reason (max_connections, header_too_large).",
            ("reason",),
            registry=registry,
        )
        self.heap_trims = Counter(
            "batchpilot_heap_trims", "Times the server gave freed heap memory back (malloc_trim).", registry=registry
        )
        self.heap_released = Counter(
            "batchpilot_heap_released_bytes", "RSS the heap trims gave back to the OS (bytes).", registry=registry
        )
        self.gc_full_pause = Histogram(
            "batchpilot_gc_full_pause_seconds",
            "Python's full garbage collections: how long each stopped the server (seconds).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.gc_frozen = Gauge(
            "batchpilot_gc_frozen_objects",
            "Objects built at startup and left out of the garbage collector's passes (gc.freeze).",
            registry=registry,
        )


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for every value, at the cost of one update of the sum and one per bucket touched
    (a batch's requests land in a few buckets). Falls back to `observe` per value if the client library's
    histogram is laid out differently."""
    bounds, buckets, total = (getattr(histogram, a, None) for a in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            histogram.observe(v)
        return
    counts: dict[int, int] = {}
    for v in values:
        if v != v:  # NaN falls in no bucket (as with observe), but still adds to the sum
            continue
        i = bisect_left(bounds, v)  # the first bound >= v: where observe() counts it (the last bound is +Inf)
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, count in counts.items():
        buckets[i].inc(count)
