"""The autotuner's vocabulary and measurements: parameters, batch-latency fit, the load as read, epochs.

Pure functions and plain accumulators; the policy that uses them lives in `autotuner.py`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TuningParams:
    max_batch_size: int
    max_queue_delay_s: float
    max_padding_waste: float | None = None  # NLP length grouping's budget; None: not the tuner's to set


@dataclass(frozen=True)
class LatencyFit:
    """Batch execution time d(n) = a*n + b seconds, fitted on recent batches."""

    a_s: float
    b_s: float
    one_size: bool = False  # fitted on a single batch size: a pessimistic guess, not a fit

    def __call__(self, n: float) -> float:
        return self.a_s * n + self.b_s

    def through(self, n: float, d: float) -> LatencyFit:
        """This line's shape, scaled to pass through d(n) = `d`: its level from elsewhere."""
        scale = d / max(self(n), 1e-12)
        return LatencyFit(self.a_s * scale, self.b_s * scale)


@dataclass(frozen=True)
class AloneFits:
    """d(n) as the model ran alone at load (`batching/alone.py`), wall and CPU time: the shape of d(n) where the live
    batches cannot give one (`BatchMemory.fit`)."""

    wall: LatencyFit
    cpu: LatencyFit


def fit_batch_latency(sizes: np.ndarray, times: np.ndarray) -> LatencyFit | None:
    """Least-squares d(n) = a*n + b with a, b >= 0; None without enough batches.

    With a single batch size seen, nothing tells a from b: assume the pessimistic a = d/n, b = 0
    (no gain from batching), so predictions for larger batches err on the slow side.
    """
    if sizes.size < 4:
        return None
    n_mean, d_mean = float(sizes.mean()), float(times.mean())
    var = float(((sizes - n_mean) ** 2).mean())
    if var < 1e-9:
        return LatencyFit(d_mean / n_mean, 0.0, one_size=True)
    a = float(((sizes - n_mean) * (times - d_mean)).mean()) / var
    if a <= 0:  # size does not matter at all in this range
        return LatencyFit(0.0, d_mean)
    b = d_mean - a * n_mean
    if b < 0:  # keep the line through the mean, pivoting so the intercept stays at 0
        return LatencyFit(d_mean / n_mean, 0.0)
    return LatencyFit(a, b)


@dataclass(frozen=True)
class Workload:
    """The load as one epoch shows it (see `read_workload`)."""

    closed: bool  # a fixed population of clients: the setting decides the rate
    arrival_rate: float  # items/s
    clients: int  # the population: the most items seen in the server at once
    think_s: float  # a client's mean time outside the server per round trip (inf without load)

    @property
    def grouped(self) -> bool:
        """A closed loop of several clients: they wait on each other's batches and come back together."""
        return self.closed and self.clients >= 2


INDEPENDENT = 0.8  # arrivals whose lag after the answers is this share of chance's or more ignore the answers...
CHANCE = 1.0  # ...this share, with no more in the server than one batch holds
LAG_MIN_ARRIVALS = 50  # arrivals behind that comparison
FEW_CLIENTS = 8  # so few in the server can be closed-loop clients that return too soon after a batch to tell


