"""What the executed batches showed the autotuner: per size, the latest batches' wall and CPU seconds, and the batch
latency d(n) = a*n + b fitted over them, with the model's line timed alone at load (`batching/alone.py`) under it.

Plain bookkeeping and fits; when a fit is trusted, and what follows from it, is the autotuner's (`autotuner.py`).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from batchpilot.runtime.autotune_model import AloneFits, LatencyFit, fit_batch_latency

FIT_PER_SIZE = 32  # latest batches of each size behind the fit...
FIT_MEMORY_S = 30.0  # ...that ran within this long of the latest batch
FIRST_CALLS = 2  # a size's first batches are not fitted: a TorchScript model specialises on new shapes

Batch = tuple[float, float, float]  # (when it finished, wall seconds, CPU seconds)


class BatchMemory:
    """The latest batches of each size and the fits over them. `alone`: d(n) as the model ran alone, when timed."""

    def __init__(self, alone: AloneFits | None = None) -> None:
        self.alone = alone
        self._batches: dict[int, deque[Batch]] = {}
        self._seen: dict[int, int] = {}
        self.last_at = 0.0  # when the latest batch (fitted or not) finished

    def record(self, size: int, wall_s: float, cpu_s: float, now: float) -> bool:
        """A batch of `size` items finished at `now`; False for one of its size's first FIRST_CALLS (not kept)."""
        self._seen[size] = seen = self._seen.get(size, 0) + 1
        self.last_at = now
        if seen <= FIRST_CALLS:
            return False
        self._batches.setdefault(size, deque(maxlen=FIT_PER_SIZE)).append((now, wall_s, cpu_s))
        return True

    def latest(self, n: int, horizon: float | None = None) -> list[Batch]:
        """The kept batches of `n` items finished since `horizon` (by default FIT_MEMORY_S before the latest batch)."""
        if horizon is None:
            horizon = self.last_at - FIT_MEMORY_S
        return [b for b in self._batches.get(n, ()) if b[0] >= horizon]

    def rows(self, cpu: bool = False, raw: bool = False, horizon: float | None = None) -> np.ndarray:
        """(size, seconds) rows, wall or CPU time: per size, the median of its latest batches (`latest`), once per
        batch (`raw`: each batch's own time). Keeping sizes apart keeps a fit over several sizes when one size has run
        alone for a while (a full batch every time); the median keeps out a slow first call or a preemption."""
        rows = []
        for n in self._batches:
            times = [c if cpu else d for _, d, c in self.latest(n, horizon)]
            if times:
                rows += [(n, x) for x in times] if raw else [(n, float(np.median(times)))] * len(times)
        return np.asarray(rows, dtype=float).reshape(-1, 2)

    def fit(self, cpu: bool = False) -> LatencyFit | None:
        """d(n) over the recent batches (`_with_fixed_cost`). When they are all of one size (a settled tuner's), the
        shape of d(n) comes from every size kept, however old (else from the model alone), and its level from the
        recent size: the shape is scaled to pass through that size's recent median."""
        arr = self.rows(cpu)
        if not len(arr):
            return None
        fit = self._with_fixed_cost(arr, cpu)
        if fit is None or not fit.one_size:
            return fit
        shape = self._with_fixed_cost(self.rows(cpu, horizon=-math.inf), cpu)
        alone = self._alone(cpu)
        if (shape is None or shape.one_size) and alone is not None:
            shape = alone
        if shape is None or shape.one_size or shape(arr[0, 0]) <= 0:
            return fit
        return shape.through(arr[0, 0], float(np.median(arr[:, 1])))

    def spread(self, fit: LatencyFit) -> float:
        """Lognormal sigma of the recent batches' wall times around `fit`."""
        arr = self.rows(raw=True)
        ratio = arr[:, 1] / np.maximum(fit.a_s * arr[:, 0] + fit.b_s, 1e-12)
        ratio = ratio[ratio > 0]
        return min(float(np.log(ratio).std()), 1.0) if ratio.size > 1 else 0.0

    def _with_fixed_cost(self, rows: np.ndarray, cpu: bool) -> LatencyFit | None:
        """The least-squares d(n) over (size, seconds) `rows`, its intercept (a batch's fixed cost) floored at the share
        of a batch it took when the model ran alone: the alone line scaled through the fit at the rows' mean size.
        Why: under an open loop the batches grow in the host's slow seconds, which tilts the live line and can pivot
        its intercept to 0, and a line without a fixed cost promises nothing from larger batches. Live (run AQ4,
        resnet-mini at 80% of capacity): wall a = 1.53-1.75 ms per item, b = 0-2.9 ms, where torch alone gave a = 0.94,
        b = 1.97; its plans kept 16 / 2 ms through every SLO break, where a static 32 / 5 ms held the SLO."""
        fit = fit_batch_latency(rows[:, 0], rows[:, 1])
        alone = self._alone(cpu)
        if fit is None or fit.one_size or alone is None:
            return fit
        n = float(rows[:, 0].mean())
        floor = alone.through(n, fit(n))
        return floor if fit.b_s < floor.b_s else fit

    def _alone(self, cpu: bool) -> LatencyFit | None:
        if self.alone is None:
            return None
        return self.alone.cpu if cpu else self.alone.wall
