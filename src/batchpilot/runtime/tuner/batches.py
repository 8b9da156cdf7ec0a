"""What the executed batches say about a setting: how full they run, whether groups of closed-loop clients merge
or split within the delay, the pace each size limit served at, and whether the core is saturated or idle.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from batchpilot.runtime.autotune_model import (
    LatencyFit,
    Measurement,
    TuningParams,
    Workload,
    read_workload,
)
from batchpilot.runtime.batch_memory import FIT_MEMORY_S
from batchpilot.runtime.tuner.knobs import (
    BESIDE,
    FULL,
    FULL_SHARE,
    GAIN,
    IDLE,
    MEDIAN_SE,
    OPEN_HEADROOM,
    PACE_BATCHES,
    PACE_DRIFT,
    PACE_SETTLE_S,
    SATURATED,
    SLOWER,
    TRIAL_MARGIN,
)
from batchpilot.runtime.tuner.state import TunerState


def faster(pace: tuple[float, float], other: tuple[float, float], least: float = GAIN) -> bool:
    """Did batches at `pace` serve more items/s than those at `other` (each items/s and its relative noise, `_pace_of`),
    by more than `least` and twice the noise of the two?"""
    return pace[0] > other[0] * (1 + max(least, 2 * math.hypot(pace[1], other[1])))


class BatchReadings(TunerState):
    """Readings of the batches a setting formed (no decision is taken here)."""

    def _pace(self, n: int, m: Measurement) -> float | None:
        """Items/s of batches of `n` items as measured (`_paced`); None with fewer than PACE_BATCHES."""
        paced = self._paced(n, m)
        return None if paced is None else paced[0]

    def _paced(self, n: int, m: Measurement) -> tuple[float, float] | None:
        """`_pace_of` the recent batches of `n` items (within FIT_MEMORY_S of the latest batch). In a closed loop,
        batches within PACE_SETTLE_S of the limit's latest start are left out: its queue cannot outgrow its clients, so
        a verdict can wait for more than a noisy first second, while an open loop's queue grows every second a slower
        limit is held. Live (run AJ, resnet-mini, a closed loop of 64 on one core, the process at 84% of the core),
        32's first 8 batches read 491 items/s against 16's 648, and the limit went back to 16 for the rest of the row,
        where AG, before the rule, had ended three of four such rows at 32."""
        put = self._limits_put.get(n, -math.inf) if read_workload(m).closed else -math.inf
        return self._pace_of(n, [c for t, c in self._costs(n) if not put <= t < put + PACE_SETTLE_S], m)

    def _costs(self, n: int, horizon: float | None = None) -> list[tuple[float, float]]:
        """(finish time, `_cost`) of the kept batches of `n` items finished since `horizon` (`BatchMemory.latest`)."""
        return [(t, self._cost(d, c)) for t, d, c in self._memory.latest(n, horizon)]

    def _cost(self, wall_s: float, cpu_s: float) -> float:
        """What a batch cost the pace: its wall time, or on one core its executor's CPU time. There a wall stretches
        with whatever else the core runs meanwhile: live (textcls, one core), batches of 32 read 16% slower by their
        walls at 64 clients than 16's had at 32, and the limit went back to 16, which broke the SLO at 1,669 items/s."""
        return cpu_s if self._cores == 1 else wall_s

    def _pace_of(self, n: int, costs: list[float], m: Measurement) -> tuple[float, float] | None:
        """Items/s of batches of `n` items costing `costs` each (`_cost`; `_items_per_s` of their median), with the
        median's relative standard error; None with fewer than PACE_BATCHES."""
        if len(costs) < PACE_BATCHES:
            return None
        median = float(np.median(costs))
        noise = MEDIAN_SE * float(np.std(costs, ddof=1)) / math.sqrt(len(costs)) / max(median, 1e-12)
        return self._items_per_s(n, median, m), noise

    def _items_per_s(self, n: int, cost_s: float, m: Measurement) -> float:
        """Items/s of batches of `n` items costing `cost_s` each (`_cost`), each item's front-end CPU added on one core
        (the core runs both)."""
        front = self._front(m) if self._cores == 1 else 0.0
        return n / max(cost_s + n * front, 1e-12)

    def _front(self, m: Measurement) -> float:
        """Front-end CPU per item: the epoch's, or the last measured where it holds no two CPU readings (as `_core`).
        Read as 0 there, a pace leaves out what the core spends on each item beside its batch, which widens the gap
        between a small limit's pace and a larger one's: live (run BC3, textcls at 95% load, one core), a break at 32
        / 0 ms was sent back to 16 (`_outpaced`) on paces so read, and 16 could not keep up (the row's p99 361 ms)."""
        if m.frontend_cpu_s is not None:
            self._front_s = m.frontend_cpu_s
        return self._front_s

    def _paced_below(self, t: Measurement, inc: Measurement) -> bool:
        """Did the trial of a wider limit run full batches that served fewer items/s than the incumbent's full batches
        (`faster`)? Their costs (`_cost`) are the model's own pace, free of the epochs' answer counts, whose noise band
        (3 / sqrt(answers)) is 5-9% over a 1.5-s epoch: a model whose items past a size cost more (a cache's knee) loses
        less than that to the wider limit, and the count keeps the trial. On this host the counts drift more still:
        live, resnet-mini's 32 / 10 ms at 32 clients read 7% under the static 16 / 3 ms in one run and 1-24% over it in
        the next two. The trial's batches are those of its epoch (`_outpaced` would leave them out: they ran within
        PACE_SETTLE_S of the limit's start), the incumbent's its size's latest."""
        big, small = t.params.max_batch_size, inc.params.max_batch_size
        if big <= small:
            return False
        trial = [c for _, c in self._costs(big, self._memory.last_at - t.duration_s)]
        wide, narrow = self._pace_of(big, trial, t), self._pace_of(small, [c for _, c in self._costs(small)], t)
        return wide is not None and narrow is not None and faster(narrow, wide)

    def _count_first_pace(self, size: int, wall_s: float, cpu_s: float, now: float) -> None:
        """Count a batch of `size` items towards its limit's first pace, if it is one past its settling time."""
        put = self._limits_put.get(size)
        if put is None or now < put + PACE_SETTLE_S:
            return
        costs = self._first_costs.setdefault(size, [])
        if len(costs) < PACE_BATCHES:
            costs.append(self._cost(wall_s, cpu_s))

    def _outpaced(self, n: int, m: Measurement) -> int | None:
        """A smaller limit put in force lately whose batches, as measured (`_paced`), served more items/s than batches
        of `n` (the fastest such): SLOWER x as many in an open loop, `faster` past PACE_DRIFT in a closed one; None when
        none did or `n`'s are unmeasured. A linear d(n) cannot see a size whose items cost more as it grows: live (run
        AH3, textcls at 95% load, one core), the fit over 16 and 32 promised 64 11% more items/s, and full batches of 64
        served 575 items/s (102 ms each) where those of 32 had served 1,123 (25 ms); the limit was held at 64 with
        700-1,050 requests standing for the row's last 20 s."""
        mine = self._paced(n, m)
        if mine is None:
            return None
        if (first := self._pace_of(n, self._first_costs.get(n, []), m)) is not None and first[0] > mine[0]:
            # Judged on the better of its latest batches and its first settled ones, measured beside the smaller
            # limits' latest: a host that slowed since is no evidence against it. Live (run AK, textcls, a closed loop
            # of 32 on one core), 32 / 10 ms was kept at 1,437 items/s over 16's 1,152; 14 s later one slow second
            # (the process at 92% of the core, every batch a third slower) read 863, and the limit went back to 16.
            mine = first
        paces = {k: pace for k in self._limits_put if k < n and (pace := self._paced(k, m)) is not None}
        fastest = max(paces, key=lambda k: paces[k][0], default=None)
        if fastest is None:
            return None
        if read_workload(m).closed:
            # A closed loop on a saturated core is served at its batches' pace, so a gap short of SLOWER counts too: the
            # simulator (items past the 16th 30% dearer, 64 clients) held 32 / 10 ms at 1,109 items/s and p99 62 ms, its
            # batches 9% slower than 16's, where 16 serves 1,210 at 55. But past PACE_DRIFT, not GAIN: the two paces
            # were measured seconds to minutes apart, and the host drifts 5-10% between. Live (run AV, resnet-mini at
            # 64 clients), 64 and 32 were sent back to 16 on gaps of 3-7%, where timed alone and interleaved its items
            # cost 13-18% less CPU in batches of 32-64 than in batches of 16.
            return fastest if faster(paces[fastest], mine, least=PACE_DRIFT) else None
        return fastest if paces[fastest][0] >= SLOWER * mine[0] else None

    def _frugal(self, m: Measurement, w: Workload) -> bool:
        """Is this a closed loop on a saturated core it shares with other models? There every item's CPU is taken
        from the others, so a setting that spends more per item (smaller batches, a delay that leaves before they
        fill) cannot serve this model faster without slowing them: with two demo models live, picks of 4 / 4 ms and
        backoffs to a delay of 0 from 16 / 2 ms held resnet-mini at p99 60-88 ms where 16 / 10 ms holds 43."""
        own, others = self._core(m)
        return self._cores == 1 and w.closed and others >= BESIDE and own + others >= SATURATED

    def _core(self, m: Measurement) -> tuple[float, float]:
        """The shares of the core this model and the others took: the epoch's, or the last measured where it holds no
        two CPU readings (an epoch cut short by a violation, 0.25-0.5 s after a change). Read as 0 there, such an epoch
        passed for an idle core: live (soak AT2, textcls at 85% load), a break 0.25 s after a change read the core 0%
        busy, and its plan moved 16 / 0 -> 32 / 8 ms, a longer delay than any plan may pick on a saturated core
        (`_waits_longer`); held there as infeasible, the soak read p99 56 ms."""
        if m.frontend_cpu_s is not None or m.own_cpu or m.background_cpu:  # (without readings: None, 0 and 0)
            self._shares = (m.own_cpu, m.background_cpu)
        return self._shares

    def _no_emptier(self, p: TuningParams, m: Measurement) -> bool:
        """Does `p` gather batches at least as full as the incumbent's (a limit no lower than the batches it ran,
        a delay no shorter)? Read from the settings, not predicted: beside another model the plan's predictions
        err both ways (measured: 25%), and its turn-taking model sees batches of one at a delay of 0."""
        return not self._smaller(p, m) and p.max_queue_delay_s >= self._incumbent.max_queue_delay_s

    def _smaller(self, p: TuningParams, m: Measurement) -> bool:
        """Does `p` limit batches below those the incumbent forms? A closed loop on one core is never planned there:
        its round trip is the clients over the items/s, and smaller batches serve fewer per second of the core,
        while the plan's turn-taking model, blind to the front-ends' queue (it counts as the clients' own time),
        predicts them a short tail (live at 32 clients: 32 / 8 ms -> 1 / 0 ms, predicted 779 items/s at p99 1.6 ms,
        served 165 at 217 ms; textcls 32 / 10 ms -> 1 / 0 ms, 1,720 -> 388 items/s)."""
        return p.max_batch_size < min(self._incumbent.max_batch_size, m.largest_batch)

    def _below_the_batches(self, p: TuningParams, m: Measurement, w: Workload) -> bool:
        """Would `p` limit a closed loop on one core below the batches it forms (`_smaller`)? Never tried there."""
        return w.closed and self._cores == 1 and self._smaller(p, m)

    def _short(self, p: TuningParams, m: Measurement, w: Workload) -> bool:
        """Do a closed loop's batches leave short of its clients (or of the limit `p`)?"""
        return w.grouped and m.mean_batch < FULL * min(p.max_batch_size, w.clients)

    def _short_on_one_core(self, m: Measurement, w: Workload) -> bool:
        """Is this a closed loop on one core whose batches, under the incumbent, leave short of its clients?"""
        return self._cores == 1 and self._short(self._incumbent, m, w)

    def _longer(self, p: TuningParams, at_least: float = 0.0) -> TuningParams | None:
        """`p` with the next longer delay of the ladder, or the first one of `at_least` (the ladder's top at most);
        None at its top."""
        at_least = min(at_least, self._ladder[-1])
        longer = next((d for d in self._ladder if d > p.max_queue_delay_s and d >= at_least), None)
        return None if longer is None else replace(p, max_queue_delay_s=longer)

    @staticmethod
    def _fill_time(p: TuningParams, m: Measurement, w: Workload) -> float:
        """How long the front-ends take to bring the items a closed loop's batches leave short of its clients (or the
        limit `p`), each at the front-end CPU measured per item: the delay that fills them, at once rather than one
        step of the ladder per break (live, 32 clients forming batches of 16 went 0 -> 0.5 -> 1 -> 2 -> 4 ms at breaks
        7 s apart, the SLO held in 10% of the seconds after a load step). 0 before the front-ends are measured."""
        f = m.frontend_cpu_s
        return 0.0 if f is None else max(min(p.max_batch_size, w.clients) - m.mean_batch, 0.0) * f

    def _to_the_clients(self, p: TuningParams, m: Measurement, w: Workload) -> TuningParams:
        """`p` with its limit narrowed to a closed loop's clients (or the largest batch seen, if larger) when it lies
        above them, before a longer delay: that delay lets their groups merge, and the batch then leaves when the last
        of them is back rather than waiting out the delay for items no one will send (live, textcls at 8 clients: 16 /
        4 -> 16 / 8 ms formed batches of 8 that each waited 8 ms, 378 items/s, given back; 8 / 9 ms served 835)."""
        if not w.closed:
            return p
        clients = max(w.clients, m.largest_batch)
        return self._clip(replace(p, max_batch_size=clients)) if clients < p.max_batch_size else p

    def _apart(self, m: Measurement, w: Workload) -> bool:
        """On one core, are the clients' groups bound to stay apart under any wider limit? While a full batch runs, the
        clients not in it wait in the queue; when they are no more than one batch, a wider limit gathers nothing more
        at once, and the group in the core is back only a cycle later, less the front-ends' time to bring it (its
        requests reach the queue one after the other). Past the delay's bound, no batch waits that long. Live, 64
        clients in two groups of 32 (cycles of 18-30 ms, 15-23 ms less the front-ends'): textcls 32 / 2 -> 64 / 10 ms
        kept batches of 32.0 and broke the SLO (p99 52 ms where 32 / 2 ms read 39); resnet-mini 32 / 10 -> 64 / 10 ms,
        batches of 32.0, served 1,054 items/s where 32 / 10 ms served 1,178. 32 clients in groups of 16 (cycles of
        9-13.5 ms, 8.4-9.3 ms less the front-ends') merged under 32 / 10 ms, five times in three runs."""
        if not self._gathers(m, w):
            return False
        # Those queued behind a batch: the fewest others in the server at an arrival. (The population, read at the
        # 98th percentile, can read high: clients that reconnect leave requests behind, live 73 for 64 clients.)
        behind = w.clients - m.mean_batch if m.low_in_server is None else m.low_in_server - 1
        return behind <= m.mean_batch / FULL and self._back_after(m, m.mean_batch) > self._ladder[-1]

    def _splits(self, p: TuningParams, m: Measurement, w: Workload) -> bool:
        """Would `p` keep the limit of a closed loop on one core whose batches hold every client (and fill the limit:
        they leave as the last is back), with a delay too short to merge them again once they split? Whole, a batch
        leaves when its last client is back, whatever the delay; split in two (one client late once), the halves come
        back half a cycle apart (less the front-ends' time to bring one), and a shorter delay keeps them apart. Live,
        textcls at 16 clients: plans from 16 / 7.5-8 ms to 16 / 2-3 ms split the batches to 8.0-10.3 in three runs of
        six (1,062-1,333 items/s where 16 / 7.5-8 ms served 1,385-1,665), for 2-6 s of a 10-s level each. Never asks
        for a delay longer than the incumbent's."""
        if p.max_batch_size != self._incumbent.max_batch_size or not self._gathers(m, w):
            return False
        if m.mean_batch < FULL * max(w.clients, p.max_batch_size):
            # Groups of a wider population are `_apart`'s and `_merging`'s concern; batches under a higher limit wait
            # out the delay every time, and a shorter one is what they need.
            return False
        back = self._back_after(m, m.mean_batch / 2)
        return p.max_queue_delay_s < min(back, self._incumbent.max_queue_delay_s)

    def _gathers(self, m: Measurement, w: Workload) -> bool:
        """On one core, does a closed loop fill its batches (to the limit, or with every client)? Its clients then
        come back in groups, a batch's cycle apart."""
        return self._cores == 1 and w.grouped and m.mean_batch >= FULL * min(self._incumbent.max_batch_size, w.clients)

    @staticmethod
    def _cycle(m: Measurement) -> float:
        """A batch's cycle: its items over the items/s."""
        return m.mean_batch / max(m.items_per_s, 1e-9)

    @staticmethod
    def _back_after(m: Measurement, items: float) -> float:
        """How long after leaving a group of `items` clients is back in the queue, on one core: a group's share of the
        cycle (its items over the items/s), less the front-ends' time to bring its requests in one after the other."""
        return items / max(m.items_per_s, 1e-9) - items * (m.frontend_cpu_s or 0.0)

    def _merging(self, p: TuningParams, m: Measurement, w: Workload) -> TuningParams:
        """`p`, a wider limit for a closed loop (or one narrowed to its clients), with a delay that lets its clients'
        groups merge on one core. Clients that filled batches of the old limit (or held every client) come back in
        groups a batch's cycle apart (its items over the items/s);
        under the wider limit a group's first item waits out the delay while the core serves the group before it, and
        leaves without it unless the delay outlasts that cycle. Live, textcls at 16 clients: 8 / 4.5 ms -> 16 / 4.5
        ms still formed batches of 8.35 (1,114 items/s); 16 / 8 ms formed batches of 16.0 (1,374), and a plan's 16 /
        3.25 ms after it kept them whole. The delay is the ladder's first at least the cycle (at most its top); a
        plan re-plans it once the wider batches are fitted."""
        if not self._gathers(m, w):
            return p
        cycle = min(self._cycle(m), self._ladder[-1])
        if p.max_queue_delay_s >= cycle:
            return p
        return self._longer(p, at_least=cycle) or p

    def _fit_bound(self, w: Workload) -> float:
        """The largest limit an open loop's plan may pick: twice the largest size fitted (at least the incumbent's
        limit), and twice the incumbent's at most. A plan prices larger batches by extrapolating the line, and an open
        loop has no `_wider` measurement to correct it: NLP batches pad more as they grow (live, run U F2: textcls at
        95% load, batches of 13 under 16 / 2 ms, a break re-planned to 64 / 8 ms, predicted to keep pace; full batches
        of 64 fell behind and the row read p99 1.34 s). A limit grows by doubling, each step then fitted: a size fitted
        during a trial given back is no step taken (live, run AW: textcls at 95% load, 16 / 2 -> 32 / 0 ms tried and
        given back, then a break re-planned 16 / 2 -> 64 / 0.5 ms; batches of 64 read p99 131-243 ms, the row 219 ms).
        No bound before a fit."""
        fitted = self._memory.rows()
        if w.closed or not len(fitted):
            return math.inf
        n = self._incumbent.max_batch_size
        return max(n, min(2 * int(fitted[:, 0].max()), 2 * n))

    def _put_lately(self, max_batch_size: int, now: float) -> bool:
        """Was this size limit in force within FIT_MEMORY_S (its batches, if any, still in the fit)?"""
        at = self._limits_put.get(max_batch_size)
        return at is not None and now - at < FIT_MEMORY_S

    def _emptier(self, params: TuningParams, m: Measurement, w: Workload) -> bool:
        """Would `params` shorten an open loop's delay while it gathers the batches (they leave short of the limit) on a
        core that is not idle? They would leave emptier, each item then costing more of the core its bursts queue for,
        while the delay itself adds at most its own length to a tail the queue sets (live, run S: 16 / 2 -> 16 / 0 ms
        backoffs at breaks under batches of 5-7 with the core 72-100% busy, and a re-plan to 16 / 0.5 ms at 67%, read
        p99 102-143 ms over rows where 16 / 2 ms alone held 15-41 ms). Full batches leave when full, whatever the
        delay."""
        shorter = params.max_queue_delay_s < m.params.max_queue_delay_s
        return not w.closed and shorter and m.full_share < FULL_SHARE and not self._idle(m)

    def _waits_longer(self, params: TuningParams, m: Measurement, w: Workload) -> bool:
        """Would `params` lengthen an open loop's delay on a saturated core? There batches form from the queue while the
        executor runs, and a delay only holds back the items that find it idle. Live, at 80-95% load with the core
        94-99% busy, plans (at breaks too) went 16 / 2 -> 32 / 8, 32 / 10 and 64 / 8 ms, predicted p99 22-51 ms, and
        read 53-83 ms (textcls; 1.3 s at 64 / 8) where 16 / 2 or 32 / 1 ms alone held 35-43 (runs U F1, F2 and V A)."""
        longer = params.max_queue_delay_s > m.params.max_queue_delay_s
        return not w.closed and longer and self._saturated(m)

    def _content(self, m: Measurement, w: Workload) -> bool:
        """Is this an open loop within the SLO (with the trial margin) on a saturated core? Every stable setting serves
        its arrivals, so the objective (the most items/s within the SLO) is met: a search could only shorten a tail
        already within it, and there the plan's tails err most. Live, textcls at 80-95% load with the core 98-99%
        busy: searches tried 16 / 2 -> 32 / 8 and 32 / 10 ms, predicted p99 22-29 ms against 35-37 measured, and read
        58-61 ms (runs U F1, V A)."""
        return not w.closed and self._saturated(m) and m.p99_s <= TRIAL_MARGIN * self._slo_s

    def _saturated(self, m: Measurement) -> bool:
        """Is the core this model runs on (its executor, its front-ends and other models) mostly busy (`_core`)?"""
        return sum(self._core(m)) >= SATURATED

    def _idle(self, m: Measurement) -> bool:
        """Are the executor and the core it shares with the front-ends both mostly idle (`_core`)?"""
        return m.utilization < IDLE and sum(self._core(m)) < IDLE

    @staticmethod
    def _near_capacity(params: TuningParams, fit: LatencyFit, w: Workload) -> bool:
        n = params.max_batch_size
        return not w.closed and w.arrival_rate > OPEN_HEADROOM * n / max(fit(n), 1e-12)
