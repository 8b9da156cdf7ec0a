"""A small deterministic discrete-event simulator of one dynamic batcher, for the autotuner's tests.

Release semantics are the runtime batcher's: requests queue FIFO; while the executor is idle the
head batch leaves as soon as it holds `max_batch_size` items or its first (oldest) request has
waited `max_queue_delay`; one batch executes at a time and requests keep queueing while it runs, so
the next batch forms during the current one and leaves, up to the size limit, when it is done.

Arrivals are open-loop (Poisson) or closed-loop (each client sends its next request a think time
after its previous answer). Batch execution takes d(n) = a*n + b seconds (or, past a knee, more an
item), optionally with noise.
Every random draw comes from one seeded generator, and there is no wall clock: a run is a pure
function of its inputs. An optional `Autotuner` is fed exactly what the batcher feeds it and
stepped every `tick_s`; its decisions change the parameters in force.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from batchpilot.runtime.autotuner import Autotuner, Decision, TuningParams


@dataclass(frozen=True)
class LinearLatency:
    """Batch execution time d(n) = a*n + b seconds, times a lognormal factor of sigma `noise`."""

    a_s: float
    b_s: float
    noise: float = 0.0

    def mean(self, n: int) -> float:
        return self.a_s * n + self.b_s

    def sample(self, n: int, rng: random.Random) -> float:
        d = self.mean(n)
        return d * math.exp(self.noise * rng.gauss(0.0, 1.0)) if self.noise else d


@dataclass(frozen=True)
class KneeLatency(LinearLatency):
    """`LinearLatency` whose items past the `knee`-th of a batch cost `past_a_s` each instead of `a_s` (a batch that
    outgrows a cache, or NLP batches that pad more as they grow): no line through sizes up to the knee foresees it."""

    knee: int = 32
    past_a_s: float = 0.0

    def mean(self, n: int) -> float:
        return self.a_s * min(n, self.knee) + self.past_a_s * max(n - self.knee, 0) + self.b_s


@dataclass(frozen=True)
class Poisson:
    """Open-loop load: independent single-item requests at `rate_rps` on average."""

    rate_rps: float


@dataclass(frozen=True)
class ClosedLoop:
    """Closed-loop load: `clients` each send one request, then again an exponential think time
    (mean `think_s`, the client's and network's share of a round trip) after the answer."""

    clients: int
    think_s: float = 0.0


Load = Poisson | ClosedLoop

_ARRIVAL, _DONE, _TIMER, _TICK = range(4)


@dataclass(frozen=True)
class WindowStats:
    completed: int
    throughput_rps: float
    p99_s: float
    mean_s: float


class BatcherSim:
    """Simulated batcher. Call `run_until(t)` repeatedly; change `load` or `latency` in between.

    `params` is the static setting; with a `tuner`, the tuner's parameters are in force instead."""

    def __init__(
        self,
        latency: LinearLatency,
        load: Load,
        params: TuningParams,
        *,
        seed: int = 0,
        tuner: Autotuner | None = None,
        tick_s: float = 0.25,
    ) -> None:
        self.latency = latency
        self.params = tuner.params if tuner else params
        self.tuner = tuner
        self.tick_s = tick_s
        self.now = 0.0
        self.decisions: list[tuple[float, Decision]] = []
        self._rng = random.Random(seed)  # the stdlib's: several times faster per draw than numpy's
        self._events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, payload)
        self._seq = 0
        self._queue: deque[tuple[float, int]] = deque()  # (arrival time, client id; negative: open-loop)
        self._busy = False
        self._running: list[tuple[float, int]] = []
        self._compute_s = 0.0
        self._timer_at: float | None = None
        self._generation = 0  # stale Poisson arrivals of an earlier load are dropped
        self._clients_out: set[int] = set()  # closed-loop clients with a request in the server
        # Completed requests, as parallel lists: finish time, latency.
        self.finish: list[float] = []
        self.latency_s: list[float] = []
        self.batch_sizes: list[int] = []
        self._load: Load = Poisson(0.0)
        self.load = load
        if tuner:
            self._push(tick_s, _TICK, 0)

    # -- load ------------------------------------------------------------------------------
    @property
    def load(self) -> Load:
        return self._load

    @load.setter
    def load(self, load: Load) -> None:
        self._load = load
        self._generation += 1
        if isinstance(load, Poisson):
            self._next_poisson()
        else:  # clients beyond the new count retire when their answer comes back
            for client in range(load.clients):
                if client not in self._clients_out:
                    self._clients_out.add(client)
                    self._push(self.now, _ARRIVAL, client)

    # -- event loop ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _next_poisson(self) -> None:
        # A Poisson arrival's payload is -1 - generation, so one of a replaced load is dropped.
        rate = self._load.rate_rps if isinstance(self._load, Poisson) else 0.0
        if rate > 0:
            self._push(self.now + self._rng.expovariate(rate), _ARRIVAL, -1 - self._generation)

    def run_until(self, t_end: float) -> None:
        while self._events and self._events[0][0] <= t_end:
            t, _, kind, payload = heapq.heappop(self._events)
            self.now = t
            if kind == _ARRIVAL:
                self._arrive(payload)
            elif kind == _DONE:
                self._finish_batch()
            elif kind == _TICK:
                self._tick()
            elif kind == _TIMER and self._timer_at == t:
                self._timer_at = None
            self._try_release()
        self.now = t_end

    def _arrive(self, payload: int) -> None:
        if payload < 0:
            if payload != -1 - self._generation:
                return
            self._next_poisson()
        self._queue.append((self.now, payload))
        if self.tuner:
            self.tuner.record_arrival(1, self.now)

    def _try_release(self) -> None:
        if self._busy or not self._queue:
            return
        n_max, delay = self.params.max_batch_size, self.params.max_queue_delay_s
        due = self._queue[0][0] + delay
        if len(self._queue) < n_max and self.now < due:
            if self._timer_at != due:
                self._timer_at = due
                self._push(due, _TIMER, 0)
            return
        size = min(n_max, len(self._queue))
        self._running = [self._queue.popleft() for _ in range(size)]
        self._busy = True
        self._compute_s = self.latency.sample(size, self._rng)
        self._push(self.now + self._compute_s, _DONE, 0)

    def _finish_batch(self) -> None:
        self._busy = False
        size = len(self._running)
        self.batch_sizes.append(size)
        if self.tuner:
            self.tuner.record_batch(size, self._compute_s, self.now)
        start = self.now - self._compute_s
        for arrival, client in self._running:
            self.finish.append(self.now)
            self.latency_s.append(self.now - arrival)
            if self.tuner:
                self.tuner.record_request(self.now - arrival, start - arrival, self.now)
            if client >= 0:
                self._clients_out.discard(client)
                load = self._load
                if isinstance(load, ClosedLoop) and client < load.clients:
                    self._clients_out.add(client)
                    think = self._rng.expovariate(1.0 / load.think_s) if load.think_s else 0.0
                    self._push(self.now + think, _ARRIVAL, client)
        self._running = []

    def _tick(self) -> None:
        assert self.tuner is not None
        decision = self.tuner.step(self.now)
        if decision is not None:
            self.decisions.append((self.now, decision))
            self.params = decision.params
        self._push(self.now + self.tick_s, _TICK, 0)

    # -- results ---------------------------------------------------------------------------
    def stats(self, t0: float, t1: float) -> WindowStats:
        """Requests answered in [t0, t1): count, throughput, p99 and mean latency."""
        finish = np.asarray(self.finish)
        lat = np.asarray(self.latency_s)[(finish >= t0) & (finish < t1)]
        if lat.size == 0:
            return WindowStats(0, 0.0, float("inf"), float("inf"))
        return WindowStats(int(lat.size), lat.size / (t1 - t0), float(np.percentile(lat, 99)), float(lat.mean()))

    def changes_between(self, t0: float, t1: float) -> int:
        return sum(1 for t, d in self.decisions if t0 <= t < t1 and d.changed)
