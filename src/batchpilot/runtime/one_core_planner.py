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
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

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

__all__ = ["Neighbour", "calibrate_client_time", "plan_one_core", "predict_one_core"]

# Each setting is predicted at the measured front-end CPU per request and at this multiple of it, and
# credited with the worse of the two. Measured live, the front-end CPU per item moved by +-25% between
# epochs at one load (textcls binary, 8 clients: 0.20-0.32 ms), and a delay that gathers the whole
# population only at the nominal cost (a knife edge: 16 / 2 ms at 8 clients) fragments its batches in life.
FRONTEND_MARGIN = 1.3
_DONE = 1e-12  # CPU seconds left under which a piece of work counts as done (rounding)


@dataclass(frozen=True)
class Neighbour:
    """Another model in the process, sharing the core: a closed loop as its own tuner last measured and
    planned it (published by every autotuner on one core, see `Autotuner.neighbour`)."""

    name: str
    params: TuningParams  # its setting in force
    fit: LatencyFit  # its executor's CPU d(n)
    clients: int
    frontend_s: float  # front-end CPU per request
    client_s: float  # its clients' own time per round trip (calibrated by its last plan)
    slo_s: float  # the p99 its plans aim for
    p99_s: float | None  # measured at `params` (None: not yet)
    core_share: float  # the share of the core it took, measured (its executor and its requests)


@dataclass(frozen=True)
class _Lane:
    """One model's closed loop in the simulation: its setting, costs and clients' own times."""

    params: TuningParams
    fit: LatencyFit
    clients: int
    frontend_s: float
    client: Sequence[float]


@dataclass(frozen=True)
class _Outcome:
    prediction: CandidatePrediction
    outside_s: float  # mean time per round trip outside the queue (client, front-end, waiting for the core)


def _simulate(
    params: TuningParams,
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client: Sequence[float],
    noise: Sequence[float] | None,
) -> tuple[CandidatePrediction, float]:
    """One setting alone on one core: the prediction, and the mean time a request spends outside the queue
    (client, front-end and waiting for the core) per round trip."""
    own = _simulate_lanes([_Lane(params, fit, clients, frontend_s, client)], noise)[0]
    return own.prediction, own.outside_s


