"""The search between breaks: after each measured epoch, the next probe or plan, a remembered setting for a
population seen before, a delay dropped for a trickle of requests, a fallen population read early, and settling.
"""

from __future__ import annotations

from dataclasses import replace

from batchpilot.runtime.autotune_model import (
    Epoch,
    Measurement,
    TuningParams,
    Workload,
    read_workload,
)
from batchpilot.runtime.tuner.breaks import BreakRules
from batchpilot.runtime.tuner.knobs import (
    ALONE_BUSY,
    CHANGE_TRIGGER,
    FELL_ARRIVALS,
    FELL_BATCHES,
    FULL_SHARE,
    GAIN,
    LOAD_MOVED,
    LOW_LOAD_COMPANY,
    PLAN_TRIALS,
    REMEMBERED,
)
from batchpilot.runtime.tuner.readings import expected_company, more_clients, same_population
from batchpilot.runtime.tuner.state import Decision


class Search(BreakRules):
    """The search for the best setting while the SLO holds."""

    def _low_load(self, epoch: Epoch, now: float) -> Decision | None:
        """Stop waiting for company that does not come (one client alone, a trickle of requests),
        unless a plan chose this delay knowing the load."""
        delay = self._params.max_queue_delay_s
        if delay <= self._lo_d or epoch.items_arrived < 20 or self._params == self._planned:
            return None
        rate = epoch.items_arrived / max(now - epoch.settled_at, 1e-9)
        company = expected_company(rate, epoch.accompanied / epoch.items_arrived, delay)
        if company >= LOW_LOAD_COMPANY:
            return None
        fit = self._memory.fit()
        if fit is not None and rate * fit(1) > ALONE_BUSY:
            # Not a trickle: answered one at a time, these arrivals would keep the executor busy, and the batches of
            # a few that the delay gathers are what keeps its queue short (live, a Poisson load at half resnet-mini's
            # capacity: 16 / 2 ms -> 16 / 0 ms here gave p99 52-57 ms, batches of 2, where 16 / 5 ms holds 24).
            return None
        w = read_workload(epoch.measure(now, self._in_server))
        if w.grouped:
            # Clients that wait on each other's batch come back together, not as a Poisson trickle: the
            # plan decides (live, 2 clients lost 27% when this rule dropped the delay that paired them).
            return None
        self._incumbent = replace(self._incumbent, max_queue_delay_s=self._lo_d)
        self._reopen()
        return self._move(self._incumbent, "low-load", now, {"arrival_rate": round(rate, 2), "company": company})

    def _fell(self, epoch: Epoch, now: float) -> Decision | None:
        """A closed loop whose population fell within the epoch: since its latest FELL_BATCHES batches, the most in
        the server at an arrival is another load than the incumbent's clients (`more_clients`), arriving LOAD_MOVED x
        slower. The search starts over from a short epoch (QUICK_S) that measures the new population, not from the end
        of this one, which the old setting may hold for seconds at a fraction of what the new load could get: live,
        textcls back from 32 to 2 clients under 32 / 8 ms served 150-200 req/s for 2.5 s (the epoch's end and a
        remembered setting's probe) where 2 / 8 ms served 700. A trial in force stays without a verdict, as one judged
        at another load does (`_judged_elsewhere`; live, a merge probe begun 0.4 s before such a step held the old
        setting 3 s longer), and a plan asked for the old load no longer applies."""
        inc = self._inc_meas
        if inc is None or epoch is self._quick:
            return None
        recent = epoch.since_batches(FELL_BATCHES, now)
        w = read_workload(inc)
        if recent is None or not w.closed:
            return None
        peak, rate, arrivals = recent
        if arrivals < FELL_ARRIVALS or not more_clients(w.clients, peak) or LOAD_MOVED * rate > inc.arrival_rate:
            return None
        self._outstanding = None
        self._start_over(now, settle=0.0)
        self._quick = self._epoch
        detail = {"clients": w.clients, "in_server_peak": peak, "arrival_rate": round(rate, 2)}
        return Decision(self._params, "load-fell", detail, changed=False)

    def _fill_or_settle(self, m: Measurement, w: Workload, now: float) -> Decision | None:
        """Before settling, a closed loop on one core whose batches leave short of its clients tries the next longer
        delay once per search (a trial: given back within its epoch if it loses; kept, it may be followed by the
        next). There the clients of a batch come back over the front-ends' time, which the plan's turn-taking model
        does not see: live at 32 clients, resnet-mini's 32 / 2 ms formed batches of 16 (815 items/s, p99 57 ms) where
        32 / 5 ms formed batches of 32 (1,062, p99 36.5), and every re-plan found nothing better than 32 / 2 ms. (With
        several cores the closed-loop plan simulates the clients' returns itself.)"""
        short = self._short_on_one_core(m, w)
        longer = self._longer(self._to_the_clients(self._incumbent, m, w)) if short else None
        if longer is not None and longer not in self._rejected:
            return self._move(longer, "probe:delay", now, self._figures(m))
        return self._settle(m, now)

    def _next(self, now: float) -> Decision | None:
        """Jump to the plan's pick, probe for a fit, or settle on the incumbent."""
        m = self._inc_meas
        assert m is not None
        w = read_workload(m)
        if not w.closed and self._in_server / max(m.items_per_s, 1e-9) > self._slo_s:
            self._new_epoch(now)  # an open loop's queue is long: no trial now, measure again
            return None
        if self._others_trying:
            self._new_epoch(now)  # another model on the core tries a setting: one trial at a time
            return None
        if (room := self._headroom(m, w)) is not None:
            return self._make_room(room, m, now)
        if (recalled := self._recall(m, w)) is not None:
            setting, served = recalled
            return self._move(setting, "probe:remembered", now, {**self._figures(m), "remembered_items_per_s": served})
        fit = self._memory.fit()
        # A closed loop whose batches hold every client under a limit above them waits out the delay for no one more:
        # a limit of its batches lets each leave as it fills (live, 2 clients under 16 / 2 ms: 208 req/s where 2 / 5
        # ms served 371; its batches all of one size, no plan ever moved it). It is probed whatever the fit: the shape
        # timed alone at load makes a single size's fit a line, and the plan may miss what waiting out the delay costs
        # (live, run AX: 8 clients under 16 / 2 ms served 823 req/s for a whole level, one plan asked and nothing
        # tried, where 8 / 2 ms served 1,087-1,124).
        gathered = w.closed and w.clients <= m.largest_batch < self._incumbent.max_batch_size
        if fit is not None and (fit.one_size or gathered) and not self._probed and m.arrival_rate > 0:
            self._probed = True
            n = self._incumbent.max_batch_size
            # Up only when more items than the limit were in the server at once (else larger batches cannot
            # form: 16 clients under a limit of 16 keep filling batches of 16); otherwise below the batches
            # seen (a closed loop of fewer clients than the limit fills every batch with all of them).
            up = m.largest_batch >= n and m.peak_in_server > n
            size = n * 2 if up else m.largest_batch if gathered else min(n, m.largest_batch) // 2
            probe = self._clip(replace(self._incumbent, max_batch_size=size))
            # Narrowed to its clients, the limit releases a batch when the last of them is back, so the delay must
            # outlast their return as a wider limit's does (live, 8 clients: 16 / 2 -> 8 / 2 ms split them into
            # batches of 4, 685 items/s against 861, where 8 / 5 ms served 1,002-1,070).
            probe = self._merging(probe, m, w) if up or gathered else probe
            # A frugal loop does not probe down: halving its batches beside another model broke both SLOs live. A
            # limit in force lately brought no other size (batches under a limit need not fill it: 32 clients formed
            # batches of 16 under 16 and 32 alike, and the probe to 32 came back after every reopen, live).
            lately = self._put_lately(probe.max_batch_size, now)
            # Nor does a closed loop on one core probe below the batches it forms (`_smaller`): live, 32 clients
            # forming batches of 16 under 32 / 4 ms probed 8 / 4 ms and broke the SLO at once (p99 64 ms, 523 items/s).
            down_ok = not self._frugal(m, w) and not self._below_the_batches(probe, m, w)
            if probe != self._incumbent and not lately and (up or down_ok):
                return self._move(probe, "probe:size", now, self._figures(m))
        # A one-size fit after the search's probe: the clients outgrew the batches the probe measured (live, a probe
        # from 16 / 2 to 8 / 8 ms at 8 clients, judged as the load rose to 16: settled at 8 / 8 ms, 1,410-1,630
        # req/s where 16 / 8 ms served 1,720-1,880, side by side).
        if fit is not None and (not fit.one_size or self._probed) and (wider := self._wider(m, w, now)) is not None:
            return self._move(wider, "probe:wider", now, self._figures(m))
        if (
            fit is not None
            and not fit.one_size
            and m.arrival_rate > 0
            and self._trials < PLAN_TRIALS
            and not self._plan_fruitless(w, now)
        ):
            return self._request_plan(fit, w, m, now, violation=False)
        return self._fill_or_settle(m, w, now)

    def _headroom(self, m: Measurement, w: Workload) -> TuningParams | None:
        """An open loop within the SLO on a saturated core whose batches leave full: its limit binds, and it is served
        at that limit's capacity, so a few percent more arrivals, or a slower stretch of the host, grow its queue.
        Returns the incumbent with the limit doubled at the same delay, to try before a break (a trial: given back
        within its epoch if it loses, `_confirms`); None where that setting was given back, its size lost, or its
        batches served measurably less than a smaller limit's (`_outpaced`), and for a held infeasible loop. Live (runs
        BA2 and BB, Poisson at 95% of 32 / 2 ms's capacity, one core), 16 / 2 ms met the SLO for its first seconds, then
        full batches of 16 served 1,147-1,177 items/s against 1,185-1,248 arriving, and the queue gathered before the
        first break broke the row (p99 229-430 ms; static 32 / 2 ms held 26-33)."""
        if w.closed or not self._feasible or m.p99_s > self._slo_s or not self._saturated(m):
            return None  # (on a core not saturated the plan sees the limit's capacity: `_content` holds none back)
        # Only where the batches show it. Doubled on the fit's word alone (the arrivals past OPEN_HEADROOM of the
        # limit's fitted capacity, its batches short of it), the limit went on from 32 to 64 in 6 of 12 rows at 95% load
        # (runs BC2 and BC3), and every such trial broke the SLO, given back at once or held at 64 / 2 ms through
        # breaks. (Read before the paces below: this runs at every epoch's end.)
        if m.full_share < FULL_SHARE:
            return None
        n = self._incumbent.max_batch_size
        wider = self._clip(replace(self._incumbent, max_batch_size=2 * n))
        size = wider.max_batch_size
        # Nor a limit given up after its breaks (`_revisit`) while the arrivals have not risen by CHANGE_TRIGGER since.
        up = self._given_up
        if up is not None and up[0] == wider and m.arrival_rate < (1 + CHANGE_TRIGGER) * up[1]:
            return None
        if size <= n or wider in self._rejected or size in self._lost_sizes or self._outpaced(size, m) is not None:
            return None
        return wider

    def _make_room(self, room: TuningParams, m: Measurement, now: float) -> Decision | None:
        """Try `_headroom`'s doubled limit; its trial is judged on what it was tried for (`_confirms`)."""
        self._roomier = room
        return self._move(room, "probe:headroom", now, self._figures(m))

    def _remerge(self, m: Measurement, w: Workload) -> TuningParams | None:
        """A settled closed loop on one core whose batches held every client (or the limit) when it settled and leave
        short of them now: one late request split the group in two, and a delay shorter than the groups' distance keeps
        them apart for good, at the same clients and setting (so `_moved` may not see it). The incumbent with the
        ladder's first delay of at least a batch's cycle (as `_merging`), tried once: live, textcls at 16 clients
        under 16 / 2 ms served 1,850-1,920 items/s in batches of 16.0 for 10 s, then 1,510-1,650 in batches of 9 and
        7 for the rest of the run, settled, where 16 / 8 ms formed batches of 16.0 (1,720-1,880 req/s)."""
        ref, p = self._ref, self._incumbent
        if ref is None or not self._short_on_one_core(m, w):
            return None
        was = read_workload(ref)
        # The same population, in a group that can part: a population read one higher (1 client read as 2, live) makes
        # no split of a batch of one.
        if self._short(p, ref, was) or not same_population(was.clients, w.clients) or ref.mean_batch < 2:
            return None
        merge = self._longer(p, at_least=self._cycle(m))
        return None if merge is None or merge in self._rejected else merge

    def _recall(self, m: Measurement, w: Workload) -> tuple[TuningParams, float] | None:
        """A closed loop back at a population (within 10%) an earlier search settled for within the SLO: that setting
        (the padding budget in force kept), if it then served GAIN more items/s than the incumbent serves now, and
        unless it lost in this search. A trial like any other, given back within its epoch if it loses. A plan for
        the population comes back through the load's change, and it can miss what the search measured: live (run
        AP1), resnet-mini back from 32 to 2 clients planned 2 / 2 ms (predicted 343 items/s, measured 508), where the
        same server had settled at 2 / 8 ms serving 620 half a minute before, and held 2 / 2 ms for the rest of the
        step (91% of the static best)."""
        if not w.closed:
            return None
        near = [(abs(c - w.clients), c) for c in self._remembered if same_population(c, w.clients)]
        if not near:
            return None
        setting, served = self._remembered[min(near)[1]]
        setting = self._clip(replace(setting, max_padding_waste=self._incumbent.max_padding_waste))
        if setting == self._incumbent or setting in self._rejected or served <= (1 + GAIN) * m.items_per_s:
            return None
        return setting, served

    def _remember(self, m: Measurement) -> None:
        """The setting a closed loop's search settles on within the SLO, for when its population comes back."""
        w = read_workload(m)
        if w.closed and self._feasible and m.p99_s <= self._slo_s:
            self._remembered.pop(w.clients, None)
            self._remembered[w.clients] = (self._incumbent, round(m.items_per_s, 2))
            while len(self._remembered) > REMEMBERED:
                del self._remembered[next(iter(self._remembered))]

    def _settle(self, m: Measurement, now: float) -> Decision | None:
        self._remember(m)
        self._settled, self._ref, self._backoff_dir, self._raised = True, m, 0, None
        self._new_epoch(now)
        return self._verdict(m, now)
