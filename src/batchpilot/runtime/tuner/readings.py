"""Pure readings of measured epochs and plan predictions: what arrived, whether a load or a population moved, how
much noise a comparison of two epochs carries, and how another model's share of the core stretches this one's costs.
"""

from __future__ import annotations

import math

from batchpilot.runtime.autotune_model import (
    LatencyFit,
    Measurement,
    Workload,
)
from batchpilot.runtime.batch_planner import CandidatePrediction
from batchpilot.runtime.tuner.knobs import CHANGE_TRIGGER, LEVEL_BATCHES, LEVEL_BOUNDS, LOAD_MOVED


def offered(m: Measurement) -> float:
    """Items/s that arrived, admitted or refused by a full queue."""
    return m.arrival_rate + m.refused_rate


def cheaper(m: Measurement, ref: Measurement) -> bool:
    """Did `m` take less of the executor's time per item served than `ref`?"""
    return m.items_per_s > 0 and m.utilization * ref.items_per_s < ref.utilization * m.items_per_s


def comparison_noise(m: Measurement, ref: Measurement) -> float:
    """The relative noise of comparing two epochs' means: 3 / sqrt(answers) of the smaller."""
    return 3.0 / math.sqrt(max(1, min(m.completed, ref.completed)))


def same_population(clients: int, ref: int) -> bool:
    """Are `clients` the population `ref` read again (within 10% of it)?"""
    return abs(clients - ref) <= 0.1 * ref


def more_clients(many: int, few: int) -> bool:
    """Is a population of `many` in the server another load than `few` clients: LOAD_MOVED x it and two more?"""
    return many >= LOAD_MOVED * few and many - few >= 2


def rate_moved(m: Measurement, ref: Measurement) -> bool:
    """Has the arrival rate moved from `ref`'s by more than CHANGE_TRIGGER and the noise?"""
    return abs(m.arrival_rate - ref.arrival_rate) > max(CHANGE_TRIGGER, comparison_noise(m, ref)) * ref.arrival_rate


def expected_company(rate: float, share: float, delay_s: float) -> float:
    """Expected other requests arriving within `delay_s` of a batch's first one. Only arrivals that
    found others in the server count (`share`): a lone closed-loop client never keeps itself company."""
    return rate * share * delay_s


def stretched(costs: tuple[LatencyFit, float], share: float) -> tuple[LatencyFit, float]:
    """CPU costs on what `share` of the core taken by others leaves (time-sliced: the work takes 1 / (1 - share)
    as long)."""
    (fit, f), stretch = costs, 1.0 / (1.0 - share)
    return LatencyFit(fit.a_s * stretch, fit.b_s * stretch), f * stretch


def leveled(fit: LatencyFit, m: Measurement) -> LatencyFit:
    """The executor's CPU `fit`, its level from the epoch's own batches: scaled (within LEVEL_BOUNDS) to pass through
    their executor CPU per batch at their mean size, its shape kept. Over 30 s of sizes the line can miss what the
    batches in force cost now (an NLP model's batches change with the lengths queued and the padding budget): live
    (run AZ, textcls, Poisson at 95% of capacity, one core), the fit and the front-ends summed to 1.08 cores at the
    1,389 items/s batches of 16 served with the core saturated, so every larger limit read as near its capacity and
    the tuner kept 16 / 2 ms, whose queue then broke the SLO. Unchanged before the epoch ran LEVEL_BATCHES batches."""
    e = m.exec_cpu
    if e is None or e.batches < LEVEL_BATCHES or (fitted := fit(e.mean_batch)) <= 0:
        return fit
    lo, hi = LEVEL_BOUNDS
    return fit.through(e.mean_batch, min(max(e.per_batch_s, lo * fitted), hi * fitted))


def floored_p99(c: CandidatePrediction, p99_s: float, w: Workload) -> float:
    """A closed loop's predicted p99, never below its clients' mean time in the server at the predicted items/s
    (Little's law: clients / items per second, less the think time). Live, a one-core plan blind to the front-ends'
    queue predicted a p99 of 2.3 ms for 64 clients at 1,400 items/s, whose mean round trip is 46 ms."""
    if not w.closed or c.items_per_s <= 0 or not math.isfinite(w.think_s):
        return p99_s
    return max(p99_s, w.clients / c.items_per_s - w.think_s)