def _simulate_lanes(lanes: Sequence[_Lane], noise: Sequence[float] | None) -> list[_Outcome]:
    """Every lane's closed loop on the one core, until the first lane has had all its draws answered.

    The core is shared evenly by whatever can run (processor sharing, as the OS time-slices threads): the
    front-end (one event loop turning requests around in the order they reach the server) and each lane's
    executor while it runs a batch. A lane releases a batch when its executor is free and the batch is full
    or its oldest request's window has closed. Neighbours' figures count from the first lane's warm-up on.
    (Written for speed: a plan runs this ~100 times; the front-end's completions are taken in an inner loop
    while nothing else is due.)"""
    lanes_n = len(lanes)
    total = len(lanes[0].client)
    n_max = [lane.params.max_batch_size for lane in lanes]
    delay = [lane.params.max_queue_delay_s if lane.params.max_batch_size > 1 else 0.0 for lane in lanes]
    cost = [lane.frontend_s for lane in lanes]
    clients = [(lane.client[i], lane.client[i], j) for j, lane in enumerate(lanes) for i in range(lane.clients)]
    heapq.heapify(clients)  # on their own time: (ready to send, left the server, lane)
    front: deque[tuple[float, int]] = deque()  # sent, waiting for the front-end: (left the server, lane)
    front_left = 0.0  # CPU seconds the request at the front-end's head still needs
    queues: list[list[float]] = [[] for _ in lanes]  # arrival times in each batcher's queue, oldest first
    running = [0.0] * lanes_n  # CPU seconds left of each executor's batch...
    active = [False] * lanes_n  # ...while it runs one
    n_active = 0
    batch_of: list[list[float]] = [[] for _ in lanes]
    k = [lane.clients for lane in lanes]
    answers: list[list[tuple[float, float]]] = [[] for _ in lanes]  # (answered at, latency)
    outside: list[list[float]] = [[] for _ in lanes]
    busy, batches = [0.0] * lanes_n, [0] * lanes_n
    t = warm_at = 0.0
    warm = int(WARMUP * total)
    n_batches = 0
    while k[0] < total:
        while clients and clients[0][0] <= t:
            _, left, j = heapq.heappop(clients)
            if not front:
                front_left = cost[j]
            front.append((left, j))
        other = math.inf  # the next batch due or done
        for j in range(lanes_n):
            queue = queues[j]
            if active[j] or not queue:
                continue
            due = queue[0] + delay[j]
            if len(queue) < n_max[j] and due > t:
                other = min(other, due)
                continue
            size = min(n_max[j], len(queue))
            batch_of[j] = queue[:size]
            del queue[:size]
            work = lanes[j].fit(size) * (noise[n_batches % len(noise)] if noise is not None else 1.0)
            running[j], active[j] = work, True
            n_active += 1
            busy[j] += work
            batches[j] += 1
            n_batches += 1
        share = n_active + (1 if front else 0)
        for j in range(lanes_n):
            if active[j]:
                other = min(other, t + running[j] * share)
        # While the front-end is busy and no batch is due or done: clients join its line, and it turns
        # requests around one after the other (the pace of everything stays the same meanwhile).
        full, served = False, 0
        while front and not full:
            done_at = t + front_left * share
            sent_at = clients[0][0] if clients else math.inf
            if sent_at < done_at and sent_at <= other:
                progress = (sent_at - t) / share
                front_left -= progress
                for j in range(lanes_n):
                    if active[j]:
                        running[j] -= progress
                t = sent_at
                _, left, j = heapq.heappop(clients)
                front.append((left, j))
                continue
            if done_at > other:
                break
            served += 1
            t = done_at
            for j in range(lanes_n):
                if active[j]:
                    running[j] -= front_left
            left, j = front.popleft()
            queue = queues[j]
            queue.append(t)
            outside[j].append(t - left)
            front_left = cost[front[0][1]] if front else 0.0
            if not active[j]:
                full = len(queue) >= n_max[j]  # a batch to release now: back to the main loop
                if len(queue) == 1:
                    other = min(other, t + delay[j])
        if full or (served and not front):
            continue  # a batch to release, or the front-end idle (the executors' pace changes): look again
        if clients:
            other = min(other, clients[0][0])
        assert math.isfinite(other), "a closed loop's requests are always somewhere"
        progress = (other - t) / share if share else 0.0
        t = other
        if front:
            front_left -= progress
        for j in range(lanes_n):
            if not active[j]:
                continue
            if running[j] - progress > _DONE:
                running[j] -= progress
                continue
            active[j] = False
            n_active -= 1
            if j == 0 and len(answers[0]) < warm:
                warm_at = t
            client = lanes[j].client
            for arrived in batch_of[j]:
                answers[j].append((t, t - arrived))
                heapq.heappush(clients, (t + client[k[j] % len(client)], t, j))
                k[j] += 1
    out = []
    for j, lane in enumerate(lanes):
        kept = np.asarray([x for _, x in answers[j][warm:]] if j == 0 else [x for at, x in answers[j] if at > warm_at])
        prediction = CandidatePrediction(
            params=lane.params,
            items_per_s=kept.size / max(t - warm_at, 1e-12),
            p99_s=float(np.percentile(kept, 99)) if kept.size else math.inf,
            mean_s=float(kept.mean()) if kept.size else math.inf,
            mean_batch=len(answers[j]) / max(batches[j], 1),
            utilization=min(1.0, busy[j] / t) if t > 0 else 0.0,
            stable=True,
        )
        out.append(_Outcome(prediction, float(np.mean(outside[j][len(outside[j]) // 10 :]))))
    return out


def calibrate_client_time(
    incumbent: TuningParams,
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    outside_s: float,
    *,
    neighbours: Sequence[Neighbour] = (),
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
    rounds: int = 3,
) -> float:
    """The clients' own mean time per round trip for which the model, at `incumbent` (and the neighbours at
    theirs), predicts the measured time outside the server `outside_s` (>= 0; a few fixed-point rounds)."""
    draws = Draws(items, service_sigma, seed)
    others = _neighbour_lanes(neighbours, items, seed)
    guess = max(0.0, outside_s - frontend_s)
    for _ in range(rounds):
        lanes = [_Lane(incumbent, fit, clients, frontend_s, draws.times(guess)), *others]
        predicted = _simulate_lanes(lanes, draws.noise)[0].outside_s
        guess = max(0.0, guess + outside_s - predicted)
    return guess


def predict_one_core(
    candidates: Iterable[TuningParams],
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client_s: float,
    *,
    neighbours: Sequence[Neighbour] = (),
    incumbent: TuningParams | None = None,
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
) -> list[CandidatePrediction]:
    """Predictions for `clients` closed-loop clients (exponential own time of mean `client_s`) on one core
    with `frontend_s` of front-end CPU per request and the executor's CPU d(n) = `fit`.

    With `neighbours` (other models' closed loops on the same core, each at its setting in force) every
    candidate is simulated beside them and judged for all: its `score` counts their items/s too (each
    weighted so that its rate at `incumbent`, needed then, counts as much as this model's), and it holds
    (`others_ok`) only if every neighbour keeps its SLO (see `_holds`). Greedy tuners would each take the
    core's time for their own items/s (small batches, no delay) and break the other's SLO (measured live)."""
    if clients < 1 or items < 2 * clients:
        raise ValueError("need clients >= 1 and items >= 2 * clients")
    draws = Draws(items, service_sigma, seed)
    client = draws.times(client_s)
    others = _neighbour_lanes(neighbours, items, seed)

    def robust(p: TuningParams) -> list[CandidatePrediction]:
        """Every lane's prediction, each the worse of the measured front-end cost and FRONTEND_MARGIN x it."""
        runs = [
            _simulate_lanes(
                [
                    _Lane(p, fit, clients, frontend_s * k, client),
                    *(replace(o, frontend_s=o.frontend_s * k) for o in others),
                ],
                draws.noise,
            )
            for k in (1.0, FRONTEND_MARGIN)
        ]
        out = []
        for nominal, slower in zip(*([o.prediction for o in run] for run in runs), strict=True):
            worse = min(nominal, slower, key=lambda c: c.items_per_s)
            out.append(replace(worse, p99_s=max(nominal.p99_s, slower.p99_s)))
        return out

    if not neighbours:
        return closed_candidates(candidates, clients, lambda p: robust(p)[0])
    if incumbent is None:
        raise ValueError("a plan beside neighbours weighs them at the incumbent: give it")
    ref = robust(incumbent)

    def joint(p: TuningParams) -> CandidatePrediction:
        own, *theirs = robust(p)
        weights = (ref[0].items_per_s / max(r.items_per_s, 1e-9) for r in ref[1:])
        score = own.items_per_s + sum(c.items_per_s * w for c, w in zip(theirs, weights, strict=True))
        held = all(_holds(nb, c, r) for nb, c, r in zip(neighbours, theirs, ref[1:], strict=True))
        return replace(own, score=score, others_ok=held)

    return closed_candidates(candidates, clients, joint)


def _neighbour_lanes(neighbours: Sequence[Neighbour], items: int, seed: int) -> list[_Lane]:
    return [
        _Lane(nb.params, nb.fit, nb.clients, nb.frontend_s, Draws(items, 0.0, seed + 1 + i).times(nb.client_s))
        for i, nb in enumerate(neighbours)
    ]


def _holds(nb: Neighbour, c: CandidatePrediction, ref: CandidatePrediction) -> bool:
    """Does the neighbour keep its SLO beside a candidate? Its predicted p99 is scaled by the model's error at
    the settings in force (measured / predicted, within 0.5-3x); one already over its SLO must not get worse."""
    measured = nb.p99_s
    if measured is None or not math.isfinite(ref.p99_s) or ref.p99_s <= 0:
        return c.p99_s <= nb.slo_s
    if c.p99_s * min(max(measured / ref.p99_s, 0.5), 3.0) <= nb.slo_s:
        return True
    return measured > nb.slo_s and c.p99_s <= 1.05 * ref.p99_s


def plan_one_core(
    fit: LatencyFit,
    clients: int,
    frontend_s: float,
    client_s: float,
    slo_s: float,
    candidates: Sequence[TuningParams],
    *,
    neighbours: Sequence[Neighbour] = (),
    incumbent: TuningParams | None = None,
    service_sigma: float = 0.0,
    items: int = CLOSED_ITEMS,
    seed: int = 0,
) -> Plan:
    """The pick of `batch_planner.plan_closed` (the most items/s within the SLO, delays refined between
    the grid's; beside neighbours, the best joint score holding every SLO) under the one-core model."""

    def predict(batch: Sequence[TuningParams]) -> list[CandidatePrediction]:
        return predict_one_core(
            batch,
            fit,
            clients,
            frontend_s,
            client_s,
            neighbours=neighbours,
            incumbent=incumbent,
            service_sigma=service_sigma,
            items=items,
            seed=seed,
        )

    return refined_plan(predict, candidates, slo_s)