def read_workload(m: Measurement) -> Workload:
    """Closed loop or open, from Little's law: `clients` items (the peak in the server, its 98th
    percentile at arrivals) cycle at the
    arrival rate, so each spends clients / rate per round trip, `mean_s` of it in the server and the
    rest outside. A closed loop's clients wait on the server most of the time (think <= time inside);
    an open loop's arrivals see a server that is mostly emptier than its peak. A long queue can make an
    open loop near its capacity look closed by that count (live: 8 of 55 plans of a soak at 85% load, whose
    closed-loop picks broke the SLO at once); its arrivals then do not follow the answers
    (`Measurement.lag_ratio`), and it is read as open when more is in the server than one batch holds (with fewer,
    only when they lag the answers at least as long as chance)."""
    rate, clients = m.arrival_rate, max(1, m.peak_in_server)
    if rate <= 0 or not math.isfinite(m.mean_s):
        return Workload(False, rate, clients, math.inf)
    think = max(0.0, clients / rate - m.mean_s)
    # Only with more in the server than one batch takes: a few closed-loop clients in small, quick batches return
    # too soon after a batch to be told from chance (2 clients read 0.8 live). One batch is the largest that left (a
    # handful of clients at least), not the limit: under a limit of 64, Poisson arrivals at 85% load formed batches
    # of 5-12 with 15-25 items in the server, and read as closed by the count their picks cut the batches to 4 items
    # (live, a soak).
    queued = clients > min(m.params.max_batch_size, max(m.largest_batch, FEW_CLIENTS))
    # With no more in the server than one batch holds, only arrivals that lag the answers as long as chance's or
    # longer (a closed loop's come back sooner): live, Poisson arrivals at 50% load with 6 in the server read 1.15,
    # were read as closed by the count, and their pick cut the limit 32 -> 4 (p99 73 ms where 16 / 2 ms held 24).
    independent = m.lag_ratio is not None and m.lag_ratio >= (INDEPENDENT if queued else CHANCE)
    # Queued past one batch, a closed loop's arrivals find all its clients in the server but those of the batch just
    # answered, whereas Poisson arrivals see the count swing (unless the queue only grows). This tells what the lag
    # cannot on one core, where the clients' returns are stamped when the core comes free and lag the answers about
    # as long as chance (live: 8 and 16 clients under a limit of 4 were read as open and kept 4 / 9 ms, 494 and 461
    # req/s, where a fresh server's tuner held 32 clients at 817-913). A typical batch, not the largest: Poisson
    # arrivals at 80% load under 32 / 8 ms saw 17-38 in the server with batches of 15.8 and up to 32, and read as
    # closed by the largest, their backoff lengthened the delay.
    steady = (
        queued
        and m.low_in_server is not None
        and m.low_in_server >= clients - m.mean_batch
        and (m.backlog_growth is None or m.backlog_growth <= m.largest_batch)
    )
    return Workload(think <= m.mean_s and (steady or not independent), rate, clients, think)


def lag_ratio(lags: np.ndarray, done_at: np.ndarray, now: float) -> float | None:
    """How soon after this model's batches finish requests arrive, against chance: their mean time since the
    latest batch finished (`lags`) over that time's average over the epoch (batches finished at `done_at`, a
    time between them of g averaging g / 2 over its length). Poisson arrivals see time averages, so an open
    loop's ratio is about 1, whatever the setting; a closed loop's clients send again a think time after their
    answer, so its ratio is well under 1 while they think for less than the time between batches (live: 0.42-0.56 in a
    soak's warm-up by 8 closed-loop clients, 0.81-1.29 under its Poisson arrivals). None with too few arrivals or
    batches to tell."""
    if lags.size < LAG_MIN_ARRIVALS or done_at.size < 3:
        return None
    gaps = np.diff(np.append(done_at, max(now, float(done_at[-1]))))
    chance = float((gaps**2).sum() / (2 * gaps.sum())) if gaps.sum() > 0 else 0.0
    return float(lags.mean()) / chance if chance > 0 else None


def delay_ladder(lo_s: float, hi_s: float) -> list[float]:
    """Delays the tuner steps through: the bounds and the powers of two of 0.5 ms between them."""
    steps = [lo_s]
    d = 0.0005
    while d < hi_s:
        if d > lo_s:
            steps.append(d)
        d *= 2
    if hi_s > lo_s:
        steps.append(hi_s)
    return steps


@dataclass(frozen=True)
class CpuReading:
    """The process's CPU clock (all threads) read `at` a time, with what the other models sharing the process
    had spent by then: their executors' CPU seconds and the items they executed (cumulative; 0 alone)."""

    at: float
    process_s: float
    others_exec_s: float = 0.0
    others_items: int = 0


