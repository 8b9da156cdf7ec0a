"""Recent latency and throughput over a sliding time window (what the operator shows in status)."""

from __future__ import annotations

from collections import deque

import numpy as np


class RecentWindow:
    def __init__(self, window_s: float = 10.0, max_samples: int = 200_000) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float, int]] = deque(maxlen=max_samples)  # (time, latency_s, items)

    def add(self, now: float, latency_s: float, items: int) -> None:
        self._samples.append((now, latency_s, items))
        self._prune(now)

    def add_many(self, now: float, answers: list[tuple[float, int]]) -> None:
        """Several answers at once: (latency_s, items) each."""
        if answers:
            self._samples.extend((now, latency_s, items) for latency_s, items in answers)
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def summary(self, now: float) -> dict[str, float | None]:
        self._prune(now)
        if not self._samples:
            return {"window_s": self.window_s, "p99_ms": None, "throughput_rps": 0.0, "items_per_s": 0.0}
        latencies = np.fromiter((s[1] for s in self._samples), dtype=np.float64)
        span = max(now - self._samples[0][0], 1.0)
        return {
            "window_s": self.window_s,
            "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 3),
            "throughput_rps": round(len(self._samples) / span, 2),
            "items_per_s": round(sum(s[2] for s in self._samples) / span, 2),
        }
