"""Online autotuner of one batcher's max batch size and queue delay against a p99 latency SLO.

Pure and clock-injected: the batcher reports arrivals, batches and answers with their time, and
calls `step(now)` every ~0.25 s; nothing here reads a clock, sleeps or draws a random number.

Policy, in short. The tuner measures the setting in force over an *epoch* (a short settling time
after a change, then >= 1.5 s and >= 100 answers). From the incumbent setting it tries one
neighbour at a time (batch size x2 or /2, one step of a delay ladder, or the minimum delay) and
keeps the trial only if it measurably wins: p99 under 90% of the SLO, then more items/s beyond the
noise band, then a lower mean latency, then, all else tied, less waiting. A loser goes back on a
rejected list; with no neighbour left to try the tuner is settled and makes no changes until the
load or the latency moves by 30% or more. Under closed-loop load (fixed concurrency) more
throughput and less latency are the same thing; under open-loop load every stable setting serves
the arrival rate, so the latency tie-breakers pick among them.
A model keeps the search safe and short: d(n) = a*n + b fitted on recent batches and the arrival
rate predict each candidate's p99; candidates predicted over the SLO are not tried. A p99 over the
SLO (or a queue growing past the SLO's worth of work) is answered at once: a trial is abandoned;
the incumbent backs off multiplicatively (the delay drops to its minimum, else the batch size
doubles when the executor is the bottleneck or halves when the batches are). When a delay would
gather less than one companion for a batch's first request, the delay goes to its minimum. When
no setting meets the SLO, the search minimises p99 instead and reports the SLO infeasible.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from batchpilot.runtime.autotune_model import (
    Epoch,
    LatencyFit,
    Measurement,
    TuningParams,
    delay_ladder,
    fit_batch_latency,
    predict,
)
from batchpilot.spec.model import AutotuneSpec

__all__ = ["Autotuner", "Decision", "TuningParams"]

MEASURE_S = 1.5  # shortest epoch
MAX_MEASURE_S = 5.0  # longest epoch, however few answers came (low load)
MIN_ANSWERS = 100  # answers behind a p99 worth comparing
SETTLE_S = (0.25, 2.0)  # after a change, data is counted from 3 x p99 later, within these bounds
TRIAL_MARGIN = 0.9  # a trial must keep its p99 under this share of the SLO to win
CHANGE_TRIGGER = 0.3  # relative change of arrival rate or mean latency that reopens the search
LOW_LOAD_COMPANY = 0.5  # expected companions within the delay under which the delay drops
EXPLORE_COMPANY = 1.0  # ... and over which a longer delay is worth trying (hysteresis)
FIT_BATCHES = 128
FULL_SHARE = 0.5  # share of full batches over which the size limit binds...
BUSY = 0.75  # ...while the executor is this busy: a violation then calls for larger batches


@dataclass(frozen=True)
class Decision:
    params: TuningParams
    reason: str  # explore-up/-down, revert, settled, slo-violation, low-load, infeasible, feasible, ceiling
    detail: dict[str, Any] = field(default_factory=dict)
    changed: bool = True  # False when only the SLO verdict flipped (reason infeasible or feasible)


class Autotuner:
    """Chooses `max_batch_size` and `max_queue_delay_s` within `spec.bounds` (see module doc)."""

    def __init__(self, spec: AutotuneSpec, initial: TuningParams, *, window_s: float = 10.0) -> None:
        b = spec.bounds
        self._lo_n: int = b.min_batch_size
        self._ceiling: int = b.max_batch_size
        self._lo_d: float = b.min_queue_delay_microseconds / 1e6
        self._ladder = delay_ladder(self._lo_d, b.max_queue_delay_microseconds / 1e6)
        self._slo_s: float = spec.latency_slo_p99_ms / 1000.0
        self._window_s = window_s
        self._incumbent = self._clip(initial)
        self._params = self._incumbent
        self._changes = 0
        self._feasible = True
        self._settled = False
        self._rejected: set[TuningParams] = set()
        self._momentum: str | None = None  # the kind of the last move that won
        self._backoff_dir = 0  # +1 / -1: the size was last backed off up / down
        self._inc_meas: Measurement | None = None
        self._ref: Measurement | None = None  # the incumbent's figures when the search settled
        self._pending: Decision | None = None
        self._epoch: Epoch | None = None
        self._in_server = 0  # items arrived and not yet executed
        self._batches: deque[tuple[int, float]] = deque(maxlen=FIT_BATCHES)
        self._answers: deque[tuple[float, float]] = deque()  # (time, latency) for snapshot()
        self._items: deque[tuple[float, int]] = deque()  # (time, batch size) for snapshot()
        self._first_seen: float | None = None
        self._epoch_count = 0

    # -- what the batcher reports ------------------------------------------------------------
    def record_arrival(self, n_items: int, now: float) -> None:
        """An admitted request entered the queue (each one must later leave in a batch)."""
        self._epoch_at(now).add_arrival(n_items, self._in_server > 0, now)
        self._in_server += n_items

    def record_batch(self, size: int, compute_s: float, now: float) -> None:
        """A batch of `size` items finished executing after `compute_s` seconds."""
        self._epoch_at(now).add_batch(size, compute_s, now)
        self._in_server = max(0, self._in_server - size)
        self._batches.append((size, compute_s))
        self._items.append((now, size))

    def record_request(self, latency_s: float, queue_wait_s: float, now: float) -> None:
        """A request was answered `latency_s` after it arrived (`queue_wait_s` of it queued)."""
        self._epoch_at(now).add_request(latency_s, queue_wait_s, now)
        self._answers.append((now, latency_s))

    def record_drop(self, n_items: int, now: float) -> None:
        """Admitted items left without being executed (queue timeout, cancel, failed batch)."""
        self._in_server = max(0, self._in_server - n_items)

    # -- control ------------------------------------------------------------------------------
    @property
    def params(self) -> TuningParams:
        return self._params

    def lower_ceiling(self, max_batch_size: int, now: float) -> None:
        """Never use batches larger than `max_batch_size` (not below the bounds' minimum) again, e.g.
        after running out of memory. `params` changes at once, so the batcher can apply it right
        away; the next `step` returns the Decision (reason "ceiling") for the log."""
        self._ceiling = max(self._lo_n, min(self._ceiling, max_batch_size))
        if self._params.max_batch_size > self._ceiling or self._incumbent.max_batch_size > self._ceiling:
            self._incumbent = self._clip(self._incumbent)
            self._pending = self._move(self._incumbent, "ceiling", now, {"ceiling": self._ceiling})
            self._reopen()

    def step(self, now: float) -> Decision | None:
        """Run the policy; returns a Decision when the parameters (or the SLO verdict) change."""
        if self._pending is not None:
            decision, self._pending = self._pending, None
            return decision
        self._forget(now)
        epoch = self._epoch_at(now)
        if epoch.backlog_at_settle is None and now >= epoch.settled_at:
            epoch.backlog_at_settle = self._in_server
        if (low := self._low_load(epoch, now)) is not None:
            return low
        if self._feasible and self._hopeless():
            return self._declare_infeasible(epoch.measure(now), now)
        violating = now >= epoch.settled_at + 0.1 and epoch.violating(self._in_server, now)
        if violating and (backoff := self._on_violation(epoch.measure(now), now)) is not None:
            return backoff
        if not self._epoch_done(epoch, now):
            return None
        m = epoch.measure(now)
        if self._params != self._incumbent:  # a trial ends
            if self._wins(m, self._inc_meas):
                self._rejected.add(self._incumbent)
                self._momentum = self._kind(self._incumbent, self._params)
                self._incumbent, self._inc_meas = self._params, m
            else:
                self._rejected.add(self._params)
        else:
            self._inc_meas = m
            if self._settled and self._moved(m):
                self._reopen()
            if (flip := self._verdict(m, now)) is not None:
                return flip
            if self._settled:
                self._new_epoch(now)
                return None
        return self._next(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        """Figures for `GET /v2/models/{m}/batching` over the last `window_s` seconds."""
        self._forget(now)
        span = max(min(self._window_s, now - (self._first_seen if self._first_seen is not None else now)), 1e-9)
        lat = [x for _, x in self._answers]
        fit = self._fit()
        return {
            "slo_feasible": self._feasible,
            "latency_model": None
            if fit is None
            else {"a_ms_per_item": round(fit.a_s * 1e3, 4), "b_ms": round(fit.b_s * 1e3, 4)},
            "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 3) if lat else None,
            "throughput_rps": round(len(lat) / span, 2),
            "items_per_s": round(sum(n for _, n in self._items) / span, 2),
            "changes": self._changes,
            "state": "settled" if self._settled else "warmup" if self._epoch_count <= 1 else "exploring",
        }

    # -- policy -------------------------------------------------------------------------------
    def _low_load(self, epoch: Epoch, now: float) -> Decision | None:
        """Stop waiting for company that does not come (one client alone, a trickle of requests)."""
        delay = self._params.max_queue_delay_s
        if delay <= self._lo_d or epoch.items_arrived < 20:
            return None
        rate = epoch.items_arrived / max(now - epoch.settled_at, 1e-9)
        company = _company(rate, epoch.accompanied / epoch.items_arrived, delay)
        if company >= LOW_LOAD_COMPANY:
            return None
        self._incumbent = replace(self._incumbent, max_queue_delay_s=self._lo_d)
        self._reopen()
        return self._move(self._incumbent, "low-load", now, {"arrival_rate": round(rate, 2), "company": company})

    def _on_violation(self, m: Measurement, now: float) -> Decision | None:
        """The p99 is over the SLO in this epoch: leave a trial at once, else back off."""
        trial = self._params != self._incumbent
        if trial and self._inc_meas is not None and self._inc_meas.p99_s <= self._slo_s:
            self._rejected.add(self._params)
            return self._move(self._incumbent, "slo-violation", now, self._figures(m))
        if trial or not self._feasible:
            return None  # both miss: the trial is judged on p99 at its end; or a lost cause
        safer = self._backoff(m)
        if safer is None:
            return None  # nothing left to back off to: the search decides at the epoch's end
        self._incumbent, self._inc_meas = safer, None
        self._reopen()
        return self._move(safer, "slo-violation", now, self._figures(m))

    def _backoff(self, m: Measurement) -> TuningParams | None:
        """Multiplicative decrease of the latency: drop the delay to its minimum; else double the
        size when the executor is the bottleneck (the queue is what is slow), else halve it (the
        batches are). Never reverses an earlier backoff before the search has settled again."""
        p = self._params
        if p.max_queue_delay_s > self._lo_d:
            return replace(p, max_queue_delay_s=self._lo_d)
        queued_s = m.mean_wait_s
        short_of_capacity = (
            m.utilization >= 0.9
            or m.arrival_rate > 1.05 * m.items_per_s
            or queued_s > 2 * (m.mean_s - queued_s)
            # Batches leave full from a busy executor: the size limit binds, and halving it would only
            # lengthen the queue. (The executor may never look 90% busy when it shares its core with
            # the HTTP stack, as on a 1-core server: 80-88% measured live.)
            or (m.full_share >= FULL_SHARE and m.utilization >= BUSY)
        )
        direction = 1 if short_of_capacity else -1
        n = p.max_batch_size * 2 if short_of_capacity else p.max_batch_size // 2
        safer = self._clip(replace(p, max_batch_size=n))
        if safer == p or direction == -self._backoff_dir:
            return None
        self._backoff_dir = direction
        return safer

    def _next(self, now: float) -> Decision | None:
        """Start the next trial, or settle on the incumbent when none is left."""
        assert self._inc_meas is not None
        candidates = self._candidates(self._inc_meas)
        if candidates:
            kind, cand = candidates[0]
            jump = cand.max_batch_size / self._params.max_batch_size
            if not 0.5 <= jump <= 2:  # the batch size moves at most x2 per change: via the incumbent
                kind, cand = "revert", self._incumbent
            return self._move(cand, kind, now, self._figures(self._inc_meas))
        self._settled, self._ref, self._backoff_dir = True, self._inc_meas, 0
        if self._params != self._incumbent:
            return self._move(self._incumbent, "settled", now, self._figures(self._inc_meas))
        self._new_epoch(now)
        return self._verdict(self._inc_meas, now)

    def _candidates(self, m: Measurement) -> list[tuple[str, TuningParams]]:
        """Untried neighbours of the incumbent that the model does not rule out, best bets first."""
        inc = self._incumbent
        n, d = inc.max_batch_size, inc.max_queue_delay_s
        below = [x for x in self._ladder if x < d]
        above = [x for x in self._ladder if x > d]
        moves = [
            ("explore-down:delay-min", replace(inc, max_queue_delay_s=self._lo_d)),
            ("explore-down:delay", replace(inc, max_queue_delay_s=below[-1] if below else d)),
        ]
        # The size limit only matters if batches reach it (up) or exceed half of it (down).
        if m.largest_batch >= n:
            moves.insert(0 if m.utilization >= 0.85 else 2, ("explore-up:size", replace(inc, max_batch_size=n * 2)))
        if m.largest_batch > n // 2:
            moves.append(("explore-down:size", replace(inc, max_batch_size=n // 2)))
        if above and _company(m.arrival_rate, m.company_share, above[0]) >= EXPLORE_COMPANY:
            moves.append(("explore-up:delay", replace(inc, max_queue_delay_s=above[0])))
        moves.sort(key=lambda km: km[0] != self._momentum)
        seen = {inc} | self._rejected
        out = []
        for kind, cand in moves:
            cand = self._clip(cand)
            if cand not in seen and self._plausible(cand, m):
                seen.add(cand)
                out.append((kind, cand))
        return out

    def _plausible(self, cand: TuningParams, m: Measurement) -> bool:
        """False when the model predicts the candidate misses the SLO (only while it is met).

        Its best case (window plus one typical batch) must fit, and with a real fit (several batch
        sizes seen) it must keep up with the arrival rate. Its p99 prediction, scaled by how far
        the prediction is off at the incumbent, must fit too where the open-loop model holds: with
        an executor that has slack (a closed loop at capacity pins the arrival rate to the
        throughput, where the model sees a queue on the edge of instability)."""
        fit = self._fit()
        if fit is None or not self._feasible:
            return True
        pred = predict(cand, m.arrival_rate, fit)
        if pred.floor_s > self._slo_s * TRIAL_MARGIN or not (fit.one_size or math.isfinite(pred.p99_s)):
            return False
        here = predict(self._incumbent, m.arrival_rate, fit).p99_s
        if fit.one_size or m.utilization >= 0.8 or not math.isfinite(here):
            return True
        correction = min(max(m.p99_s / here, 0.5), 3.0)
        return pred.p99_s * correction <= self._slo_s

    def _wins(self, t: Measurement, inc: Measurement | None) -> bool:
        """Did the trial beat the incumbent? (p99 first, then items/s, mean latency, waiting)."""
        if inc is None:
            return False
        inc_ok = inc.p99_s <= self._slo_s
        if t.p99_s > self._slo_s * (TRIAL_MARGIN if inc_ok else 1.0):
            return not inc_ok and t.p99_s < 0.95 * inc.p99_s  # both miss: lower p99 wins
        if not inc_ok:
            return True
        band = max(0.02, 3.0 / math.sqrt(max(1, min(t.completed, inc.completed))))
        if abs(t.items_per_s - inc.items_per_s) > band * inc.items_per_s:
            return t.items_per_s > inc.items_per_s
        if abs(t.mean_s - inc.mean_s) > max(0.03 * inc.mean_s, 3 * math.hypot(t.mean_se, inc.mean_se)):
            return t.mean_s < inc.mean_s
        return t.params.max_queue_delay_s < inc.params.max_queue_delay_s

    def _verdict(self, m: Measurement, now: float) -> Decision | None:
        """Flip the SLO verdict on the incumbent's figures: infeasible when it misses the SLO once
        the search has settled, feasible again once it meets the SLO with margin."""
        if self._feasible and self._settled and m.p99_s > self._slo_s:
            return self._declare_infeasible(m, now)
        if not self._feasible and not self._hopeless() and m.p99_s <= TRIAL_MARGIN * self._slo_s:
            self._feasible = True
            return Decision(self._params, "feasible", self._figures(m), changed=False)
        return None

    def _hopeless(self) -> bool:
        """Even one smallest batch alone, without window or queue, takes longer than the SLO."""
        fit = self._fit()
        return fit is not None and not fit.one_size and fit(self._lo_n) > self._slo_s

    def _declare_infeasible(self, m: Measurement, now: float) -> Decision:
        """From here on the search minimises p99; nothing waits in vain for a lost cause."""
        self._feasible = False
        if self._params.max_queue_delay_s > self._lo_d:
            self._incumbent = replace(self._incumbent, max_queue_delay_s=self._lo_d)
            self._reopen()
            decision = self._move(self._incumbent, "infeasible", now, self._figures(m))
            assert decision is not None
            return decision
        return Decision(self._params, "infeasible", self._figures(m), changed=False)

    def _moved(self, m: Measurement) -> bool:
        """Has the load or the model's speed changed enough since settling to search again?"""
        ref = self._ref
        if ref is None:
            return False
        noise = 3.0 / math.sqrt(max(1, min(m.completed, ref.completed)))
        rate_moved = abs(m.arrival_rate - ref.arrival_rate) > max(CHANGE_TRIGGER, noise) * ref.arrival_rate
        latency_moved = abs(m.mean_s - ref.mean_s) > max(CHANGE_TRIGGER, noise) * ref.mean_s
        return rate_moved or latency_moved

    def _reopen(self) -> None:
        self._rejected.clear()
        self._settled, self._ref, self._momentum = False, None, None

    # -- helpers ------------------------------------------------------------------------------
    def _forget(self, now: float) -> None:
        horizon = now - self._window_s
        for q in (self._answers, self._items):
            while q and q[0][0] < horizon:
                q.popleft()

    def _fit(self) -> LatencyFit | None:
        if not self._batches:
            return None
        arr = np.asarray(self._batches, dtype=float)
        return fit_batch_latency(arr[:, 0], arr[:, 1])

    def _clip(self, p: TuningParams) -> TuningParams:
        n = min(max(int(p.max_batch_size), self._lo_n), self._ceiling)
        d = min(max(float(p.max_queue_delay_s), self._ladder[0]), self._ladder[-1])
        return TuningParams(n, d)

    @staticmethod
    def _kind(old: TuningParams, new: TuningParams) -> str:
        if new.max_batch_size != old.max_batch_size:
            return "explore-up:size" if new.max_batch_size > old.max_batch_size else "explore-down:size"
        return "explore-up:delay" if new.max_queue_delay_s > old.max_queue_delay_s else "explore-down:delay"

    def _move(self, to: TuningParams, kind: str, now: float, detail: dict[str, Any]) -> Decision | None:
        """Put `to` in force and start measuring it. `kind` is "reason" or "reason:knob"."""
        reason, _, knob = kind.partition(":")
        self._new_epoch(now)
        if to == self._params:
            return None
        detail = {"from": _params_dict(self._params), **({"knob": knob} if knob else {}), **detail}
        self._params = to
        self._changes += 1
        return Decision(to, reason, detail)

    def _figures(self, m: Measurement) -> dict[str, Any]:
        fit = self._fit()
        return {
            "p99_ms": round(m.p99_s * 1e3, 3) if math.isfinite(m.p99_s) else None,
            "mean_ms": round(m.mean_s * 1e3, 3) if math.isfinite(m.mean_s) else None,
            "queue_wait_ms": round(m.mean_wait_s * 1e3, 3) if math.isfinite(m.mean_wait_s) else None,
            "slo_ms": self._slo_s * 1e3,
            "items_per_s": round(m.items_per_s, 2),
            "arrival_rate": round(m.arrival_rate, 2),
            "utilization": round(m.utilization, 3),
            "a_ms_per_item": round(fit.a_s * 1e3, 4) if fit else None,
            "b_ms": round(fit.b_s * 1e3, 4) if fit else None,
        }

    def _epoch_at(self, now: float) -> Epoch:
        if self._epoch is None:
            self._new_epoch(now, settle=0.0)
        assert self._epoch is not None
        return self._epoch

    def _new_epoch(self, now: float, settle: float | None = None) -> None:
        if settle is None:
            recent = self._inc_meas.p99_s if self._inc_meas and math.isfinite(self._inc_meas.p99_s) else 0.0
            settle = min(max(3 * recent, SETTLE_S[0]), SETTLE_S[1])
        self._epoch = Epoch(self._params, now, now + settle, self._slo_s)
        self._epoch_count += 1
        if self._first_seen is None:
            self._first_seen = now

    def _epoch_done(self, epoch: Epoch, now: float) -> bool:
        elapsed = now - epoch.settled_at
        enough = len(epoch.latencies) >= MIN_ANSWERS
        return (elapsed >= MEASURE_S and enough) or (elapsed >= MAX_MEASURE_S and len(epoch.latencies) >= 10)


def _company(rate: float, share: float, delay_s: float) -> float:
    """Expected other requests arriving within `delay_s` of a batch's first one. Only arrivals that
    found others in the server count (`share`): a lone closed-loop client never keeps itself company."""
    return rate * share * delay_s


def _params_dict(p: TuningParams) -> dict[str, Any]:
    return {"max_batch_size": p.max_batch_size, "max_queue_delay_us": round(p.max_queue_delay_s * 1e6)}