@dataclass
class Epoch:
    """What the batcher reported while one setting was in force. Latencies count for requests
    that arrived after `start`; rates count from `settled_at`, once the queue left by the previous
    setting has drained."""

    params: TuningParams
    start: float
    settled_at: float
    slo_s: float
    backlog_at_settle: int | None = None  # items in the server at `settled_at`
    latencies: list[float] = field(default_factory=list)  # from the queue to the batch's end
    in_server: list[float] = field(default_factory=list)  # the same answers' from the front-end's read (the SLO's)
    wait_s: float = 0.0  # summed queue waits of those answers
    over_slo: int = 0
    items_done: int = 0
    items_arrived: int = 0
    items_refused: int = 0  # arrivals the queue refused, full (not admitted: not in `items_arrived`)
    accompanied: int = 0  # items that arrived while others were in the server
    busy_s: float = 0.0
    largest_batch: int = 0
    batches: int = 0
    full_batches: int = 0  # batches that reached the size limit
    in_server_seen: list[int] = field(default_factory=list)  # items in the server at each arrival, its own too
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, items) of the same arrivals
    lags: list[float] = field(default_factory=list)  # each arrival's time since this epoch's latest batch finished
    done_at: list[float] = field(default_factory=list)  # when this epoch's batches finished
    # CPU: the readings at the first step after `settled_at` and at the latest, and what this model's
    # executor spent in between on how many items (the rest went to front-ends and other models).
    cpu_start: CpuReading | None = None
    cpu_last: CpuReading | None = None
    exec_cpu_s: float = 0.0
    items_since_cpu: int = 0
    batches_since_cpu: int = 0

    def add_arrival(self, n_items: int, in_server: int, now: float) -> None:
        """`in_server`: items in the server before these arrived."""
        if now >= self.settled_at:
            self.items_arrived += n_items
            self.accompanied += n_items if in_server > 0 else 0
            self.in_server_seen.append(in_server + n_items)
            self.arrivals.append((now, n_items))
            if self.done_at:
                self.lags.append(now - self.done_at[-1])

    def add_refusal(self, n_items: int, now: float) -> None:
        if now >= self.settled_at:
            self.items_refused += n_items

    def add_cpu(self, reading: CpuReading) -> None:
        if reading.at < self.settled_at:
            return
        if self.cpu_start is None:
            self.cpu_start = reading
        else:
            self.cpu_last = reading

    def add_batch(self, size: int, compute_s: float, now: float, cpu_s: float | None = None) -> None:
        if self.cpu_start is not None:
            self.exec_cpu_s += compute_s if cpu_s is None else cpu_s
            self.items_since_cpu += size
            self.batches_since_cpu += 1
        if now >= self.settled_at:
            self.done_at.append(now)
            self.items_done += size
            self.busy_s += compute_s
            self.largest_batch = max(self.largest_batch, size)
            self.batches += 1
            self.full_batches += size >= self.params.max_batch_size

    def add_request(self, latency_s: float, queue_wait_s: float, now: float, front_s: float = 0.0) -> None:
        if now - latency_s >= self.start:
            self.latencies.append(latency_s)
            self.in_server.append(latency_s + front_s)
            self.wait_s += queue_wait_s
            self.over_slo += latency_s + front_s > self.slo_s

    def violating(self, in_server: int, now: float) -> bool:
        """The p99 is over the SLO already: more than 1% of answers (and at least 3) missed it,
        or the queue grows and holds more than the SLO's worth of work at the current pace."""
        if self.over_slo >= max(3, 0.01 * len(self.latencies) + 1):
            return True
        if self.backlog_at_settle is None or now - self.settled_at < 0.1:
            return False
        growth = in_server - self.backlog_at_settle
        pace = self.items_done / (now - self.settled_at)
        return growth > max(2 * self.params.max_batch_size, 0.05 * self.items_arrived) and (
            pace == 0 or in_server / pace > self.slo_s
        )

    def since_batches(self, batches: int, now: float) -> tuple[int, float, int] | None:
        """The arrivals since the `batches`-th latest batch finished: the most items in the server one of them saw,
        their items/s and their count. None before that many batches."""
        if len(self.done_at) <= batches or now <= (since := self.done_at[-batches - 1]):
            return None
        first = bisect.bisect_left(self.arrivals, since, key=lambda a: a[0])
        if first == len(self.arrivals):
            return None
        items = sum(n for _, n in self.arrivals[first:])
        return max(self.in_server_seen[first:]), items / (now - since), len(self.arrivals) - first

    def measure(self, now: float, in_server: int | None = None) -> Measurement:
        """The epoch's figures; `in_server` (items in the server now) gives the queue's growth since it settled."""
        duration = max(now - self.settled_at, 1e-9)
        frontend, background, own = self._cpu_shares()
        lat = np.asarray(self.latencies)
        return Measurement(
            params=self.params,
            duration_s=duration,
            completed=len(self.latencies),
            items_per_s=self.items_done / duration,
            arrival_rate=self.items_arrived / duration,
            refused_rate=self.items_refused / duration,
            company_share=self.accompanied / self.items_arrived if self.items_arrived else 0.0,
            mean_s=float(lat.mean()) if lat.size else math.inf,
            mean_se=float(lat.std() / math.sqrt(lat.size)) if lat.size > 1 else math.inf,
            mean_wait_s=self.wait_s / lat.size if lat.size else math.inf,
            p99_s=float(np.percentile(self.in_server, 99)) if lat.size else math.inf,
            utilization=self.busy_s / duration,
            largest_batch=self.largest_batch,
            mean_batch=self.items_done / self.batches if self.batches else 0.0,
            full_share=self.full_batches / self.batches if self.batches else 0.0,
            # The 98th percentile, not the maximum: clients that reconnect leave their abandoned requests
            # in the server for a moment, and one such moment must not double the population.
            peak_in_server=int(np.percentile(self.in_server_seen, 98)) if self.in_server_seen else 0,
            low_in_server=int(np.percentile(self.in_server_seen, 2)) if self.in_server_seen else None,
            frontend_cpu_s=frontend,
            background_cpu=background,
            own_cpu=own,
            exec_cpu=ExecCpu(self.batches_since_cpu, self.items_since_cpu, self.exec_cpu_s)
            if self.cpu_start is not None
            else None,
            lag_ratio=lag_ratio(np.asarray(self.lags), np.asarray(self.done_at), now),
            in_server=in_server,
            backlog_growth=None
            if in_server is None or self.backlog_at_settle is None
            else in_server - self.backlog_at_settle,
        )

    def _cpu_shares(self) -> tuple[float | None, float, float]:
        """The front-end CPU per item and the core's shares that other models and this one took
        (`Measurement`'s `frontend_cpu_s`, `background_cpu` and `own_cpu`; none before two readings). The
        process's CPU beyond every executor is front-end work, spread evenly over every model's items; a
        model's share is its executor's CPU plus the front-end work of its items."""
        start, last = self.cpu_start, self.cpu_last
        if start is None or last is None or last.at <= start.at:
            return None, 0.0, 0.0
        others_exec = last.others_exec_s - start.others_exec_s
        others_items = last.others_items - start.others_items
        items = self.items_since_cpu + others_items
        if items <= 0:
            return None, 0.0, 0.0
        frontend = max(0.0, last.process_s - start.process_s - self.exec_cpu_s - others_exec) / items
        span = last.at - start.at
        background = (others_exec + frontend * others_items) / span
        own = (self.exec_cpu_s + frontend * self.items_since_cpu) / span
        return frontend, min(max(background, 0.0), 1.0), min(max(own, 0.0), 1.0)


