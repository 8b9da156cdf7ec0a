"""A plan as data: what the autotuner asks the queue models (`PlanJob`) and their answer (`Solved`).

A job is plain, picklable data, so it can be solved anywhere: inline (the deterministic tests and the
simulator) or in the plan worker's process (`plan_worker.py`), off the server's event loop. A plan
costs 10-200 ms of pure-Python simulation, too long to hold the loop that answers requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from batchpilot.runtime.autotune_model import LatencyFit, TuningParams
from batchpilot.runtime.batch_planner import Plan, plan, plan_closed
from batchpilot.runtime.one_core_planner import Neighbour, calibrate_client_time, plan_one_core

__all__ = ["PlanJob", "Solved", "solve"]


@dataclass(frozen=True)
class PlanJob:
    """One plan over `grid` for the load as measured. `kind`: "open" (a given arrival rate), "closed" (a
    population of clients, `think_s` outside the server per round trip) or "one-core" (closed, with the
    front-ends taking `frontend_s` of the executor's core per request; the clients' own time is first
    calibrated so that the model reproduces the measured `think_s` at `incumbent`), beside the other models'
    closed loops on the same core (`neighbours`, each at its own setting in force)."""

    kind: Literal["open", "closed", "one-core"]
    fit: LatencyFit  # wall time d(n); on one core the executor's CPU time
    grid: tuple[TuningParams, ...]
    slo_s: float
    service_sigma: float
    items: int
    arrival_rate: float = 0.0
    clients: int = 0
    think_s: float = math.inf
    frontend_s: float = 0.0
    incumbent: TuningParams | None = None
    neighbours: tuple[Neighbour, ...] = ()


@dataclass(frozen=True)
class Solved:
    plan: Plan
    think_s: float  # the clients' time outside the server the plan assumed (calibrated on one core)


def solve(job: PlanJob) -> Solved:
    grid, sigma = list(job.grid), job.service_sigma
    if job.kind == "open":
        return Solved(
            plan(job.fit, job.arrival_rate, job.slo_s, grid, service_sigma=sigma, items=job.items), job.think_s
        )
    if job.kind == "closed":
        p = plan_closed(job.fit, job.clients, job.think_s, job.slo_s, grid, service_sigma=sigma, items=job.items)
        return Solved(p, job.think_s)
    assert job.incumbent is not None, "a one-core plan calibrates at the setting in force"
    beside = job.neighbours
    client_s = calibrate_client_time(
        job.incumbent,
        job.fit,
        job.clients,
        job.frontend_s,
        job.think_s,
        neighbours=beside,
        service_sigma=sigma,
        items=job.items,
    )
    p = plan_one_core(
        job.fit,
        job.clients,
        job.frontend_s,
        client_s,
        job.slo_s,
        grid,
        neighbours=beside,
        incumbent=job.incumbent,
        service_sigma=sigma,
        items=job.items,
    )
    return Solved(p, client_s)
