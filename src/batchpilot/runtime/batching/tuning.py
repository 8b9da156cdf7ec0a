"""Who sets a batcher's size and delay: a `StaticTuner` (the spec's parameters, or batch size 1 without
batching) or an `AutoTuner` (the online autotuner of runtime/autotuner.py, fed through the observer events).

Both lower their ceiling when the model runs out of memory, and report the `autotune` part of
`GET /v2/models/{m}/batching`. The autotuner stays pure: its clock is injected here.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from batchpilot.runtime.autotune_model import AloneFits
from batchpilot.runtime.autotuner import Autotuner, Decision, TuningParams
from batchpilot.runtime.batching.alone import time_alone
from batchpilot.runtime.batching.cpu_ledger import CpuLedger, shared_ledger
from batchpilot.runtime.batching.device_turns import available_cores
from batchpilot.runtime.batching.executor import BatchTimings, Executor
from batchpilot.runtime.batching.neighbour_board import NeighbourBoard, shared_board
from batchpilot.runtime.batching.observers import BatchObserver, Finished
from batchpilot.runtime.batching.request import Pending
from batchpilot.runtime.plan_jobs import PlanJob, Solved
from batchpilot.runtime.plan_worker import PLAN_TIMEOUT_S, PlanWorker, shared_worker
from batchpilot.spec.contracts import AutotuneState
from batchpilot.spec.model import ModelSpec

log = logging.getLogger("batchpilot.tuning")
UNANSWERED_LOG_S = 1.0  # an SLO break left as it is for the same reason is logged at most this often


class StaticTuner(BatchObserver):
    """Fixed parameters; only running out of memory lowers the batch size."""

    adaptive = False

    def __init__(self, spec: ModelSpec, params: TuningParams, ledger: CpuLedger | None = None) -> None:
        self.spec = spec
        self.params = params
        self.cpu = (ledger or CpuLedger()).account()  # this model's executor CPU among the process's models

    def batch_done(self, timings: BatchTimings) -> None:
        for (size, *_), cpu_s in zip(timings.executions, timings.cpu_s, strict=True):
            self.cpu.add(cpu_s, size)

    def lower_ceiling(self, ceiling: int) -> TuningParams:
        """Never form a batch larger than `ceiling` again; the parameters now in force."""
        self.params = replace(self.params, max_batch_size=min(ceiling, self.params.max_batch_size))
        return self.params

    def step(self) -> Decision | None:
        """A periodic look at the figures: a decision when the parameters (or the SLO verdict) change."""
        return None

    @property
    def slo_feasible(self) -> bool:
        return True

    def report(self) -> AutotuneState:
        return AutotuneState(enabled=False, latency_slo_p99_ms=self.spec.autotune.latency_slo_p99_ms)


class AutoTuner(StaticTuner):
    """The autotuner, told what happens through the observer events and stepped on a timer. Its plans
    are solved by `worker` (off the event loop), or inline without one."""

    adaptive = True

    def __init__(
        self,
        spec: ModelSpec,
        params: TuningParams,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        worker: PlanWorker | None = None,
        ledger: CpuLedger | None = None,
        board: NeighbourBoard | None = None,
        alone: AloneFits | None = None,
    ) -> None:
        super().__init__(spec, params, ledger)
        self.board = board or NeighbourBoard()  # the other autotuned models of the process, for joint plans
        self.clock = clock
        self.cpu_clock = cpu_clock  # the whole process's CPU time: front-ends and every model's executor
        self.worker = worker
        self.autotuner = Autotuner(
            spec.autotune,
            _clamp(params, spec),
            cores=available_cores(),
            inline_plans=worker is None,
            name=spec.name,
            alone=alone,
        )
        self._asked: tuple[PlanJob, float] | None = None  # the plan handed to the worker, and when
        self._unanswered_logged: tuple[str, float] | None = None  # the last unanswered break logged: why, when

    # -- observer events ---------------------------------------------------------------------------
    def arrived(self, request: Pending) -> None:
        self.autotuner.record_arrival(request.n, self.clock(), length=request.length)

    def batch_done(self, timings: BatchTimings) -> None:
        super().batch_done(timings)
        now = self.clock()
        # The batch's computed tokens belong to one execution only when it ran in one piece.
        tokens = timings.tokens_computed if len(timings.executions) == 1 else 0
        for (size, t_in, t_infer, t_out), cpu_s in zip(timings.executions, timings.cpu_s, strict=True):
            self.autotuner.record_batch(size, t_in + t_infer + t_out, now, cpu_s=cpu_s, tokens=tokens)

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        if outcome == "success":
            self._record(request, queued_s, total_s, self.clock())

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        at = self.clock()
        for f in done:
            if f.outcome == "success":
                self._record(f.request, f.queued_s, f.total_s, at)

    def _record(self, request: Pending, queued_s: float, total_s: float, at: float) -> None:
        """An answer: `total_s` runs from the front-end's read; the tuner takes the part from the queue and the rest."""
        front = request.front_s
        self.autotuner.record_request(total_s - front, queued_s, at, front_s=front)

    def dropped(self, request: Pending, outcome: str) -> None:
        """An admitted request leaves without an answer: stop counting it as in flight."""
        self.autotuner.record_drop(request.n - request.finished, self.clock())

    def refused(self, n_items: int) -> None:
        self.autotuner.record_refusal(n_items, self.clock())

    # -- tuning ----------------------------------------------------------------------------------------
    def lower_ceiling(self, ceiling: int) -> TuningParams:
        self.autotuner.lower_ceiling(ceiling, self.clock())
        return super().lower_ceiling(ceiling)

    def step(self) -> Decision | None:
        now = self.clock()
        others_exec_s, others_items = self.cpu.others()
        self.autotuner.record_cpu(self.cpu_clock(), now, others_exec_s=others_exec_s, others_items=others_items)
        name = self.spec.name
        self.autotuner.set_neighbours(self.board.others(name, now), others_trying=self.board.others_trying(name, now))
        decision = self.autotuner.step(now)
        self.board.publish(name, self.autotuner.neighbour(now), now, trying=self.autotuner.trying(now))
        self._hand_out_plan(now)
        if decision is not None:
            old, self.params = self.params, decision.params
            waste = decision.params.max_padding_waste
            self._log(
                "autotune",
                reason=decision.reason,
                max_batch_size=[old.max_batch_size, decision.params.max_batch_size],
                max_queue_delay_us=[round(old.max_queue_delay_s * 1e6), round(decision.params.max_queue_delay_s * 1e6)],
                **({"max_padding_waste": [old.max_padding_waste, waste]} if waste is not None else {}),
                **{k: v for k, v in decision.detail.items() if isinstance(v, (int, float, str, bool))},
            )
        else:
            self._log_unanswered(now)
        return decision

    def _log_unanswered(self, now: float) -> None:
        """An SLO break the step left as it is: one line with the reason (`break-unanswered`), then at most one a
        UNANSWERED_LOG_S for as long as the reason stays the same."""
        held = self.autotuner.unanswered_break
        if held is None:
            return
        why, m = held
        last = self._unanswered_logged
        if last is not None and last[0] == why and now - last[1] < UNANSWERED_LOG_S:
            return
        self._unanswered_logged = (why, now)
        self._log(
            "break-unanswered",
            why=why,
            max_batch_size=m.params.max_batch_size,
            max_queue_delay_us=round(m.params.max_queue_delay_s * 1e6),
            p99_ms=round(m.p99_s * 1e3, 3) if math.isfinite(m.p99_s) else None,
            items_per_s=round(m.items_per_s, 2),
            arrival_rate=round(m.arrival_rate, 2),
            **({"refused_rate": round(m.refused_rate, 2)} if m.refused_rate > 0 else {}),
            in_server=m.in_server,
        )

    def _hand_out_plan(self, now: float) -> None:
        job = self.autotuner.plan_job
        if job is None or self.worker is None:
            return
        if self._asked is None or self._asked[0] is not job:
            self._asked = (job, now)
            self._log("plan-asked", kind=job.kind, clients=job.clients, beside=[n.name for n in job.neighbours])
            self.worker.submit(job, self._plan_answered)
        elif now - self._asked[1] > PLAN_TIMEOUT_S:
            log.warning("model %s: a plan took over %.0f s, given up", self.spec.name, PLAN_TIMEOUT_S)
            self.autotuner.plan_solved(job, None, now)

    def _plan_answered(self, job: PlanJob, solved: Solved | None) -> None:
        now = self.clock()
        self._log("plan-answered", after_s=round(now - self._asked[1], 2) if self._asked else None)
        self.autotuner.plan_solved(job, solved, now)
        self._log_unanswered(now)  # (a break's plan that found nothing, with nothing to back off to)

    def _log(self, event: str, **fields: Any) -> None:
        """One JSON log line about this model's tuning."""
        log.info(json.dumps({"event": event, "model": self.spec.name, **fields}))

    @property
    def slo_feasible(self) -> bool:
        return self.autotuner.feasible  # (read every step: not the whole snapshot, whose p99 sorts the window)

    def report(self) -> AutotuneState:
        snap = self.autotuner.snapshot(self.clock())
        return AutotuneState(
            enabled=True,
            latency_slo_p99_ms=self.spec.autotune.latency_slo_p99_ms,
            slo_feasible=snap.get("slo_feasible"),
            latency_model=snap.get("latency_model"),
            cpu_latency_model=snap.get("cpu_latency_model"),
            alone_latency_model=snap.get("alone_latency_model"),
            changes=snap.get("changes"),
            plan=snap.get("plan"),
        )


