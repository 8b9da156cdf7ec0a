"""Closed-loop planning when the front-ends and the executor share one CPU core.

Pure and clock-free, with a seeded generator of its own. On one core every request costs the core its
front-end work (HTTP, decoding, encoding: `frontend_s` per item, measured as the process's CPU beyond the
executor thread's) besides its share of the batch's executor CPU, d(n) = a*n + b. The answers of a batch
therefore do not come back at once: the front-end turns them around one after the other, so the next
batch's requests reach the queue `frontend_s` apart, and a batch released early blocks the front-end work
of the requests still on their way. A delay long enough to gather the whole population then wins, which
the two-server model of `batch_planner.predict_closed` (an executor beside free front-ends) cannot see.

The model is one core serving two kinds of jobs without preemption, batch by batch: after a batch ends the
core turns returning requests around (each `frontend_s`, in the order the clients send them, a client
spending `client_s` on its own side first) until the next batch is due (full, or its oldest request's
window closed); then the batch runs d(size) and the requests still waiting for the front-end wait until
it ends. Latency counts in the server, from a request's arrival in the queue to its batch's end (as the
runtime measures it).

The clients' own time is not measured by the server: what it measures outside the server is the client's
time plus the front-end's (and its waiting). `calibrate_client_time` finds the client time for which the
model, at the setting in force, reproduces the measured time outside.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from batchpilot.runtime.autotune_model import LatencyFit, TuningParams
from batchpilot.runtime.batch_planner import (
    CLOSED_ITEMS,
    WARMUP,
    CandidatePrediction,
    Draws,
    Plan,
    closed_candidates,
    refined_plan,
)

__all__ = ["calibrate_client_time", "plan_one_core", "predict_one_core"]

# Each setting is predicted at the measured front-end CPU per request and at this multiple of it, and
# credited with the worse of the two. Measured live, the front-end CPU per item moved by +-25% between
# epochs at one load (textcls binary, 8 clients: 0.20-0.32 ms), and a delay that gathers the whole
# population only at the nominal cost (a knife edge: 16 / 2 ms at 8 clients) fragments its batches in life.
FRONTEND_MARGIN = 1.3


def _simulate(
    params: TuningParams,
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client: Sequence[float],
    noise: Sequence[float] | None,
) -> tuple[CandidatePrediction, float]:
    """One setting on one core: the prediction, and the mean time a request spends outside the queue
    (client, front-end and waiting for the core) per round trip."""
    n_max, delay, a, b = params.max_batch_size, params.max_queue_delay_s, fit.a_s, fit.b_s
    total = len(client)
    sending = [(client[i], client[i]) for i in range(clients)]  # (ready for the front-end, left the server)
    heapq.heapify(sending)
    queue: list[float] = []  # arrival times in the batcher's queue, oldest first
    k = clients
    core = t_free = busy = 0.0
    latencies: list[float] = []
    outside: list[float] = []
    warm = int(WARMUP * total)
    warm_at = 0.0
    batches = 0
    while k < total:
        core = max(core, t_free)
        while True:
            due = math.inf
            if queue:
                due = queue[0] + (delay if n_max > 1 else 0.0)
                if len(queue) >= n_max:
                    due = min(due, queue[n_max - 1])
                due = max(due, t_free)
            if not sending:
                break
            done = max(core, sending[0][0]) + frontend_s
            if done > due:
                break
            _, left = heapq.heappop(sending)
            core = done
            queue.append(done)
            outside.append(done - left)
        release = max(due, core)
        size = min(n_max, len(queue))
        batch = queue[:size]
        del queue[:size]
        d = a * size + b
        if noise is not None:
            d *= noise[batches % len(noise)]
        t_free = core = release + d
        busy += d
        batches += 1
        if len(latencies) < warm:
            warm_at = t_free
        for arrived in batch:
            latencies.append(t_free - arrived)
            heapq.heappush(sending, (t_free + client[k % total], t_free))
            k += 1
    kept = np.asarray(latencies[warm:])
    prediction = CandidatePrediction(
        params=params,
        items_per_s=kept.size / max(t_free - warm_at, 1e-12),
        p99_s=float(np.percentile(kept, 99)),
        mean_s=float(kept.mean()),
        mean_batch=len(latencies) / batches,
        utilization=min(1.0, busy / t_free) if t_free > 0 else 0.0,
        stable=True,
    )
    return prediction, float(np.mean(outside[len(outside) // 10 :]))


def calibrate_client_time(
    incumbent: TuningParams,
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    outside_s: float,
    *,
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
    rounds: int = 3,
) -> float:
    """The clients' own mean time per round trip for which the model, at `incumbent`, predicts the
    measured time outside the server `outside_s` (>= 0; a few fixed-point rounds)."""
    draws = Draws(items, service_sigma, seed)
    guess = max(0.0, outside_s - frontend_s)
    for _ in range(rounds):
        _, predicted = _simulate(incumbent, fit, clients, frontend_s, draws.times(guess), draws.noise)
        guess = max(0.0, guess + outside_s - predicted)
    return guess


def predict_one_core(
    candidates: Iterable[TuningParams],
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client_s: float,
    *,
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
) -> list[CandidatePrediction]:
    """Predictions for `clients` closed-loop clients (exponential own time of mean `client_s`) on one core
    with `frontend_s` of front-end CPU per request and the executor's CPU d(n) = `fit`."""
    if clients < 1 or items < 2 * clients:
        raise ValueError("need clients >= 1 and items >= 2 * clients")
    draws = Draws(items, service_sigma, seed)
    client = draws.times(client_s)

    def robust(p: TuningParams) -> CandidatePrediction:
        nominal = _simulate(p, fit, clients, frontend_s, client, draws.noise)[0]
        slower = _simulate(p, fit, clients, frontend_s * FRONTEND_MARGIN, client, draws.noise)[0]
        worse = min(nominal, slower, key=lambda c: c.items_per_s)
        return replace(worse, p99_s=max(nominal.p99_s, slower.p99_s))

    return closed_candidates(candidates, clients, robust)


def plan_one_core(
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client_s: float,
    slo_s: float,
    candidates: Sequence[TuningParams],
    *,
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
) -> Plan:
    """The pick of `batch_planner.plan_closed` (the most items/s within the SLO, delays refined between
    the grid's) under the one-core model."""

    def predict(batch: Sequence[TuningParams]) -> list[CandidatePrediction]:
        return predict_one_core(
            batch, fit, clients, frontend_s, client_s, service_sigma=service_sigma, items=items, seed=seed
        )

    return refined_plan(predict, candidates, slo_s)