@dataclass(frozen=True)
class ExecCpu:
    """What this model's executor spent (CPU `seconds`) on `batches` of `items` since an epoch's first CPU reading."""

    batches: int
    items: int
    seconds: float

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0

    @property
    def per_batch_s(self) -> float:
        return self.seconds / self.batches if self.batches else 0.0


@dataclass(frozen=True)
class Measurement:
    params: TuningParams
    duration_s: float
    completed: int
    items_per_s: float
    arrival_rate: float
    company_share: float
    mean_s: float
    mean_se: float  # standard error of mean_s
    mean_wait_s: float  # of it, waiting in the queue
    p99_s: float
    utilization: float
    largest_batch: int
    mean_batch: float = 0.0  # items per batch
    full_share: float = 0.0  # share of batches that reached the size limit
    peak_in_server: int = 0
    low_in_server: int | None = None  # the 2nd percentile of the items in the server at arrivals (None: untold)
    frontend_cpu_s: float | None = None  # process CPU per item beyond the executors (every model's items)
    background_cpu: float = 0.0  # share of the process's core(s) other models took (their executors and items)
    own_cpu: float = 0.0  # share this model took (its executor and its items' front-end work)
    exec_cpu: ExecCpu | None = None  # this model's executor's CPU in the epoch (None: no CPU reading yet)
    lag_ratio: float | None = None  # arrivals' time after the answers against chance (`lag_ratio`); None: untold
    in_server: int | None = None  # items in the server when measured (None: not told)
    backlog_growth: int | None = None  # of them, how many more than when the epoch settled
    refused_rate: float = 0.0  # items/s the queue refused, full (beyond `arrival_rate`, which counts admissions)