def make_tuner(spec: ModelSpec, batching: bool, executor: Executor | None = None) -> StaticTuner:
    """The autotuner when batching is on and the spec enables it; fixed parameters otherwise. With `executor`, an
    autotuned model of fixed-shape items is first timed alone (`alone.py`); a sequence model's cost per item follows
    the lengths its traffic brings, which a load-time timing cannot know."""
    b = spec.batching
    if not batching:
        return StaticTuner(spec, TuningParams(1, 0.0), shared_ledger())
    static = TuningParams(b.max_batch_size, b.max_queue_delay_microseconds / 1e6)
    if not spec.autotune.enabled:
        return StaticTuner(spec, static, shared_ledger())
    nlp = spec.type == "nlp"
    waste = spec.sequence.max_padding_waste if nlp else None  # the length grouping's budget
    alone = None if executor is None or nlp else time_alone(executor, spec.autotune.bounds.max_batch_size)
    return AutoTuner(
        spec,
        TuningParams(static.max_batch_size, static.max_queue_delay_s, waste),
        worker=shared_worker(),
        ledger=shared_ledger(),
        board=shared_board(),
        alone=alone,
    )


def _clamp(params: TuningParams, spec: ModelSpec) -> TuningParams:
    b = spec.autotune.bounds
    return TuningParams(
        min(max(params.max_batch_size, b.min_batch_size), b.max_batch_size),
        min(max(params.max_queue_delay_s, b.min_queue_delay_microseconds / 1e6), b.max_queue_delay_microseconds / 1e6),
        params.max_padding_waste,
    )
