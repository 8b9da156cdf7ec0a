"""What one autotuner remembers, and the primitives every rule uses on it: epochs (start, measure, end), moves
to a new setting, reopening a search, and the figures of a decision.

The rules are layered on top, each a class over the one below (a kopf-like layering, one responsibility each):
`batches` (what the executed batches say), `plans` (asking the queue model and picking from its answer),
`breaks` (SLO breaks, backoffs and the feasibility verdict), `search` (the search between breaks), and
`runtime/autotuner.py` (the public interface the batcher drives, and a trial's judgement).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchpilot.runtime.autotune_model import (
    AloneFits,
    Epoch,
    LatencyFit,
    Measurement,
    TuningParams,
    Workload,
    delay_ladder,
)
from batchpilot.runtime.batch_memory import BatchMemory
from batchpilot.runtime.batch_planner import Plan
from batchpilot.runtime.one_core_planner import Neighbour
from batchpilot.runtime.padding_planner import PaddingPlan
from batchpilot.runtime.plan_jobs import PlanJob
from batchpilot.runtime.tuner.figures import fit_figures, in_ms, params_dict
from batchpilot.runtime.tuner.knobs import (
    FIRST_LOOK_S,
    LENGTHS_KEPT,
    MAX_MEASURE_S,
    MEASURE_S,
    MIN_ANSWERS,
    QUICK_ANSWERS,
    QUICK_S,
    SETTLE_S,
    TOKEN_BATCHES,
)
from batchpilot.spec.model import AutotuneSpec


@dataclass(frozen=True)
class Decision:
    params: TuningParams
    reason: str  # plan, probe, slo-violation, revert, trial-kept, low-load, load-fell, infeasible, feasible, ceiling
    detail: dict[str, Any] = field(default_factory=dict)
    changed: bool = True  # False when the parameters stay: an SLO verdict flipped, a trial kept, a fall read


@dataclass(frozen=True)
class Outstanding:
    """A plan asked for, with what the answer is judged against."""

    job: PlanJob
    fit: LatencyFit  # wall-time d(n) behind the capacity check (an open loop's on one core: CPU + front-end)
    workload: Workload
    measurement: Measurement  # the incumbent's, when the plan was asked for
    incumbent: TuningParams
    violation: bool  # asked for because the incumbent broke the SLO
    costs: tuple[LatencyFit, float] | None = None  # a one-core plan's CPU fit and front-end CPU, unstretched


class TunerState:
    """The state of one autotuner, and the primitives the rules built on it share."""

    def __init__(
        self,
        spec: AutotuneSpec,
        initial: TuningParams,
        *,
        window_s: float = 10.0,
        cores: int = 0,
        inline_plans: bool = True,
        name: str = "",
        alone: AloneFits | None = None,
    ) -> None:
        """`cores`: CPU cores the process may use; with one, front-ends and executors share it, and the
        plan charges each item its measured front-end CPU (see `record_cpu`). 0: unknown, no charge.
        `inline_plans`: solve plans inside `step`; else `plan_job` holds the plan asked for, which the
        caller solves elsewhere (off the event loop) and hands back to `plan_solved`. `name`: the model's, as
        its neighbours see it. `alone`: d(n) as the model ran alone at load, when measured (`BatchMemory`)."""
        b = spec.bounds
        self._memory = BatchMemory(alone)
        self._name = name
        self._neighbours: tuple[Neighbour, ...] = ()  # the other models on this core, as they published
        self._planned_beside: dict[str, TuningParams] = {}  # their settings when the last plan was made
        # This model's closed loop as the last one-core plan calibrated it (`neighbour` publishes it as it runs).
        self._calibrated: Neighbour | None = None
        self._others_trying = False  # another model on the core has a trial in force
        self._inline = inline_plans
        self._outstanding: Outstanding | None = None
        self._replanned: Epoch | None = None  # the epoch whose SLO break was re-planned
        self._unanswer: tuple[str, Measurement] | None = None  # why this step left an SLO break as it is, its figures
        self._strike: TuningParams | None = None  # kept once through an SLO break the plan could not better
        self._fruitless: dict[int, tuple[TuningParams, float]] = {}  # clients -> the setting a plan kept, when
        self._remembered: dict[int, tuple[TuningParams, float]] = {}  # clients -> a search's settled setting, items/s
        self._breaks: dict[TuningParams, float] = {}  # an open loop's settings that broke the SLO in a row: p99
        self._broke: set[TuningParams] = set()  # settings that broke the SLO since an epoch last met it (any load)
        self._held: int | None = None  # held as infeasible (`_futile`): epochs in a row since that met the SLO
        self._cores = cores
        self._lo_n: int = b.min_batch_size
        self._ceiling: int = b.max_batch_size
        self._lo_d: float = b.min_queue_delay_microseconds / 1e6
        self._ladder = delay_ladder(self._lo_d, b.max_queue_delay_microseconds / 1e6)
        self._slo_s: float = spec.latency_slo_p99_ms / 1000.0
        self._window_s = window_s
        self._incumbent = self._clip(initial)
        self._lengths: deque[int] = deque(maxlen=LENGTHS_KEPT)
        self._token_batches: deque[tuple[int, float]] = deque(maxlen=TOKEN_BATCHES)  # (computed tokens, s)
        self._padding: PaddingPlan | None = None
        self._params = self._incumbent
        self._changes = 0
        self._feasible = True
        self._settled = False
        self._rejected: set[TuningParams] = set()
        self._lost_sizes: set[int] = set()  # sizes whose planned trial lost in this search
        self._trials = 0  # planned settings tried in this search
        self._probed = False
        # Size limits put in force (any move): when, the latest (the first, from ever).
        self._limits_put: dict[int, float] = {self._incumbent.max_batch_size: -math.inf}
        self._planned: TuningParams | None = None  # the setting the last plan chose, while in force
        self._backoff_dir = 0  # +1 / -1: the size was last backed off up / down
        self._raised: TuningParams | None = None  # an open loop's limit raised at its last SLO break
        # An open loop's limit raised at a break, with the setting it replaced, and the breaks it has brought since
        # (`_revisit`); a raised limit given up for the one it replaced, with the arrival rate then.
        self._lifted: tuple[TuningParams, TuningParams] | None = None
        self._lifted_breaks = 0
        self._given_up: tuple[TuningParams, float] | None = None
        self._roomier: TuningParams | None = None  # the last limit tried for headroom (`_headroom`)
        self._inc_meas: Measurement | None = None
        self._ref: Measurement | None = None  # the incumbent's figures when the search settled
        self._plan: Plan | None = None
        self._workload: Workload | None = None
        self._charged: float | None = None  # front-end CPU per item the last plan charged (one core)
        self._background = 0.0  # share of the core other models took when the last plan was made (one core)
        self._shares = (0.0, 0.0)  # the core's shares this model and the others took, as last measured
        self._front_s = 0.0  # front-end CPU per item, as last measured (`_front`)
        self._pending: Decision | None = None
        self._epoch: Epoch | None = None
        self._quick: Epoch | None = None  # the epoch measuring a closed loop's fallen population (`_fell`)
        self._in_server = 0  # items arrived and not yet executed
        self._last_arrival_at = -math.inf
        # Costs (`_cost`) of a limit's first PACE_BATCHES full batches past PACE_SETTLE_S of its latest start: its pace
        # beside the limit it replaced (`_outpaced`).
        self._first_costs: dict[int, list[float]] = {}
        self._answers: deque[tuple[float, float]] = deque()  # (time, latency) for snapshot()
        self._items: deque[tuple[float, int]] = deque()  # (time, batch size) for snapshot()
        self._first_seen: float | None = None
        self._epoch_count = 0

    def _window_p99(self) -> float | None:
        """The p99 of the answers within the last `window_s` (as last forgotten), None without any."""
        return float(np.percentile([x for _, x in self._answers], 99)) if self._answers else None

    def _unanswered(self, why: str, m: Measurement) -> Decision | None:
        """No decision for this SLO break, and why (`unanswered_break`)."""
        self._unanswer = (why, m)
        return None

    def _start_over(self, now: float, settle: float | None = None) -> None:
        """Another load: the setting in force becomes the incumbent without a verdict (a trial's comparison says nothing
        about either), and the search starts over from a new epoch."""
        self._incumbent = self._params
        self._forget_load()
        self._new_epoch(now, settle=settle)

    def _forget_load(self) -> None:
        """Drop what the search held for the load it left: its plan, a limit raised at a break and the limit given up
        after one, and the search's own state (`_reopen`)."""
        self._planned = None
        self._lifted = self._given_up = None
        self._reopen()

    def _reopen(self) -> None:
        self._rejected.clear()
        self._lost_sizes.clear()
        self._settled, self._ref = False, None
        self._trials, self._probed = 0, False
        self._fruitless.clear()
        self._raised = self._roomier = None

    def _forget(self, now: float) -> None:
        horizon = now - self._window_s
        for q in (self._answers, self._items):
            while q and q[0][0] < horizon:
                q.popleft()

    def _clip(self, p: TuningParams) -> TuningParams:
        n = min(max(int(p.max_batch_size), self._lo_n), self._ceiling)
        d = min(max(float(p.max_queue_delay_s), self._ladder[0]), self._ladder[-1])
        return TuningParams(n, d, p.max_padding_waste)

    def _move(self, to: TuningParams, kind: str, now: float, detail: dict[str, Any]) -> Decision | None:
        """Put `to` in force and start measuring it. `kind` is "reason" or "reason:knob"."""
        reason, _, knob = kind.partition(":")
        self._outstanding = None  # a plan asked for under the setting left behind no longer applies
        if to == self._params:
            self._new_epoch(now)
            return None
        detail = {"from": params_dict(self._params), **({"knob": knob} if knob else {}), **detail}
        # (In force before the new epoch starts: the epoch counts full batches against its limit, and every rule reads
        # the limit measured from it.)
        self._params = to
        self._new_epoch(now)
        self._limits_put[to.max_batch_size] = now
        self._first_costs.pop(to.max_batch_size, None)
        self._changes += 1
        return Decision(to, reason, detail)

    def _figures(self, m: Measurement) -> dict[str, Any]:
        return {
            "p99_ms": in_ms(m.p99_s),
            "mean_ms": in_ms(m.mean_s),
            "queue_wait_ms": in_ms(m.mean_wait_s),
            "slo_ms": self._slo_s * 1e3,
            "items_per_s": round(m.items_per_s, 2),
            "arrival_rate": round(m.arrival_rate, 2),
            **({"refused_rate": round(m.refused_rate, 2)} if m.refused_rate > 0 else {}),
            "utilization": round(m.utilization, 3),
            "mean_batch": round(m.mean_batch, 2),
            "core_own": round(m.own_cpu, 3),
            "core_others": round(m.background_cpu, 3),
            "frontend_cpu_ms": None if m.frontend_cpu_s is None else in_ms(m.frontend_cpu_s),
            "exec_cpu_ms_per_item": in_ms(e.seconds / e.items) if (e := m.exec_cpu) is not None and e.items else None,
            "lag_ratio": None if m.lag_ratio is None else round(m.lag_ratio, 2),
            "in_server_low": m.low_in_server,  # items in the server at arrivals: the 2nd percentile
            "in_server_peak": m.peak_in_server,  # and the 98th
            **(fit_figures(self._memory.fit()) or dict.fromkeys(("a_ms_per_item", "b_ms"))),
        }

    def _epoch_at(self, now: float) -> Epoch:
        if self._epoch is None:
            # A fresh server's first moments are its warm-up, measured from FIRST_LOOK_S on: clients still
            # connecting read as a trickle (live: 2 clients read as 168/s in the first 0.25 s, the delay that paired
            # them dropped, 0.92x the best static setting), and first calls (the model specialising) break the SLO.
            self._new_epoch(now, settle=FIRST_LOOK_S, fresh=True)
        assert self._epoch is not None
        return self._epoch

    def _new_epoch(self, now: float, settle: float | None = None, fresh: bool = False) -> None:
        """Measure from now (`fresh`: latencies too count only from the settling's end, not since now)."""
        if settle is None:
            recent = self._inc_meas.p99_s if self._inc_meas and math.isfinite(self._inc_meas.p99_s) else 0.0
            settle = min(max(3 * recent, SETTLE_S[0]), SETTLE_S[1])
        self._epoch = Epoch(self._params, now + settle if fresh else now, now + settle, self._slo_s)
        self._epoch_count += 1
        if self._first_seen is None:
            self._first_seen = now

    def _epoch_done(self, epoch: Epoch, now: float) -> bool:
        elapsed = now - epoch.settled_at
        if epoch is self._quick:
            return elapsed >= QUICK_S and len(epoch.latencies) >= QUICK_ANSWERS
        enough = len(epoch.latencies) >= MIN_ANSWERS
        return (elapsed >= MEASURE_S and enough) or (elapsed >= MAX_MEASURE_S and len(epoch.latencies) >= 10)
