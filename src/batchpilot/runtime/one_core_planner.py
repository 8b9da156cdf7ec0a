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
it ends. Latency counts in the server, from a request's reaching the front-end to its batch's end (as the
runtime measures it: from the front-end's read), its wait for the front-end included: with the whole
population in one batch, the last request turned around waits for every other's front-end work. (Tried and
not kept: the core shared evenly while a batch runs, processor sharing. It predicts that a batch released at
once fills anyway, so delays hardly matter; live, beside another model, its picks of 16 / 0.3-0.75 ms for
resnet-mini broke the SLO (p99 52-62 ms) where 16 / 10 ms held it (42 ms).)

Other models in the process (`Neighbour`s: closed loops their own tuners planned and published) join the
simulation as more lanes on the same core, each at its setting in force; a plan then keeps every model's
SLO (`predict_one_core`).

The clients' own time is not measured by the server: what it measures outside the server is the client's
time plus the front-end's (and its waiting). `calibrate_client_time` finds the client time for which the
model, at the setting in force, reproduces the measured time outside.
"""

from __future__ import annotations

import heapq
import math
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

# Each setting is predicted at this multiple of the measured front-end CPU per request. Measured live, the
# front-end CPU per item moved by +-25% between epochs at one load (textcls binary, 8 clients: 0.20-0.32 ms),
# and a delay that gathers the whole population only at the nominal cost (a knife edge: 16 / 2 ms at 8 clients)
# fragments its batches in life. (Each setting was once also simulated at the measured cost and credited with
# the worse of the two runs. Over 756 settings (both demo models' fits, 2-64 clients) that run never predicted
# fewer items/s, and a higher p99 in 2% of them (at most 1.19x); it took half of every plan's CPU, on the core
# the plan tunes.)
FRONTEND_MARGIN = 1.3


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


def _simulate_lanes(lanes: Sequence[_Lane], noise: Sequence[float] | None) -> list[_Outcome]:
    """Every lane's closed loop on the one core, until the first lane has had all its draws answered. The
    core takes turns (see the module's doc): it runs the batch due first, or else turns around the request
    that reached the server first if that ends before any batch is due. Neighbours' figures count from the
    first lane's warm-up on."""
    total = len(lanes[0].client)
    sending = [(lane.client[i], lane.client[i], j) for j, lane in enumerate(lanes) for i in range(lane.clients)]
    heapq.heapify(sending)  # (ready for the front-end, left the server, lane)
    queues: list[list[float]] = [[] for _ in lanes]  # arrival times in each batcher's queue, oldest first
    reached: list[list[float]] = [[] for _ in lanes]  # when those requests reached the front-end
    k = [lane.clients for lane in lanes]
    answers: list[list[tuple[float, float]]] = [[] for _ in lanes]  # (answered at, latency)
    outside: list[list[float]] = [[] for _ in lanes]
    busy, batches = [0.0] * len(lanes), [0] * len(lanes)
    core = t_free = 0.0
    warm = int(WARMUP * total)
    warm_at = 0.0
    while k[0] < total:
        core = max(core, t_free)
        while True:
            due, j_due = math.inf, -1
            for j, queue in enumerate(queues):
                if not queue:
                    continue
                n_max, delay = lanes[j].params.max_batch_size, lanes[j].params.max_queue_delay_s
                at = queue[0] + (delay if n_max > 1 else 0.0)
                if len(queue) >= n_max:
                    at = min(at, queue[n_max - 1])
                if at < due:
                    due, j_due = at, j
            due = max(due, t_free)
            if not sending:
                break
            ready, left, j = sending[0]
            done = max(core, ready) + lanes[j].frontend_s
            if done > due:
                break
            heapq.heappop(sending)
            core = done
            queues[j].append(done)
            reached[j].append(ready)
            outside[j].append(done - left)
        assert j_due >= 0, "a closed loop's requests are always somewhere"
        lane, queue = lanes[j_due], queues[j_due]
        size = min(lane.params.max_batch_size, len(queue))
        batch = reached[j_due][:size]
        del queue[:size], reached[j_due][:size]
        d = lane.fit(size)
        if noise is not None:
            d *= noise[sum(batches) % len(noise)]
        t_free = core = max(due, core) + d
        busy[j_due] += d
        batches[j_due] += 1
        if j_due == 0 and len(answers[0]) < warm:
            warm_at = t_free
        for arrived in batch:
            answers[j_due].append((t_free, t_free - arrived))
            heapq.heappush(sending, (t_free + lane.client[k[j_due] % len(lane.client)], t_free, j_due))
            k[j_due] += 1
    out = []
    for j, lane in enumerate(lanes):
        kept = np.asarray([x for _, x in answers[j][warm:]] if j == 0 else [x for at, x in answers[j] if at > warm_at])
        prediction = CandidatePrediction(
            params=lane.params,
            items_per_s=kept.size / max(t_free - warm_at, 1e-12),
            p99_s=float(np.percentile(kept, 99)) if kept.size else math.inf,
            mean_s=float(kept.mean()) if kept.size else math.inf,
            mean_batch=len(answers[j]) / max(batches[j], 1),
            utilization=min(1.0, busy[j] / t_free) if t_free > 0 else 0.0,
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
    candidate is simulated beside them, and holds (`others_ok`) only if every neighbour keeps its SLO (see
    `_holds`; `incumbent`, needed then, is where the model's error is read). Tuners that each planned alone
    would take the core's time for their own items/s and break the other's SLO (measured live)."""
    if clients < 1 or items < 2 * clients:
        raise ValueError("need clients >= 1 and items >= 2 * clients")
    draws = Draws(items, service_sigma, seed)
    client = draws.times(client_s)
    others = _neighbour_lanes(neighbours, items, seed)

    def robust(p: TuningParams) -> list[CandidatePrediction]:
        """Every lane's prediction, each front-end's cost FRONTEND_MARGIN x the measured one."""
        k = FRONTEND_MARGIN
        lanes = [
            _Lane(p, fit, clients, frontend_s * k, client),
            *(replace(o, frontend_s=o.frontend_s * k) for o in others),
        ]
        return [o.prediction for o in _simulate_lanes(lanes, draws.noise)]

    if not neighbours:
        return closed_candidates(candidates, clients, lambda p: robust(p)[0])
    if incumbent is None:
        raise ValueError("a plan beside neighbours reads the model's error at the incumbent: give it")
    ref = robust(incumbent)

    def joint(p: TuningParams) -> CandidatePrediction:
        own, *theirs = robust(p)
        return replace(
            own, others_ok=all(_holds(nb, c, r) for nb, c, r in zip(neighbours, theirs, ref[1:], strict=True))
        )

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
    the grid's; beside neighbours, within theirs too) under the one-core model."""

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
