"""Online autotuner of one batcher's max batch size and queue delay against a p99 latency SLO.

Pure and clock-injected: the batcher reports arrivals, batches and answers with their time, and
calls `step(now)` every ~0.25 s; nothing here reads a clock, sleeps or draws a random number.

Policy, in short. The tuner measures the setting in force over an *epoch* (a short settling time
after a change, then >= 1.5 s and >= 100 answers). It decides from a model, not by trial and error:
d(n) = a*n + b fitted on recent batches, and the load read from the same epoch, go to the queue model
(`batch_planner`), which predicts items/s and p99 for every (size, delay) within the bounds. The load
is a *closed loop* (a fixed population of clients, each sending again a think time after its answer,
so the setting decides the rate: the most items/s wins) when the clients spend at least as long in the
server as outside it and the arrivals follow the answers, else *open* (a given arrival rate: every stable
setting serves it, the lowest p99 wins). The tuner jumps to the predicted best; one measurement epoch
confirms it: a planned setting stays unless it measurably serves fewer items/s or a clearly longer tail
than the setting it replaced, and a loser is given back at the epoch's end (at once when it breaks the SLO). The
prediction's error at the incumbent corrects the others' predicted p99. With nothing better
predicted the tuner is settled and makes no changes until the load or the latency moves by 30%.
No trial starts while an open-loop queue holds more than the SLO's worth of work, nor while an open loop within the
SLO runs on a saturated core (its objective is met: every stable setting serves its arrivals); there no plan lengthens
an open loop's delay either. The one exception is headroom (`_headroom`): where such a loop's batches leave full, the
doubled limit at the same delay is tried before a break, and kept within the trial margin whatever the incumbent's tail
(read at the edge of its capacity).
Before a fit over several batch sizes exists, one probe (size x2 or /2) supplies one.
A closed loop whose clients could fill batches of twice the largest size fitted or more measures the largest
such size once (`_wider`, a trial; at an SLO break, before any re-plan): a line is not trusted far beyond its sizes.
On one core that probe waits at least a cycle of the old full batches (`_merging`), so the groups they formed merge; it
is not taken (nor is the limit doubled by a backoff) where they cannot merge within the delay's bound (`_apart`). A
settled closed loop on one core whose full batches split (a late request; the same clients and setting) tries that delay
once (`_remerge`).
A p99 over the SLO (or a queue growing past the SLO's worth of work) is answered at once, unless it is an open loop's
that the p99 over the last window absorbs (a stall's, not severe; measured again as its answers come): a trial is
abandoned; the incumbent is re-planned with its measured tail (which scales every predicted one) and gives way to the
plan's pick (never one that broke the SLO since an epoch last met it; an open loop's pick never keeps a limit its full
batches leave a queue behind, nor grows it past twice the largest batch fitted, nor lowers its limit or the delay that
gathers its batches unless the core is idle; a
closed loop's predicted p99 is never below its clients' round trip in the server, by Little's law). With nothing
predicted to do better, a first break is measured again from after it (a stall passes; the setting was the best
known), unless an open loop's full batches serve less than arrives; a second before an epoch met the SLO with
margin, a tail over twice the SLO, a growing open-loop queue, or no fit over several sizes backs off
multiplicatively (the delay drops to its minimum unless it gathers an open loop's
batches on a busy core, or full batches leave a queue behind where the fit says a doubled limit serves more, else the
batch size doubles when the executor is the bottleneck or the core is not idle, but
not an open loop's whose full batches would serve its arrivals with room to spare, or halves when the batches are; a
closed loop's batches short of its clients take the delay its front-ends need to bring the missing items). An open
loop that breaks the SLO at three settings in a row is declared infeasible, and the one with the largest limit (then
the lowest tail) among them is held. A limit raised at an open loop's break with a queue standing is not raised again
while it drains that queue, nor within its first epoch, where the fit says a doubled limit serves no more.
One that breaks the SLO at REVISIT breaks no plan can better goes back to the limit it replaced, a trial judged against
the break (`_revisit`), unless that limit's full batches would serve the arrivals near their capacity or a queue grows.
On one core an open loop's plan prices each item's front-end CPU beside the executor's CPU fit, whose level comes from
the epoch's own batches (`readings.leveled`: a line over 30 s of sizes can miss what the batches in force cost now).
On one core, other models' executors and requests take a measured share of the core (`record_cpu`). Those
that publish how they run (`neighbour`, handed to the others' `set_neighbours`: closed loops planned on one
core) are simulated beside this model, and a plan then picks only settings that keep their SLOs too; the share
of the others not so described stretches this model's work instead. A closed loop on a saturated core shared
with others is *frugal*: no plan, probe, backoff or verdict moves it to a setting that batches fewer items (more
CPU per item, taken from the others); its backoff lengthens the delay (or the limit) towards full batches.
Plans are data (`plan_jobs.PlanJob`): solved inside `step` (`inline_plans`, the tests and the
simulator) or handed to the caller, who solves them off the event loop and returns the answer. When a delay would
gather less than one companion for a batch's first request and no plan chose it, the delay goes to its
minimum. When no setting meets the SLO, the plan minimises p99 instead and the SLO is reported infeasible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from batchpilot.runtime.autotune_model import (
    CpuReading,
    Measurement,
    TuningParams,
    read_workload,
)
from batchpilot.runtime.one_core_planner import Neighbour
from batchpilot.runtime.plan_jobs import PlanJob, Solved
from batchpilot.runtime.tuner.figures import fit_figures, incumbent_figures
from batchpilot.runtime.tuner.knobs import CHANGE_TRIGGER, IDLE_AFTER_S, TAIL_SLACK, TRIAL_MARGIN
from batchpilot.runtime.tuner.readings import cheaper, comparison_noise, more_clients, rate_moved
from batchpilot.runtime.tuner.search import Search
from batchpilot.runtime.tuner.state import Decision

__all__ = ["Autotuner", "Decision", "TuningParams"]


class Autotuner(Search):
    """Chooses `max_batch_size` and `max_queue_delay_s` within `spec.bounds` (see module doc)."""

    # -- what the batcher reports ------------------------------------------------------------
    def record_arrival(self, n_items: int, now: float, *, length: int = 0) -> None:
        """An admitted request entered the queue (each one must later leave in a batch); `length`: its
        sequence length (tokens per item) for an NLP model."""
        self._epoch_at(now).add_arrival(n_items, self._in_server, now)
        self._in_server += n_items
        self._last_arrival_at = now
        if length > 0 and self._incumbent.max_padding_waste is not None:
            self._lengths.append(length)

    def record_batch(
        self, size: int, compute_s: float, now: float, *, cpu_s: float | None = None, tokens: int = 0
    ) -> None:
        """A batch of `size` items finished executing after `compute_s` seconds (`cpu_s` of the executing
        thread's CPU time, when known; `tokens`: the token slots it computed, padding included, NLP)."""
        if tokens > 0:
            self._token_batches.append((tokens, compute_s if cpu_s is None else cpu_s))
        self._epoch_at(now).add_batch(size, compute_s, now, cpu_s)
        self._in_server = max(0, self._in_server - size)
        cpu = compute_s if cpu_s is None else cpu_s
        if self._memory.record(size, compute_s, cpu, now):
            self._count_first_pace(size, compute_s, cpu, now)
        self._items.append((now, size))

    def record_request(self, latency_s: float, queue_wait_s: float, now: float, *, front_s: float = 0.0) -> None:
        """A request was answered `latency_s` after it arrived in the queue (`queue_wait_s` of it queued), which it
        reached `front_s` after the front-end read it. The SLO holds the whole (its p99); the queue's models count
        from the queue."""
        self._epoch_at(now).add_request(latency_s, queue_wait_s, now, front_s=front_s)
        self._answers.append((now, latency_s + front_s))

    def record_cpu(
        self, process_cpu_s: float, now: float, *, others_exec_s: float = 0.0, others_items: int = 0
    ) -> None:
        """The process's CPU clock (all threads) read now: what front-ends and other models cost. With other
        models in the process, what their executors had spent by now (CPU seconds, items; cumulative)."""
        self._epoch_at(now).add_cpu(CpuReading(now, process_cpu_s, others_exec_s, others_items))

    def record_refusal(self, n_items: int, now: float) -> None:
        """The queue refused a request, full: arrivals beyond what it admits (an overloaded open loop's queue capped by
        its limit admits about what is served, so its admitted rate alone reads as keeping pace)."""
        self._epoch_at(now).add_refusal(n_items, now)

    def record_drop(self, n_items: int, now: float) -> None:
        """Admitted items left without being executed (queue timeout, cancel, failed batch)."""
        self._in_server = max(0, self._in_server - n_items)

    def set_neighbours(self, neighbours: Sequence[Neighbour], *, others_trying: bool = False) -> None:
        """The other models on this core as their tuners last published them (`neighbour`); `others_trying`:
        one of them has a trial in force (`trying`). Meanwhile this tuner starts none and does not act on an
        SLO break short of a severe one: the other's trial moves this model's figures (live, two models that
        tried settings at once each read the other's trial as its own loss or break)."""
        self._neighbours = tuple(neighbours)
        self._others_trying = others_trying

    def trying(self, now: float) -> bool:
        """A setting not yet confirmed is in force (a planned trial or a probe) while requests come. An idle
        model's trial moves no one's figures, and it would hold the others' searches until its load came back
        (live: a trial started as 64 clients left kept the next model's tuner from any search for its 84-s run)."""
        return self._params != self._incumbent and not self.idle(now)

    def idle(self, now: float) -> bool:
        """Nothing in the server and nothing arrived for `IDLE_AFTER_S`: the model takes none of the core."""
        return self._in_server == 0 and now - self._last_arrival_at > IDLE_AFTER_S

    def neighbour(self, now: float) -> Neighbour | None:
        """This model as the others on its core should plan beside it: a closed loop, once a one-core plan has
        calibrated its clients' time (None before, when its load is not one, or while it is idle). An idle model's
        last loop is not what runs: live, a model whose 64 clients had gone was still simulated beside the next
        model's 1-8 clients, whose plans came back 5-12 s late and predicted 107 items/s for their pick where the
        setting in force served 670."""
        base = self._calibrated
        if base is None or self.idle(now):
            return None
        m = self._inc_meas if self._inc_meas is not None and self._inc_meas.params == self._params else None
        return replace(
            base,
            params=replace(self._params, max_padding_waste=None),
            p99_s=m.p99_s if m is not None and math.isfinite(m.p99_s) else None,
            core_share=m.own_cpu if m is not None else base.core_share,
        )

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

    @property
    def feasible(self) -> bool:
        """The SLO verdict (False: declared infeasible, the lowest p99 is sought)."""
        return self._feasible

    @property
    def plan_job(self) -> PlanJob | None:
        """The plan this tuner waits for (only without `inline_plans`): solve it, then `plan_solved`."""
        return self._outstanding.job if self._outstanding is not None else None

    def plan_solved(self, job: PlanJob, solved: Solved | None, now: float) -> None:
        """The answer to `job` (None: it failed or took too long). The next `step` returns the decision.
        An answer to a plan no longer waited for (the setting changed meanwhile) is dropped. A break the answer leaves
        as it is shows in `unanswered_break` until the next step."""
        self._unanswer = None
        out = self._outstanding
        if out is None or out.job is not job:
            return
        self._outstanding = None
        if out.incumbent != self._incumbent or self._params != self._incumbent:
            return
        decision = self._after_plan(out, solved, now)
        if decision is not None:
            self._pending = decision

    def step(self, now: float) -> Decision | None:
        """Run the policy; returns a Decision when the parameters (or the SLO verdict) change."""
        self._unanswer = None
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
            return self._declare_infeasible(epoch.measure(now, self._in_server), now)
        violating = now >= epoch.settled_at + 0.1 and epoch.violating(self._in_server, now)
        if violating and (backoff := self._on_violation(epoch.measure(now, self._in_server), now)) is not None:
            return backoff
        if (fell := self._fell(epoch, now)) is not None:
            return fell
        if self._outstanding is not None or not self._epoch_done(epoch, now):
            return None  # (a plan asked for: its answer decides)
        m = epoch.measure(now, self._in_server)
        if m.p99_s <= self._slo_s:
            self._met_slo(m)
        if self._params != self._incumbent:  # a trial ends
            if self._inc_meas is not None and self._load_changed(m, self._inc_meas):
                return self._judged_elsewhere(m, self._inc_meas, now)
            if not self._confirms(m, self._inc_meas):
                self._rejected.add(self._params)
                if self._params.max_batch_size != self._incumbent.max_batch_size:
                    self._lost_sizes.add(self._params.max_batch_size)  # the model misjudges this size
                self._planned = None
                return self._move(self._incumbent, "revert", now, self._figures(m))
            was = self._inc_meas
            self._rejected.add(self._incumbent)
            self._incumbent, self._inc_meas = self._params, m
            return self._confirmed(m, was, self._next(now))
        else:
            self._inc_meas = m
            if self._settled and (self._moved(m) or self._beside_moved()):
                self._reopen()
            elif self._settled and (merge := self._remerge(m, read_workload(m))) is not None:
                self._reopen()
                return self._move(merge, "probe:merge", now, self._figures(m))
            elif self._settled and (room := self._headroom(m, read_workload(m))) is not None:
                self._reopen()
                return self._make_room(room, m, now)
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
        p99 = self._window_p99()
        return {
            "slo_feasible": self._feasible,
            "latency_model": fit_figures(self._memory.fit()),
            "cpu_latency_model": fit_figures(self._memory.fit(cpu=True)),
            "alone_latency_model": fit_figures(None if self._memory.alone is None else self._memory.alone.wall),
            "p99_ms": None if p99 is None else round(p99 * 1e3, 3),
            "throughput_rps": round(len(self._answers) / span, 2),
            "items_per_s": round(sum(n for _, n in self._items) / span, 2),
            "changes": self._changes,
            "state": "settled" if self._settled else "warmup" if self._epoch_count <= 1 else "exploring",
            "plan": self._plan_report(),
        }

    @property
    def unanswered_break(self) -> tuple[str, Measurement] | None:
        """Why the last step left an SLO break without a change (and the break's figures); None when it did not. Such
        holds are no decision, so the log shows them only through this: live (run AH), 8-23 s of silence while an
        overloaded open loop's queue grew to 1,000 requests and the queue's limit refused them."""
        return self._unanswer

    def _confirms(self, t: Measurement, inc: Measurement | None) -> bool:
        """Does the measured trial hold up against the incumbent? A planned setting stays unless it measurably loses: a
        broken SLO (or TRIAL_MARGIN of it) the incumbent kept, short of a closed loop served faster within the SLO;
        fewer items/s beyond the noise; the same items/s from a wider limit whose full batches ran measurably slower
        (`_paced_below`), or the same items/s with a clearly longer tail. (Both missing the SLO: the lower p99 stays.) A
        padding budget tried alone stays only if it cost the executor less time per item, the gain it was tried for."""
        if inc is None:
            return True
        inc_ok = inc.p99_s <= self._slo_s
        band = max(0.02, comparison_noise(t, inc))
        served_more = t.items_per_s > (1 + band) * inc.items_per_s
        if t.p99_s > self._slo_s * (TRIAL_MARGIN if inc_ok else 1.0):
            # A closed loop's round trip is its clients over the items/s served (Little's law): a trial that serves
            # more beyond the noise, its tail within the SLO, shortens it, whatever one short epoch's tail read beside
            # the incumbent's. Live (textcls, 64 clients, one core), 16 / 2 -> 64 / 10 ms served 1,818 items/s against
            # 1,651 at p99 48.1 ms (and 16 / 2 -> 32 / 10 ms 1,749 against 1,506 at 46.3), was given back for missing
            # TRIAL_MARGIN, and 16 / 2 ms then broke the SLO every 10 s for 40 s (p99 52-59 ms, 1,470-1,680 items/s).
            if not inc_ok:
                return t.p99_s < inc.p99_s
            return t.p99_s <= self._slo_s and read_workload(t).closed and served_more
        if not inc_ok:
            return True
        if replace(t.params, max_padding_waste=inc.params.max_padding_waste) == inc.params and not cheaper(t, inc):
            # An open loop's items/s follow its arrivals, whatever the budget: live (run AM's soak, textcls at 85%
            # load), 0.25 -> 0.5 was kept at 1.50 ms of executor time per item against 1.36, and 26 of the 40
            # decisions after it were SLO breaks (p99 57.4 ms over the soak).
            return False
        if t.items_per_s < (1 - band) * inc.items_per_s:
            return False
        if served_more:
            return True
        if self._paced_below(t, inc):
            return False  # (the same items/s within the count's noise, but its batches measurably slower)
        if t.params == self._roomier:
            # A limit tried for headroom is kept within the trial margin, whatever the incumbent's tail read: that
            # tail was measured at the edge of its capacity. Live (run BC1, textcls at 80% load, 16 / 2 ms at its
            # capacity), 32 / 2 ms read p99 33-38 ms against 16's 23-28 and was given back twice; 16 / 2 ms then read
            # p99 52-57 ms within 2.5 s each time.
            return True
        return t.p99_s <= TAIL_SLACK[0] * inc.p99_s + TAIL_SLACK[1]

    @staticmethod
    def _load_changed(t: Measurement, inc: Measurement) -> bool:
        """Did the trial's epoch see another load than the incumbent's? Closed loops: a population read at least
        LOAD_MOVED x the other and two clients apart (one client reads as two at times, live); open loops: an arrival
        rate moved as `_moved` counts it. (A closed loop's rate moves with the setting, its population does not.)
        One of each: a closed loop never holds more in the server than its clients, so an epoch whose peak held
        LOAD_MOVED x the closed loop's and two more saw another load. Live (run AN, textcls 32 -> 2 clients): the
        incumbent's epoch spanned the step (peak 32, read as open, 499 items/s), the plan's 8 / 1 ms at 2 clients
        served 429 and was given back, its next epoch at 32 / 8 ms 162. (A closed loop near capacity can read as
        open, with its own population as the peak: that alone is no other load.)"""
        tw, iw = read_workload(t), read_workload(inc)
        if tw.closed != iw.closed:
            closed, other = (tw, iw) if tw.closed else (iw, tw)
            return more_clients(other.clients, closed.clients)
        if tw.closed:
            few, many = sorted((tw.clients, iw.clients))
            return more_clients(many, few)
        return rate_moved(t, inc)

    def _judged_elsewhere(self, m: Measurement, was: Measurement, now: float) -> Decision:
        """A trial whose epoch saw another load than the incumbent's measurement: the comparison says nothing about
        either, so the trial stays in force without a verdict (no revert, nothing rejected) and the search starts over
        at the new load from it. Live, judged anyway: a probe from 16 / 2 to 8 / 8 ms at 8 clients kept as the load
        rose to 16 (1,410-1,630 req/s where 16 / 8 ms served 1,720-1,880); a plan's 8 / 9 ms at 8 clients given back
        as the load fell to 1, and rejected for the rest of the search; resnet-mini's wider probe to 32 / 10 ms kept
        as 16 clients became 32 and held at 64 (9% under 16-item batches there).
        A plan made for a closed loop whose trial then met an open one is given back instead (unjudged, nothing
        rejected): it was sized to clients that are gone, and an open loop on a busy core keeps the delay that gathers
        its batches. Live (run BE's second soak, textcls at 405.6 req/s), the 3-s closed-loop warm-up's plan 8 / 7 ms
        was kept this way; its 7-ms delay held for the whole soak, breaks doubled the limit to 64 under batches of 4-9,
        and the soak read p99 96.8 ms where 16 / 2 ms static read 51.1 beside it."""
        detail = {**self._figures(m), "knob": "load-moved", **incumbent_figures(was)}
        if self._params == self._planned and read_workload(was).closed and not read_workload(m).closed:
            self._inc_meas = None
            self._forget_load()
            back = self._move(self._incumbent, "revert", now, detail)
            assert back is not None  # (the trial is in force, not the incumbent)
            return back
        self._inc_meas = m
        self._start_over(now)
        return Decision(self._params, "trial-kept", detail, changed=False)

    def _confirmed(self, m: Measurement, was: Measurement | None, then: Decision | None) -> Decision:
        """A trial that held up against the incumbent, now the incumbent: its line (`trial-kept`, knob `confirmed`,
        both epochs' figures), or the next move's with the incumbent's figures beside it. Without one, a kept trial
        left no trace: live (run AF), a probe to 32 / 10 ms kept at 32 clients, then declared infeasible on its next
        epoch, read in the log as a probe followed by a verdict at the probe's setting."""
        beside = {} if was is None else incumbent_figures(was)
        if then is None:
            detail = {**self._figures(m), "knob": "confirmed", **beside}
            return Decision(self._params, "trial-kept", detail, changed=False)
        return replace(then, detail={**beside, **then.detail})

    def _moved(self, m: Measurement) -> bool:
        """Has the load or the model's speed changed enough since settling to search again?"""
        ref = self._ref
        if ref is None:
            return False
        latency_moved = abs(m.mean_s - ref.mean_s) > max(CHANGE_TRIGGER, comparison_noise(m, ref)) * ref.mean_s
        # Past the SLO the latency swings with the queue, not the model's speed: only the rate counts (a closed
        # loop's rate moves with its latency anyway).
        return rate_moved(m, ref) or (latency_moved and self._feasible)
