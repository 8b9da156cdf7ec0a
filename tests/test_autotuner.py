"""The autotuner driven by the batcher simulator: deterministic, no sleeps, no wall clock."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchpilot.runtime.autotune_model import (
    AloneFits,
    CpuReading,
    Epoch,
    ExecCpu,
    LatencyFit,
    Measurement,
    TuningParams,
    delay_ladder,
    fit_batch_latency,
    read_workload,
)
from batchpilot.runtime.autotuner import Autotuner, Decision
from batchpilot.runtime.batch_planner import CandidatePrediction, Plan
from batchpilot.runtime.plan_jobs import PlanJob, Solved, solve
from batchpilot.runtime.tuner.knobs import (
    FIRST_LOOK_S,
    LEVEL_BATCHES,
    LEVEL_BOUNDS,
    MAX_MEASURE_S,
    REVISIT,
    SETTLE_S,
)
from batchpilot.runtime.tuner.readings import leveled
from batchpilot.runtime.tuner.state import Outstanding
from batchpilot.spec.model import AutotuneBounds, AutotuneSpec
from batchpilot.testing.queue_sim import BatcherSim, ClosedLoop, KneeLatency, LinearLatency, Load, Poisson

CPU = LinearLatency(a_s=0.4e-3, b_s=1.2e-3, noise=0.1)  # the demo CNN on one core: 0.4 ms/item + 1.2 ms
GPU = LinearLatency(a_s=0.05e-3, b_s=4e-3, noise=0.1)  # launch-bound: batching is nearly free
COLD = TuningParams(8, 0.002)  # the manual recipe's starting point
SIZES = (1, 2, 4, 8, 16, 32, 64)
DELAYS_MS = (0, 1, 2, 5, 10)


def spec(slo_ms: float = 50.0, **bounds: int) -> AutotuneSpec:
    return AutotuneSpec(enabled=True, latency_slo_p99_ms=slo_ms, bounds=AutotuneBounds(**bounds))


def tuned(
    latency: LinearLatency,
    load: Load,
    until: float,
    *,
    slo_ms: float = 50.0,
    initial: TuningParams = COLD,
    seed: int = 1,
) -> tuple[BatcherSim, Autotuner]:
    tuner = Autotuner(spec(slo_ms), initial)
    sim = BatcherSim(latency, load, initial, seed=seed, tuner=tuner)
    sim.run_until(until)
    return sim, tuner


@cache
def sweep(latency: LinearLatency, load: Load, seed: int = 1) -> dict[TuningParams, tuple[float, float]]:
    """The oracle: every static setting of the benchmark's grid -> (throughput, p99) over [1, 6) s."""
    out = {}
    for n in SIZES:
        for d_ms in DELAYS_MS:
            p = TuningParams(n, d_ms / 1000)
            sim = BatcherSim(latency, load, p, seed=seed)
            sim.run_until(6.0)
            s = sim.stats(1.0, 6.0)
            out[p] = (s.throughput_rps, s.p99_s)
    return out


# -- the simulator ----------------------------------------------------------------------------
def test_sim_window_starts_at_first_request_and_full_batches_leave_at_once() -> None:
    exact = LinearLatency(a_s=0.001, b_s=0.002)
    alone = BatcherSim(exact, ClosedLoop(1), TuningParams(8, 0.005))
    alone.run_until(1.0)
    assert np.allclose(alone.latency_s, 0.005 + exact.mean(1))  # waits the whole window, in vain
    full = BatcherSim(exact, ClosedLoop(4), TuningParams(4, 1.0))
    full.run_until(1.0)
    assert set(full.batch_sizes) == {4} and np.allclose(full.latency_s, exact.mean(4))  # never waits


def test_sim_forms_the_next_batch_while_one_runs() -> None:
    # Delay 0: whatever queued during a batch leaves together when it is done, up to the limit:
    # the first client alone, then 4 of the 5 that queued behind it, then the 5th with the first.
    sim = BatcherSim(LinearLatency(0.0, 0.01), ClosedLoop(6), TuningParams(4, 0.0))
    sim.run_until(1.0)
    assert sim.batch_sizes[:4] == [1, 4, 2, 4] and max(sim.batch_sizes) == 4


def test_sim_is_a_pure_function_of_its_inputs() -> None:
    runs = [tuned(GPU, Poisson(800), 6.0, seed=7)[0] for _ in range(2)]
    assert runs[0].latency_s == runs[1].latency_s
    assert [(t, d.params) for t, d in runs[0].decisions] == [(t, d.params) for t, d in runs[1].decisions]


# -- the model ------------------------------------------------------------------------------
def test_fit_recovers_the_latency_model_and_is_pessimistic_on_one_size() -> None:
    sizes = np.array([1, 2, 4, 8, 16, 32], dtype=float)
    fit = fit_batch_latency(sizes, 0.0004 * sizes + 0.0012)
    assert fit is not None and not fit.one_size
    assert fit.a_s == pytest.approx(0.0004) and fit.b_s == pytest.approx(0.0012)
    one = fit_batch_latency(np.full(8, 16.0), np.full(8, 0.008))
    assert one is not None and one.one_size and one(32) == pytest.approx(0.016)  # no batching gain assumed
    assert fit_batch_latency(sizes[:2], sizes[:2]) is None


def test_the_slo_holds_from_the_front_ends_read_and_the_queue_model_counts_from_the_queue() -> None:
    """A request's time between the front-end's read and the queue (decoding, waiting behind others for the
    front-end) is in the p99 the SLO is judged on, and in `/batching`'s p99; Little's law reads the queue's."""
    tuner = Autotuner(spec(50.0), COLD)
    epoch = Epoch(COLD, start=0.0, settled_at=0.0, slo_s=0.050)
    for i in range(200):
        now = 0.1 + 0.005 * i
        tuner.record_request(0.010, 0.004, now, front_s=0.045)
        epoch.add_request(0.010, 0.004, now, front_s=0.045)
    m = epoch.measure(1.1)
    assert m.mean_s == pytest.approx(0.010) and m.mean_wait_s == pytest.approx(0.004)
    assert m.p99_s == pytest.approx(0.055) and epoch.violating(0, 1.1)
    assert tuner.snapshot(1.1)["p99_ms"] == pytest.approx(55.0)


def test_delay_ladder_stays_in_bounds() -> None:
    assert delay_ladder(0.0, 0.010) == [0.0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.010]
    assert delay_ladder(0.003, 0.003) == [0.003]


# -- the controller ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("latency", "load"),
    [(CPU, ClosedLoop(64, think_s=0.001)), (GPU, Poisson(3000))],
    ids=["cpu-64-clients", "gpu-3000-rps"],
)
def test_reaches_the_best_static_throughput_within_30s_and_settles(latency: LinearLatency, load: Load) -> None:
    oracle = sweep(latency, load)
    best = max(x for x, p99 in oracle.values() if p99 <= 0.050)
    sim, tuner = tuned(latency, load, 50.0)
    after = sim.stats(30.0, 50.0)
    assert after.throughput_rps >= 0.95 * best
    assert after.p99_s <= 0.050
    assert sim.changes_between(30.0, 50.0) <= 1  # settled
    snap = tuner.snapshot(50.0)
    assert snap["slo_feasible"] and snap["changes"] == sim.changes_between(0.0, 50.0)
    assert snap["p99_ms"] <= 50 and snap["latency_model"]["a_ms_per_item"] > 0


def test_batching_shows_the_wall_and_the_cpu_fits_apart() -> None:
    """`/batching` shows the executor's CPU fit beside the wall-time one: on one core the plans price the CPU fit, and
    the wall time carries the front-ends' work interleaved with each batch (here twice the CPU)."""
    tuner = Autotuner(spec(100), TuningParams(16, 0.0), cores=1)
    for i in range(40):
        n = 16 if i % 2 else 8
        cpu = 0.4e-3 * n + 1.2e-3
        tuner.record_batch(n, 2 * cpu, 0.01 * i, cpu_s=cpu)
    snap = tuner.snapshot(0.5)
    assert snap["cpu_latency_model"] == pytest.approx({"a_ms_per_item": 0.4, "b_ms": 1.2})
    assert snap["latency_model"] == pytest.approx({"a_ms_per_item": 0.8, "b_ms": 2.4})


def test_infeasible_slo_is_reported_at_the_lowest_latency_setting() -> None:
    slow = LinearLatency(a_s=0.4e-3, b_s=30e-3, noise=0.1)  # one item alone takes 30 ms > 20 ms SLO
    sim, tuner = tuned(slow, Poisson(100), 30.0, slo_ms=20)
    assert any(d.reason == "infeasible" for _, d in sim.decisions)
    assert tuner.snapshot(30.0)["slo_feasible"] is False
    assert tuner.params.max_queue_delay_s == 0.0
    lowest = min(p99 for _, p99 in sweep(slow, Poisson(100)).values())
    assert sim.stats(10.0, 30.0).p99_s <= 1.1 * lowest


def test_infeasible_under_too_much_load_minimises_p99() -> None:
    heavy = LinearLatency(a_s=1e-3, b_s=2e-3, noise=0.1)  # 64 clients need >= 66 ms per round trip
    sim, tuner = tuned(heavy, ClosedLoop(64, think_s=0.001), 40.0, slo_ms=30)
    assert tuner.snapshot(40.0)["slo_feasible"] is False
    lowest = min(p99 for _, p99 in sweep(heavy, ClosedLoop(64, think_s=0.001)).values())
    assert sim.stats(20.0, 40.0).p99_s <= 1.1 * lowest


def test_one_client_alone_sees_no_batching_latency() -> None:
    sim, tuner = tuned(CPU, ClosedLoop(1, think_s=0.001), 20.0)
    assert tuner.params.max_queue_delay_s == 0.0
    assert sim.decisions[0][1].reason == "low-load" and sim.decisions[0][0] <= FIRST_LOOK_S + 0.5
    alone = BatcherSim(CPU, ClosedLoop(1, think_s=0.001), TuningParams(1, 0.0), seed=1)
    alone.run_until(20.0)
    assert sim.stats(0.0, 20.0).mean_s <= 1.1 * alone.stats(0.0, 20.0).mean_s + 0.001


def test_a_trickle_of_requests_stops_the_waiting() -> None:
    sim, tuner = tuned(CPU, Poisson(20), 10.0, initial=TuningParams(16, 0.010))
    assert tuner.params.max_queue_delay_s == 0.0
    assert sim.stats(5.0, 10.0).p99_s < 0.005  # no 10 ms window paid


def test_a_load_that_would_keep_the_executor_busy_one_at_a_time_is_no_trickle() -> None:
    """Poisson arrivals at 400/s against a 2 ms delay find under half a companion each, but answered one at a time
    (1.6 ms) they would keep the executor 64% busy: the delay that gathers batches of a few stays for the plan to
    judge (live, dropping it at half resnet-mini's capacity gave batches of 2 and p99 52-57 ms where 16 / 5 ms holds
    24). A trickle still stops the waiting (above)."""
    sim, _ = tuned(CPU, Poisson(400), 5.0, initial=TuningParams(16, 0.002))
    assert "low-load" not in [d.reason for _, d in sim.decisions]


def test_a_fresh_servers_first_moments_are_not_taken_for_a_trickle() -> None:
    """Clients still connecting look like a trickle: a fresh server's first epoch counts from FIRST_LOOK_S on."""
    tuner = Autotuner(spec(50), TuningParams(16, 0.002))
    decisions = []
    for i in range(100):  # one request at a time, 10 ms apart, each alone in its batch
        t = i * 0.010
        tuner.record_arrival(1, t)
        tuner.record_batch(1, 0.003, t + 0.005)
        tuner.record_request(0.005, 0.002, t + 0.005)
        if i % 25 == 24:  # stepped every 0.25 s
            decisions.append((t, tuner.step(t + 0.006)))
    first = [(t, d.reason) for t, d in decisions if d is not None]
    assert first and first[0][1] == "low-load" and first[0][0] >= FIRST_LOOK_S - 0.01


def test_adapts_when_the_load_steps_up_and_down() -> None:
    tuner = Autotuner(spec(50), COLD)
    sim = BatcherSim(GPU, Poisson(200), COLD, seed=2, tuner=tuner)
    for i, rate in enumerate((200, 3000, 200)):
        sim.load = Poisson(rate)
        sim.run_until(40.0 * (i + 1))
        steady = [sim.stats(t, t + 1) for t in range(40 * i + 10, 40 * (i + 1))]
        assert sum(w.p99_s <= 0.050 for w in steady) >= 0.95 * len(steady)
        assert sim.stats(40 * i + 10, 40 * (i + 1)).throughput_rps >= 0.95 * rate
        assert sim.changes_between(40 * i + 20, 40 * (i + 1)) <= 1
    # Grew for the peak: 8 items per 4.4 ms serve 1,818/s. (There its backoff doubles the limit, keeping the delay that
    # gathers its batches of 4 on a busy executor: `_emptier`. Before that rule, the delay dropped first, and the
    # re-plan at the next break, read at 8 / 0 ms, went to 32 / 2 ms; 16 / 2 ms holds 3,000/s at p99 16 ms.)
    assert max(d.params.max_batch_size for _, d in sim.decisions) >= 16


def test_adapts_when_the_model_slows_down() -> None:
    sim, tuner = tuned(GPU, Poisson(2000), 30.0)
    sim.latency = LinearLatency(a_s=0.1e-3, b_s=8e-3, noise=0.1)  # twice as slow: 16 items no longer keep up
    sim.run_until(70.0)
    after = sim.stats(45.0, 70.0)
    assert after.throughput_rps >= 0.95 * 2000 and after.p99_s <= 0.050
    assert tuner.snapshot(70.0)["latency_model"]["b_ms"] == pytest.approx(8.0, rel=0.25)


def test_lower_ceiling_is_honoured() -> None:
    sim, tuner = tuned(CPU, ClosedLoop(64, think_s=0.001), 20.0)
    assert tuner.params.max_batch_size >= 32
    tuner.lower_ceiling(8, sim.now)  # as the batcher does after an out-of-memory error at 32 ...
    assert tuner.params.max_batch_size == 8
    sim.params = tuner.params  # ... it applies the new limit at once, not at the next step
    first_batch = len(sim.batch_sizes)
    sim.run_until(40.0)
    assert any(d.reason == "ceiling" for _, d in sim.decisions)
    assert max(d.params.max_batch_size for t, d in sim.decisions if t >= 20.0) <= 8
    assert max(sim.batch_sizes[first_batch + 1 :]) <= 8  # the batch running at the call may be larger


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.tuples(st.integers(1, 128), st.integers(1, 128)).map(sorted),
    delays_us=st.tuples(st.integers(0, 20_000), st.integers(0, 20_000)).map(sorted),
    initial=st.builds(TuningParams, st.integers(1, 256), st.floats(0.0, 0.05)),
    load=st.one_of(
        st.builds(Poisson, st.floats(5, 1500)), st.builds(ClosedLoop, st.integers(1, 16), st.floats(0.001, 0.010))
    ),
    a_ms=st.floats(0.01, 2.0),
    b_ms=st.floats(1.0, 20.0),
    slo_ms=st.floats(2.0, 200.0),
    ceiling=st.one_of(st.none(), st.integers(1, 128)),
)
def test_never_leaves_its_bounds(
    sizes: list[int],
    delays_us: list[int],
    initial: TuningParams,
    load: Load,
    a_ms: float,
    b_ms: float,
    slo_ms: float,
    ceiling: int | None,
) -> None:
    bounds = dict(
        min_batch_size=sizes[0],
        max_batch_size=sizes[1],
        min_queue_delay_microseconds=delays_us[0],
        max_queue_delay_microseconds=delays_us[1],
    )
    tuner = Autotuner(spec(slo_ms, **bounds), initial)
    start = tuner.params
    sim = BatcherSim(LinearLatency(a_ms / 1e3, b_ms / 1e3, 0.1), load, initial, seed=3, tuner=tuner)
    sim.run_until(5.0)
    if ceiling is not None:
        tuner.lower_ceiling(ceiling, sim.now)
    sim.run_until(10.0)
    top = sizes[1] if ceiling is None else max(sizes[0], min(ceiling, sizes[1]))
    for t, p in [(0.0, start)] + [(t, d.params) for t, d in sim.decisions]:
        # (a decision at t = 5.0 itself came from the step before the ceiling was lowered at that instant)
        assert sizes[0] <= p.max_batch_size <= (top if t > 5.0 else sizes[1])
        assert delays_us[0] / 1e6 <= p.max_queue_delay_s <= delays_us[1] / 1e6
    assert sizes[0] <= tuner.params.max_batch_size <= top


def test_a_violation_with_full_batches_grows_them_even_below_90_percent_busy() -> None:
    """Live on one core the HTTP stack takes its share, so the executor of a saturated closed loop
    reads ~85% busy: with full batches the backoff must double the size (halving it lengthened the
    queue: 16 -> 8 at 32 clients, seen live on textcls), whatever the busy figure says."""
    tuner = Autotuner(spec(50), TuningParams(16, 0.0))
    decisions = []
    t, i = 0.0, 0
    tuner.record_arrival(16, 0.0)  # 32 closed-loop clients: 16 queued, and 16 arrive while a batch of 16 runs
    while t < 3.0 and not decisions:
        tuner.record_arrival(16, t + 0.010)
        t += 0.020  # a batch of 16 each 20 ms, 17 ms of it computing: 85% busy
        tuner.record_batch(16, 0.017, t)
        for k in range(16):  # mean 37 ms of which 23 ms queued; 1 in 16 answers at 80 ms
            tuner.record_request(0.080 if (i + k) % 16 == 0 else 0.034, 0.023, t)
        i += 1
        if i % 12 == 0:  # the batcher steps the tuner every 0.25 s
            decisions += [d for d in [tuner.step(t)] if d is not None]
    assert decisions and decisions[0].reason == "slo-violation"
    assert decisions[0].params == TuningParams(32, 0.0)


# -- the model-based search ---------------------------------------------------------------------
@cache
def oracle(latency: LinearLatency, load: Load, slo_s: float = 0.050) -> tuple[float, float]:
    """The best static (items/s, p99) within the SLO over the benchmark's grid, in the simulator."""
    rows = []
    for n in SIZES:
        for d_ms in DELAYS_MS:
            sim = BatcherSim(latency, load, TuningParams(n, d_ms / 1000), seed=1)
            sim.run_until(12.0)
            s = sim.stats(2.0, 12.0)
            rows.append((s.throughput_rps, s.p99_s))
    return max((r for r in rows if r[1] <= slo_s), default=(0.0, math.inf))


NLP = LinearLatency(a_s=0.6e-3, b_s=0.5e-3, noise=0.2)  # per-item cost dominates, noisier (length mix)


@pytest.mark.parametrize("latency", [CPU, GPU, NLP], ids=["cpu", "gpu", "nlp"])
def test_closed_loop_levels_match_the_best_static_setting(latency: LinearLatency) -> None:
    """Table 1 of the benchmark in the simulator: 1-64 clients, each tuned cold from 8 / 2 ms."""
    ratios = []
    for clients in (1, 2, 4, 8, 16, 32, 64):
        load = ClosedLoop(clients, think_s=0.0015)
        best_x, _ = oracle(latency, load)
        sim, _ = tuned(latency, load, 30.0)
        after = sim.stats(10.0, 30.0)
        if best_x == 0.0:  # no static setting meets the SLO (NLP at 64 clients): lowest p99 instead
            continue
        ratios.append(after.throughput_rps / best_x)
        assert after.throughput_rps >= 0.94 * best_x, clients
        assert after.p99_s <= 0.050, clients
        assert sim.changes_between(10.0, 30.0) <= 1, clients
    assert sum(ratios) / len(ratios) >= 0.98


@pytest.mark.parametrize("share", [0.5, 0.8, 0.95])
def test_open_loop_loads_hold_the_slo(share: float) -> None:
    capacity = 64 / CPU.mean(64)  # the most any setting serves
    rate = share * capacity
    sim, _ = tuned(CPU, Poisson(rate), 40.0)
    after = sim.stats(10.0, 40.0)
    assert after.throughput_rps >= 0.97 * rate
    if oracle(CPU, Poisson(rate))[0] > 0:
        assert after.p99_s <= 0.050
    else:  # 95%: no static setting meets the SLO there; the lowest p99 instead, over the same window
        table = sweep(CPU, Poisson(rate))
        lowest = min(table, key=lambda p: table[p][1])
        static = BatcherSim(CPU, Poisson(rate), lowest, seed=1)
        static.run_until(40.0)
        assert after.p99_s <= 1.15 * static.stats(10.0, 40.0).p99_s


def test_an_open_loop_the_slo_cannot_hold_is_held_not_churned() -> None:
    """Noisy batches (lognormal sigma 0.3) at 85% of capacity: no setting keeps p99 within 50 ms over 50 s. After
    three settings broke it in a row, the SLO is declared infeasible and the lowest tail among them held: a few
    changes instead of one every second (51 without the rule), a tail no longer than the best static settings'."""
    noisy = LinearLatency(a_s=1.5e-3, b_s=2.0e-3, noise=0.3)
    rate = 0.85 * 64 / noisy.mean(64)
    sim, _ = tuned(noisy, Poisson(rate), 60.0, seed=2)
    after = sim.stats(10.0, 60.0)
    assert any(d.reason == "infeasible" and d.detail.get("knob") == "held" for _, d in sim.decisions)
    assert sim.changes_between(10.0, 60.0) <= 8
    assert after.throughput_rps >= 0.97 * rate
    static_best = math.inf
    for p in (TuningParams(16, 0.001), TuningParams(16, 0.010)):  # the lowest p99s of the grid's sweep
        static = BatcherSim(noisy, Poisson(rate), p, seed=2)
        static.run_until(60.0)
        static_best = min(static_best, static.stats(10.0, 60.0).p99_s)
    assert static_best > 0.050  # the SLO is out of reach here
    assert after.p99_s <= 1.15 * static_best


@pytest.mark.parametrize(("load", "seed"), [(0.9, 3), (0.95, 2), (0.95, 3)])
def test_an_open_loop_leaves_a_limit_whose_batches_serve_less_and_one_that_does_not_keep_pace(
    load: float, seed: int
) -> None:
    """Items past the 32nd of a batch cost three times as much (0.65 ms an item, 3 ms a batch, 2 ms past 32: full
    batches of 16 serve 1,194 items/s, of 32 1,345, of 64 729), Poisson arrivals at 90-95% of 32's capacity, from 16 /
    2 ms. The fit over the sizes measured cannot see the knee; before the measured paces (`_outpaced`) and with the
    fit's word against a doubling even while the queue grew, these runs ended at 64 (p99 3.5 and 25 s, 728 items/s
    served) or at 16 (p99 4.2 s): as live in run AH3, where textcls's batches of 64 served 575 items/s against 32's
    1,123. Here each ends at 32 (the static 32 / 0-2 ms: p99 68-78 ms at 95%, no setting within 50), keeping pace, and
    a limit of 64 tried is given back within two seconds."""
    knee = KneeLatency(a_s=0.65e-3, b_s=3e-3, noise=0.1, knee=32, past_a_s=2e-3)
    rate = load * 32 / knee.mean(32)
    sim, tuner = tuned(knee, Poisson(rate), 60.0, initial=TuningParams(16, 0.002), seed=seed)
    after = sim.stats(20.0, 60.0)
    assert tuner.params.max_batch_size == 32
    changes = [(at, d.params.max_batch_size) for at, d in sim.decisions if d.changed] + [(60.0, 0)]
    at_64 = sum(t1 - t0 for (t0, n), (t1, _) in pairwise(changes) if n == 64)
    assert at_64 <= 2.0  # (a limit of 64 is tried at most once a FIT_MEMORY_S: its batches' pace is how it is known)
    assert after.throughput_rps >= 0.97 * rate
    assert after.p99_s < 1.0


def test_a_held_open_loop_needs_epochs_in_a_row_within_the_slo_to_be_feasible_again() -> None:
    """Held as infeasible, one lucky epoch is not the SLO met (live, each hold ended on one and the breaks
    resumed): three in a row are; an epoch over it starts the count again. Without a hold, one is enough."""
    here = TuningParams(16, 0.0)

    def epoch(p99_ms: float) -> Measurement:
        return Measurement(
            params=here, duration_s=2.0, completed=900, items_per_s=450.0, arrival_rate=450.0, company_share=1.0,
            mean_s=0.02, mean_se=0.001, mean_wait_s=0.01, p99_s=p99_ms / 1e3, utilization=0.8, largest_batch=16,
        )  # fmt: skip

    held = Autotuner(spec(50), here)
    held._feasible, held._held = False, 0
    verdicts = [held._verdict(epoch(p99), 0.0) for p99 in (30, 30, 60, 30, 30, 30)]
    assert [v.reason if v else None for v in verdicts] == [None, None, None, None, None, "feasible"]
    free = Autotuner(spec(50), here)
    free._feasible = False
    verdict = free._verdict(epoch(30), 0.0)
    assert verdict is not None and verdict.reason == "feasible"


def test_the_load_is_read_as_closed_or_open() -> None:
    closed = Autotuner(spec(50), TuningParams(16, 0.0))
    BatcherSim(CPU, ClosedLoop(32, think_s=0.001), closed.params, seed=1, tuner=closed).run_until(3.0)
    w = read_workload(closed._inc_meas)  # type: ignore[arg-type]
    assert w.closed and w.clients == 32 and w.think_s == pytest.approx(0.001, abs=0.0007)
    open_ = Autotuner(spec(50), TuningParams(16, 0.0))
    BatcherSim(CPU, Poisson(1000), open_.params, seed=1, tuner=open_).run_until(3.0)
    w = read_workload(open_._inc_meas)  # type: ignore[arg-type]
    assert not w.closed and w.arrival_rate == pytest.approx(1000, rel=0.1)


def test_an_open_loop_near_capacity_is_told_from_a_closed_one_by_its_arrivals() -> None:
    """Near capacity an open loop's queue is as long as a closed loop's population, and Little's law alone reads
    it as closed (think time under the time in the server); its arrivals ignore the answers, a closed loop's
    follow them."""
    near = Autotuner(spec(50), TuningParams(32, 0.0))
    BatcherSim(CPU, Poisson(2150), near.params, seed=1, tuner=near).run_until(3.0)
    m = near._epoch.measure(3.0)  # type: ignore[union-attr]
    assert read_workload(replace(m, lag_ratio=None)).closed  # the count alone (Little's law): closed
    assert m.lag_ratio == pytest.approx(1.0, abs=0.1)
    assert not read_workload(m).closed
    for clients, think_s in ((64, 0.0), (32, 0.001), (48, 0.002)):
        closed = Autotuner(spec(50), TuningParams(16, 0.0))
        BatcherSim(CPU, ClosedLoop(clients, think_s), closed.params, seed=1, tuner=closed).run_until(3.0)
        m = closed._epoch.measure(3.0)  # type: ignore[union-attr]
        assert m.lag_ratio is not None and m.lag_ratio < 0.6, clients
        assert read_workload(m).closed, clients
    # Two clients in quick batches come back too soon after a batch to be told from chance; with no more in the
    # server than one batch holds, the count decides (closed). (The limit kept at 16: under a limit of 1 two clients
    # are more than one batch holds.)
    pair = Autotuner(spec(50, min_batch_size=16), TuningParams(16, 0.0))
    BatcherSim(CPU, ClosedLoop(2, 0.002), pair.params, seed=1, tuner=pair).run_until(3.0)
    m = pair._epoch.measure(3.0)  # type: ignore[union-attr]
    assert m.lag_ratio is not None and m.lag_ratio >= 0.8
    assert read_workload(m).closed
    # A limit far above the batches that form: one batch is the largest that left, not the limit (live, a soak at
    # 85% load under a limit of 64: batches of up to 12, 25 items in the server, read as closed by the count).
    wide = Autotuner(spec(50), TuningParams(64, 0.0))
    BatcherSim(CPU, Poisson(0.8 * 64 / CPU.mean(64)), wide.params, seed=1, tuner=wide).run_until(3.0)
    m = wide._epoch.measure(3.0)  # type: ignore[union-attr]
    assert m.largest_batch < m.peak_in_server < 64 and m.lag_ratio == pytest.approx(1.0, abs=0.15)
    assert read_workload(replace(m, lag_ratio=None)).closed and not read_workload(m).closed


def test_a_closed_loop_queued_past_its_batches_is_closed_whatever_its_lag() -> None:
    """Live (peers benchmark, resnet-mini, one core, the clients stepped 1 -> 64): a plan at 4 clients picked 4 / 9
    ms; at 8 and 16 clients the epochs were read as open (their returns, stamped when the core came free, lagged the
    answers about as long as chance: 0.84 at 32 clients), the open-loop plan changed nothing, and 16 clients were
    served 461 req/s at p99 49 ms where a fresh server's tuner held 32 clients at 817-913. A closed loop queued past
    its batches keeps all its clients in the server but those just answered; Poisson arrivals see the count swing,
    and a queue that only grows is no closed loop either."""
    for clients in (8, 16):
        tuner = Autotuner(spec(50, max_batch_size=4), TuningParams(4, 0.009))
        BatcherSim(CPU, ClosedLoop(clients), tuner.params, seed=1, tuner=tuner).run_until(3.0)
        m = tuner._epoch.measure(3.0)  # type: ignore[union-attr]
        assert m.low_in_server is not None and m.low_in_server >= clients - 4, clients
        assert read_workload(replace(m, lag_ratio=0.84)).closed, clients
        assert not read_workload(replace(m, lag_ratio=0.84, low_in_server=None)).closed  # the lag alone: open
    live = Measurement(  # Poisson at 80% load under 32 / 8 ms (textcls, one core): two epochs' readings, the second
        params=TuningParams(32, 0.008), duration_s=0.78, completed=680, items_per_s=874.0, arrival_rate=826.9,
        company_share=1.0, mean_s=0.024, mean_se=0.001, mean_wait_s=0.012, p99_s=0.0516, utilization=0.9,
        largest_batch=32, mean_batch=12.85, full_share=0.2, peak_in_server=30, low_in_server=9, lag_ratio=1.03,
    )  # fmt: skip
    assert not read_workload(live).closed
    # (17-38 in the server, batches of 15.8 and up to 32) read as closed when a batch meant the largest
    assert not read_workload(replace(live, low_in_server=17, peak_in_server=38, mean_batch=15.83)).closed
    for rate, limit in ((2150, 32), (0.8 * 64 / CPU.mean(64), 64), (0.95 * 16 / CPU.mean(16), 16)):
        near = Autotuner(spec(50), TuningParams(limit, 0.0))
        BatcherSim(CPU, Poisson(rate), near.params, seed=1, tuner=near).run_until(3.0)
        m = near._epoch.measure(3.0)  # type: ignore[union-attr]
        assert not read_workload(m).closed, rate
        if limit == 16:  # a queue that grew by more than a batch over the epoch looks steady to the count alone
            grown = replace(m, low_in_server=m.peak_in_server - 1, backlog_growth=2 * m.largest_batch)
            assert not read_workload(grown).closed
            assert read_workload(replace(grown, backlog_growth=0, lag_ratio=0.84)).closed


def test_few_in_the_server_arrivals_that_lag_the_answers_as_chance_does_are_an_open_loop() -> None:
    """Live, run U W2 (resnet-mini, Poisson at 50% load under 32 / 2 ms): 6 in the server, no more than one batch
    holds, so the count decided, and it read closed (think 11 ms under 16 ms in the server); the plan's closed-loop
    pick cut the limit to 4 / 4 ms and the row read p99 73 ms where 16 / 2 ms held 24. Its arrivals lagged the
    answers 1.15x as long as chance (closed loops with a think time read 0.89-0.91 in the simulator, without one 0):
    read as open. Below chance's lag the count still decides."""
    m = Measurement(
        params=TuningParams(32, 0.002), duration_s=1.5, completed=323, items_per_s=215.5, arrival_rate=219.3,
        company_share=1.0, mean_s=0.0162, mean_se=0.001, mean_wait_s=0.004, p99_s=0.0527, utilization=0.648,
        largest_batch=6, mean_batch=1.87, peak_in_server=6, lag_ratio=1.15,
    )  # fmt: skip
    assert read_workload(replace(m, lag_ratio=None)).closed
    assert not read_workload(m).closed
    assert read_workload(replace(m, lag_ratio=0.91)).closed


class Cliff(LinearLatency):
    """Linear up to 16 items, then three times slower per item (a cache or memory cliff): a linear fit
    over small batches promises gains that large batches do not deliver."""

    def mean(self, n: int) -> float:
        return super().mean(n) if n <= 16 else super().mean(16) + 3 * self.a_s * (n - 16)


def test_a_trial_that_loses_is_given_back_within_one_epoch() -> None:
    """Over the cliff a trial loses (the probe of a wider limit; a plan extrapolating the line) and goes back within
    one epoch; a size whose trial lost is not tried again."""
    cliff = Cliff(a_s=0.4e-3, b_s=1.2e-3, noise=0.1)
    sim, _ = tuned(cliff, ClosedLoop(64, think_s=0.001), 40.0, slo_ms=100)
    moves = sim.decisions
    trials = ("plan", "probe")
    over_the_cliff = [i for i, (_, d) in enumerate(moves) if d.reason in trials and d.params.max_batch_size > 16]
    assert 1 <= len(over_the_cliff) <= 2
    for i in over_the_cliff:
        (t, _), (t_back, back) = moves[i], moves[i + 1]
        assert back.reason in ("revert", "slo-violation") and back.params.max_batch_size <= 16
        assert t_back - t <= SETTLE_S[1] + MAX_MEASURE_S + 0.25  # within one measurement epoch
    assert sim.changes_between(10.0, 40.0) == 0
    best_x, _ = oracle(cliff, ClosedLoop(64, think_s=0.001), 0.100)
    assert sim.stats(20.0, 40.0).throughput_rps >= 0.95 * best_x


def test_batching_report_shows_the_prediction_beside_the_measurement() -> None:
    sim, tuner = tuned(CPU, ClosedLoop(64, think_s=0.001), 15.0)
    plan = tuner.snapshot(15.0)["plan"]
    assert plan["load"] == "closed-loop" and plan["clients"] == 64
    assert plan["predicted_items_per_s"] == pytest.approx(plan["measured_items_per_s"], rel=0.1)
    assert plan["predicted_p99_ms"] == pytest.approx(plan["measured_p99_ms"], rel=0.25)
    reasons = {d.reason for _, d in sim.decisions}
    assert reasons <= {"plan", "probe", "revert", "trial-kept", "slo-violation", "low-load"}, reasons
    planned = [d for _, d in sim.decisions if d.reason == "plan"]
    assert planned and all("predicted_items_per_s" in d.detail for d in planned)


def drive_one_core(cores: int, background: float = 0.0, ledger: bool = True, tuner: Autotuner | None = None) -> dict:
    """A saturated closed loop: the executor spends 0.4 ms/item + 1.2 ms of CPU per batch, the front-ends
    0.3 ms per item more, half of it while the batch runs (stretching its wall time), half between batches.
    Another model in the process takes `background` of the core (3/4 its executor, 1/4 its items' front-end
    work at the same 0.3 ms per item), which stretches everything this model does by 1 / (1 - background).
    `ledger`: the other model's executor CPU and items are reported apart (else only the process's clock).
    Returns the tuner's plan report (`tuner`: drive this one instead of a new one)."""
    tuner = tuner or Autotuner(spec(100), TuningParams(16, 0.0), cores=cores)
    t, cpu, others_exec, others_items = 0.0, 0.0, 0.0, 0.0
    stretch = 1.0 / (1.0 - background)
    for i in range(400):  # batches of 16 and 8 alternate (a fit over two sizes), back to back
        n = 16 if i % 2 else 8
        d_cpu = 0.4e-3 * n + 1.2e-3
        wall = (d_cpu + 0.3e-3 * n) * stretch
        tuner.record_arrival(n, t)
        tuner.record_batch(n, (d_cpu + 0.15e-3 * n) * stretch, t + (d_cpu + 0.15e-3 * n) * stretch, cpu_s=d_cpu)
        t += wall
        others_exec += 0.75 * background * wall
        others_items += 0.25 * background * wall / 0.3e-3
        cpu += d_cpu + 0.3e-3 * n + background * wall
        for _ in range(n):
            tuner.record_request(0.030, 0.020, t)
        if i % 20 == 0:
            if ledger:
                tuner.record_cpu(cpu, t, others_exec_s=others_exec, others_items=int(others_items))
            else:
                tuner.record_cpu(cpu, t)
            tuner.step(t)
    return tuner.snapshot(t)["plan"]


def test_on_one_core_the_plan_charges_the_front_end_cpu() -> None:
    """With the front-end CPU in its one-core model, the plan predicts what is measured; without (several
    cores), from the batches' wall time alone, it overestimates the throughput."""
    one, many = drive_one_core(1), drive_one_core(4)
    assert one["frontend_cpu_ms"] == pytest.approx(0.3, rel=0.05) and many["frontend_cpu_ms"] is None
    assert one["background_cpu"] == pytest.approx(0.0, abs=0.01) and many["background_cpu"] is None
    # The driver serves the same whatever the setting: compare with its rate (a closed loop's arrivals).
    # The one-core prediction is at 1.3x the measured front-end cost: a floor, not above.
    assert 0.9 * one["arrival_rate"] <= one["predicted_items_per_s"] <= 1.03 * one["arrival_rate"]
    assert many["predicted_items_per_s"] > 1.1 * many["arrival_rate"]


def test_another_models_cpu_is_a_share_of_the_core_not_this_ones_front_end_cost() -> None:
    """Two models on one core: the other's executor and requests take 40% of it. Read apart (the ledger),
    this model's front-end cost stays its own 0.3 ms per item and the other's share stretches its work:
    the plan predicts what is measured. Charged per item as front-end work (the process clock alone), the
    other's CPU reads as 0.5 ms more per item of this model, and the plan underestimates what is served."""
    shared = drive_one_core(1, background=0.4)
    assert shared["frontend_cpu_ms"] == pytest.approx(0.3, rel=0.05)
    assert shared["background_cpu"] == pytest.approx(0.4, abs=0.02)
    assert 0.9 * shared["arrival_rate"] <= shared["predicted_items_per_s"] <= 1.03 * shared["arrival_rate"]
    blind = drive_one_core(1, background=0.4, ledger=False)
    assert blind["frontend_cpu_ms"] > 2.5 * shared["frontend_cpu_ms"] and blind["background_cpu"] == 0.0
    assert blind["predicted_items_per_s"] < 0.85 * blind["arrival_rate"]


def test_on_one_core_a_tuner_publishes_its_loop_and_plans_beside_the_others() -> None:
    """A tuner whose one-core plan has calibrated its closed loop publishes it (`neighbour`); another tuner
    handed it plans beside it (the plan simulates that loop), and no longer stretches its own work by the
    share of the core the neighbour takes (that share is in the simulation)."""
    a = Autotuner(spec(100), TuningParams(16, 0.0), cores=1, name="a")
    assert a.neighbour(0.0) is None  # nothing calibrated yet
    drive_one_core(1, background=0.4, tuner=a)
    a.record_arrival(1, 100.0)  # its latest request, answered at once
    a.record_batch(1, 1e-3, 100.001)
    published = a.neighbour(100.5)
    assert published is not None and published.name == "a" and published.params == a.params
    assert published.frontend_s == pytest.approx(0.3e-3, rel=0.05) and published.clients >= 1
    assert 0.3 < published.core_share < 0.7
    beside = replace(published, core_share=0.4)  # as if a took the 40% b measures beside it
    b = Autotuner(spec(100), TuningParams(16, 0.0), cores=1, inline_plans=False, name="b")
    b.set_neighbours([beside])
    drive_one_core(1, background=0.4, tuner=b)
    job = b.plan_job
    assert job is not None and job.kind == "one-core" and job.neighbours == (beside,)
    assert job.frontend_s == pytest.approx(0.3e-3, rel=0.05)  # not stretched by 1 / (1 - 0.4)
    alone = Autotuner(spec(100), TuningParams(16, 0.0), cores=1, inline_plans=False)
    drive_one_core(1, background=0.4, tuner=alone)
    assert alone.plan_job is not None and alone.plan_job.frontend_s == pytest.approx(0.5e-3, rel=0.05)


def test_an_idle_model_is_no_neighbour_until_its_requests_come_back() -> None:
    """A model whose clients have gone takes none of the core: it stops publishing its last loop (else the other
    models keep simulating it beside their own), and publishes it again once a request is in the server."""
    a = Autotuner(spec(100), TuningParams(16, 0.0), cores=1, name="a")
    drive_one_core(1, tuner=a)
    a.record_arrival(1, 100.0)
    a.record_batch(1, 1e-3, 100.001)
    assert a.neighbour(100.9) is not None
    assert a.neighbour(101.1) is None  # nothing in the server, nothing arrived for over IDLE_AFTER_S
    a.record_arrival(1, 130.0)
    assert a.neighbour(131.5) is not None  # still in the server: its loop runs
    a.record_batch(1, 1e-3, 131.5)
    assert a.neighbour(131.6) is None


def test_an_idle_models_trial_holds_no_one_back() -> None:
    """A trial left in force when the load went away is not announced as one (it would hold the other models'
    searches until this model's clients came back); it is again once requests come."""
    tuner = Autotuner(spec(50), COLD)
    sim = BatcherSim(CPU, ClosedLoop(32, think_s=0.001), COLD, seed=1, tuner=tuner)
    while not tuner.trying(sim.now):
        assert sim.now < 30.0, "no trial in 30 s"
        sim.run_until(sim.now + 0.05)
    trial = tuner.params
    sim.load = ClosedLoop(0)
    sim.run_until(sim.now + 3.0)
    assert tuner.params == trial and not tuner.trying(sim.now)  # still in force, no longer announced
    sim.load = ClosedLoop(32, think_s=0.001)
    sim.run_until(sim.now + 0.01)
    assert tuner.params == trial and tuner.trying(sim.now)


def test_while_another_model_tries_a_setting_this_one_holds_its_own() -> None:
    """One trial at a time on a shared core: with a neighbour's trial in force the tuner starts no probe or
    plan of its own; once it is over, the search goes on."""
    tuner = Autotuner(spec(50), COLD)
    tuner.set_neighbours([], others_trying=True)
    sim = BatcherSim(CPU, ClosedLoop(32, think_s=0.001), COLD, seed=1, tuner=tuner)
    sim.run_until(10.0)
    assert not [d for _, d in sim.decisions if d.changed]
    tuner.set_neighbours([], others_trying=False)
    sim.run_until(20.0)
    assert [d for _, d in sim.decisions if d.changed]


def test_a_violation_is_answered_by_a_re_plan_not_a_backoff() -> None:
    """With a fit over several sizes, an SLO break is re-planned with the measured tail; the pick holds."""
    load = ClosedLoop(32, think_s=0.002)
    sim, _ = tuned(CPU, load, 30.0, slo_ms=25, initial=TuningParams(32, 0.010))
    first = sim.decisions[0][1]
    assert (first.reason, first.detail.get("knob")) == ("slo-violation", "plan")
    assert "predicted_p99_ms" in first.detail and first.detail["p99_ms"] > 25
    best_x, _ = oracle(CPU, load, 0.025)
    s = sim.stats(15.0, 30.0)
    assert s.throughput_rps >= 0.95 * best_x and s.p99_s <= 0.025


def test_a_passing_stall_does_not_undo_a_good_setting() -> None:
    """A moment's stall (the model 4x slower for 0.3 s: another process's burst on the core) breaks the SLO
    in one epoch. The re-plan predicts nothing better than the setting in force, so it is kept and measured
    again from after the stall (logged, no change); the fixed backoff would drop the delay and double the
    size. Only a second break in a row at the same setting, or a tail past twice the SLO, backs off."""
    load = ClosedLoop(32, think_s=0.002)
    sim, tuner = tuned(CPU, load, 30.0, initial=TuningParams(16, 0.002))  # settles at 32 / 2 ms
    settled = tuner.params
    sim.latency = LinearLatency(4 * CPU.a_s, 4 * CPU.b_s)
    sim.run_until(30.3)
    sim.latency = CPU
    sim.run_until(45.0)
    after = [d for t, d in sim.decisions if t >= 30.0]
    assert [(d.reason, d.detail.get("knob"), d.changed) for d in after] == [("slo-violation", "kept", False)]
    assert tuner.params == settled
    assert sim.stats(35.0, 45.0).throughput_rps >= 0.95 * oracle(CPU, load)[0]


def test_a_draining_backlog_is_not_acted_on() -> None:
    """A burst (8x the rate for 0.4 s) leaves a queue; while it drains (serving more than arrives) every answer
    breaks the SLO whatever the setting, so nothing changes until it has (without the rule, the backoff walked
    the size 8 -> 16 -> 32 -> 64 in 2 s of draining)."""
    tuner = Autotuner(spec(50), COLD)
    sim = BatcherSim(CPU, Poisson(1000), COLD, seed=2, tuner=tuner)
    sim.run_until(30.0)
    sim.load = Poisson(8000)
    sim.run_until(30.4)
    sim.load = Poisson(1000)
    sim.run_until(45.0)
    assert sim.changes_between(30.5, 34.0) == 0
    after = sim.stats(36.0, 45.0)
    assert after.p99_s <= 0.050 and after.throughput_rps >= 0.97 * 1000


def test_an_slo_break_is_never_answered_with_less_pace() -> None:
    """A closed loop of 16 clients breaks the SLO at 400 items/s. The plan predicts a small batch (4 / 10 ms)
    within the SLO at 300 items/s: in a closed loop a lower rate is a longer round trip for the same clients
    (live, such picks walked resnet-mini down to 1 / 0 ms), so it is not taken; with nothing else predicted
    better, the setting is kept and measured again."""
    here, slower, other = TuningParams(16, 0.0), TuningParams(4, 0.010), TuningParams(16, 0.010)
    tuner = Autotuner(spec(50), here)
    m = Measurement(
        params=here, duration_s=2.0, completed=800, items_per_s=400.0, arrival_rate=400.0, company_share=1.0,
        mean_s=0.040, mean_se=0.001, mean_wait_s=0.020, p99_s=0.055, utilization=0.85, largest_batch=16,
        peak_in_server=16,
    )  # fmt: skip

    def predicted(p: TuningParams, items: float, p99: float) -> CandidatePrediction:
        return CandidatePrediction(p, items, p99, 0.8 * p99, float(p.max_batch_size), 0.8, True)

    preds = (predicted(here, 400, 0.055), predicted(slower, 300, 0.040), predicted(other, 395, 0.052))
    plan = Plan(preds[1], True, 0.045, preds)
    fit = LatencyFit(0.4e-3, 1.2e-3)
    job = PlanJob("closed", fit, (here, slower, other), 0.045, 0.0, 2000, clients=16, think_s=0.0)
    out = Outstanding(job, fit, read_workload(m), m, here, violation=True)
    decision = tuner._after_plan(out, Solved(plan, 0.0), now=10.0)
    assert decision is not None and (decision.reason, decision.detail.get("knob")) == ("slo-violation", "kept")
    assert not decision.changed and tuner.params == here


class DeferredPlans:
    """The tuner as the server runs it: plans handed out by `step`, answered `lag_s` later."""

    def __init__(self, tuner: Autotuner, lag_s: float) -> None:
        self.tuner, self.lag_s = tuner, lag_s
        self.asked: dict[int, float] = {}  # id(job) -> when it was handed out
        self.jobs = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.tuner, name)

    def step(self, now: float) -> object:
        decision = self.tuner.step(now)
        job = self.tuner.plan_job
        if job is not None:
            if id(job) not in self.asked:
                self.asked[id(job)] = now
                self.jobs += 1
            elif now >= self.asked[id(job)] + self.lag_s:
                self.tuner.plan_solved(job, solve(job), now)
        return decision


def test_plans_solved_off_the_loop_reach_the_same_setting() -> None:
    load = ClosedLoop(64, think_s=0.001)
    inline, _ = tuned(CPU, load, 30.0)
    deferred = DeferredPlans(Autotuner(spec(50), COLD, inline_plans=False), lag_s=0.5)
    sim = BatcherSim(CPU, load, COLD, seed=1, tuner=deferred)  # type: ignore[arg-type]
    sim.run_until(30.0)
    assert deferred.jobs >= 1 and any(d.reason == "plan" for _, d in sim.decisions)
    best_x, _ = oracle(CPU, load)
    s = sim.stats(20.0, 30.0)
    assert s.throughput_rps >= 0.95 * best_x and s.p99_s <= 0.050
    assert s.throughput_rps == pytest.approx(inline.stats(20.0, 30.0).throughput_rps, rel=0.05)


def test_an_answer_to_a_plan_no_longer_waited_for_is_dropped() -> None:
    tuner = Autotuner(spec(50), TuningParams(16, 0.002), inline_plans=False)
    sim = BatcherSim(CPU, ClosedLoop(64, think_s=0.001), TuningParams(16, 0.002), seed=1, tuner=tuner)
    while tuner.plan_job is None and sim.now < 20.0:
        sim.run_until(sim.now + 0.25)
    job = tuner.plan_job
    assert job is not None
    tuner.lower_ceiling(4, sim.now)  # the setting changes while the plan is out
    assert tuner.plan_job is None
    assert tuner.step(sim.now).reason == "ceiling"
    tuner.plan_solved(job, solve(job), sim.now)
    assert tuner.step(sim.now + 0.01) is None and tuner.params.max_batch_size <= 4


def test_beside_another_model_on_a_saturated_core_no_setting_costs_more_cpu_per_item() -> None:
    """Two closed loops on one busy core (this model 50% of it, the other 45%): the plan predicts 4 / 4 ms
    within the SLO at more items/s, but its batches of 4 would spend more of the core per item, taken from the
    other model (live, such picks held resnet-mini at p99 60-88 ms where 16 / 10 ms holds 43). It is not taken:
    the break, of batches short of the clients, backs off to a longer delay (fuller batches) at once, not to none.
    With several cores, the same plan is taken."""
    here, small, longer = TuningParams(16, 0.002), TuningParams(4, 0.004), TuningParams(16, 0.004)

    def measured(background: float) -> Measurement:
        return Measurement(
            params=here, duration_s=2.0, completed=700, items_per_s=350.0, arrival_rate=350.0, company_share=1.0,
            mean_s=0.045, mean_se=0.001, mean_wait_s=0.010, p99_s=0.060, utilization=0.85, largest_batch=16,
            mean_batch=11.0, full_share=0.2, peak_in_server=16, frontend_cpu_s=0.1e-3,
            background_cpu=background, own_cpu=0.5,
        )  # fmt: skip

    def predicted(p: TuningParams, items: float, p99: float, batch: float) -> CandidatePrediction:
        return CandidatePrediction(p, items, p99, 0.8 * p99, batch, 0.8, True)

    preds = (predicted(here, 350, 0.060, 11.0), predicted(small, 380, 0.040, 4.0), predicted(longer, 340, 0.058, 14))
    fit = LatencyFit(0.8e-3, 1.2e-3)
    job = PlanJob("closed", fit, tuple(c.params for c in preds), 0.045, 0.0, 2000, clients=16, think_s=0.0)

    def answer(background: float, cores: int = 1) -> tuple[Autotuner, Decision | None]:
        tuner = Autotuner(spec(50), here, cores=cores)
        m = measured(background)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=True)
        return tuner, tuner._after_plan(out, Solved(Plan(preds[1], True, 0.045, preds), 0.0), now=10.0)

    tuner, fuller = answer(0.45)
    assert fuller is not None and (fuller.reason, fuller.params) == ("slo-violation", longer)
    # A later break's epoch cut short before two CPU readings: the shares last measured still hold.
    unread = replace(measured(0.45), frontend_cpu_s=None, own_cpu=0.0, background_cpu=0.0)
    assert tuner._frugal(unread, read_workload(unread))
    _, alone = answer(0.0)  # (alone on one core its batches of 4 are smaller than those it forms: not taken either)
    assert alone is not None and alone.params == longer
    _, several = answer(0.0, cores=0)
    assert several is not None and several.reason == "slo-violation" and several.params == small


def test_a_first_break_on_a_short_reading_is_measured_again_unless_the_queue_really_grew() -> None:
    """Violations are checked on epochs as short as 0.1 s, where 6% more arrivals than answers is chance (live, in
    soaks at 85% load 7-11 of the breaks logged a run came with such readings). A first break whose queue rose by a few
    items is measured again; one whose queue rose past two batches and the arrival count's noise is backed off
    at once, as is one holding twice the SLO's worth of work."""
    here = TuningParams(16, 0.002)
    reading = Measurement(
        params=here, duration_s=0.3, completed=140, items_per_s=460.0, arrival_rate=490.0, company_share=0.9,
        mean_s=0.020, mean_se=0.001, mean_wait_s=0.008, p99_s=0.055, utilization=0.85, largest_batch=16,
        peak_in_server=24, lag_ratio=1.0, in_server=20, backlog_growth=5,
    )  # fmt: skip
    job = PlanJob("open", LatencyFit(1.1e-3, 1.6e-3), (here,), 0.045, 0.0, 2000, arrival_rate=490.0)

    def after_no_better_plan(m: Measurement) -> Decision | None:
        tuner = Autotuner(spec(50), here)
        out = Outstanding(job, job.fit, read_workload(m), m, here, violation=True)
        return tuner._after_plan(out, None, now=10.0)

    chance = after_no_better_plan(reading)
    assert chance is not None and (chance.detail.get("knob"), chance.changed) == ("kept", False)
    grew = after_no_better_plan(replace(reading, in_server=50, backlog_growth=35))
    assert grew is not None and grew.changed and grew.reason == "slo-violation" and grew.params != here
    long_queue = after_no_better_plan(replace(reading, in_server=60, backlog_growth=0))  # 2 x 50 ms x 460/s = 46
    assert long_queue is not None and long_queue.changed


def test_a_break_on_a_busy_executor_is_never_answered_with_a_lower_limit() -> None:
    """NLP batches pad to longer lengths as they grow, so their cost per item rises with the size and the fit
    pivots towards the origin: little or no fixed cost per batch, a 1-item batch about as cheap per item as a
    64-item one. On a busy executor such plans answered breaks with 64 -> 1 item (live, a soak at 85% load: p99
    0.25 -> 1.1 s as the batches fell to 1-4 items). On a busy core an open loop's pick never lowers the limit (at a
    delay of 0 a limit only caps what the bursts bring); an idle executor's break may still go small."""
    here, one, half = TuningParams(64, 0.0), TuningParams(1, 0.0), TuningParams(32, 0.0)
    busy = Measurement(
        params=here, duration_s=1.0, completed=500, items_per_s=502.0, arrival_rate=457.0, company_share=1.0,
        mean_s=0.108, mean_se=0.004, mean_wait_s=0.041, p99_s=0.252, utilization=0.997, largest_batch=64,
        mean_batch=17.4, peak_in_server=66, lag_ratio=0.96,
    )  # fmt: skip
    fit = LatencyFit(1.6856e-3, 0.0)

    def predicted(p: TuningParams, p99: float) -> CandidatePrediction:
        return CandidatePrediction(p, 457.0, p99, 0.5 * p99, float(p.max_batch_size), 0.8, False)

    preds = (predicted(here, 0.250), predicted(one, 0.066), predicted(half, 0.120))
    kept_large = answer_open_plan(busy, preds, fit, violation=True)
    assert kept_large is None or kept_large.params.max_batch_size >= 64
    idle = answer_open_plan(replace(busy, utilization=0.45), preds, fit, violation=True)
    assert idle is not None and idle.params == one


def answer_open_plan(
    m: Measurement,
    preds: tuple[CandidatePrediction, ...],
    fit: LatencyFit,
    *,
    violation: bool,
    broke: tuple[TuningParams, ...] = (),
    sizes: tuple[int, ...] = (),
    tuner: Autotuner | None = None,
) -> Decision | None:
    """What a tuner at preds[0]'s setting does with an open-loop plan over `preds` whose pick was preds[1] (`broke`:
    settings that broke the SLO since it was last met; `sizes`: batch sizes it has fitted; `tuner`: that tuner, a fresh
    one when None)."""
    here = preds[0].params
    job = PlanJob("open", fit, tuple(c.params for c in preds), 0.045, 0.0, 2000, arrival_rate=m.arrival_rate)
    tuner = Autotuner(spec(50), here) if tuner is None else tuner
    tuner._broke.update(broke)
    for i in range(4):
        for n in sizes:
            tuner.record_batch(n, fit(n), 9.0 + 0.1 * i)
    out = Outstanding(job, fit, read_workload(m), m, here, violation=violation)
    return tuner._after_plan(out, Solved(Plan(preds[1], False, 0.045, preds), 0.0), now=10.0)


def test_an_open_loop_search_on_a_busy_core_never_lowers_the_limit() -> None:
    """An open loop at 80% load on one core: batches of 2.3 under 16 / 2 ms, the executor 67% busy and the core 79%
    (with the front-ends). The plan promised 2 / 0 ms a p99 of 13 ms; tried, it read 95 ms within 0.3 s and that one
    trial broke the run's p99 (live). A search never lowers the limit while the core is busy; on an idle core it may
    still go small."""
    here, two, four = TuningParams(16, 0.002), TuningParams(2, 0.0), TuningParams(4, 0.0)
    busy = Measurement(
        params=here, duration_s=1.5, completed=488, items_per_s=325.6, arrival_rate=325.6, company_share=1.0,
        mean_s=0.0085, mean_se=0.0003, mean_wait_s=0.003, p99_s=0.0167, utilization=0.673, largest_batch=6,
        mean_batch=2.26, peak_in_server=7, lag_ratio=1.0, own_cpu=0.793,
    )  # fmt: skip
    assert not read_workload(busy).closed
    fit = LatencyFit(1.9e-3, 0.3e-3)

    def predicted(p: TuningParams, p99: float) -> CandidatePrediction:
        return CandidatePrediction(p, 325.6, p99, 0.5 * p99, 2.0, 0.7, False)

    preds = (predicted(here, 0.0167), predicted(two, 0.0131), predicted(four, 0.0133))
    kept = answer_open_plan(busy, preds, fit, violation=False)
    assert kept is None or kept.params.max_batch_size >= 16
    # Nor at 69% (live, a soak: 64 / 0 -> 8 / 4 ms with the executor and the core 69% busy read p99 0.95 s).
    middling = answer_open_plan(replace(busy, own_cpu=0.69, utilization=0.69), preds, fit, violation=False)
    assert middling is None or middling.params.max_batch_size >= 16
    idle = answer_open_plan(replace(busy, own_cpu=0.45, utilization=0.4), preds, fit, violation=False)
    assert idle is not None and idle.params == two


def test_an_open_loop_plan_never_grows_the_limit_past_twice_the_sizes_it_has_fitted() -> None:
    """Live, run U F2 (textcls at 95% load, one core): a break under 16 / 2 ms with batches of 13 was re-planned to 64 /
    8 ms, predicted to keep pace at p99 51 ms by a line fitted on batches of up to 16; padded batches of 64 cost more
    than the line, fell behind, and the row read p99 1.34 s. The limit grows by doubling (each step then fitted)."""
    # (At the incumbent's delay: on this saturated core no plan lengthens it, `_waits_longer`.)
    here, far, next_ = TuningParams(16, 0.002), TuningParams(64, 0.002), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=1530, items_per_s=1019.6, arrival_rate=1041.9, company_share=1.0,
        mean_s=0.024, mean_se=0.001, mean_wait_s=0.012, p99_s=0.0523, utilization=0.886, largest_batch=16,
        mean_batch=12.96, peak_in_server=52, lag_ratio=1.04, own_cpu=0.995, full_share=0.4,
    )  # fmt: skip
    fit = LatencyFit(0.797e-3, 1.32e-3)
    preds = tuple(CandidatePrediction(p, 1041.9, t, 0.5 * t, 8.0, 0.9, False) for p, t in
                  ((here, 0.090), (far, 0.051), (next_, 0.065)))  # fmt: skip
    bounded = answer_open_plan(m, preds, fit, violation=True, sizes=(4, 8, 12, 16))
    assert bounded is not None and bounded.params == next_
    unknown = answer_open_plan(m, preds, fit, violation=True)  # no batches fitted: no bound
    assert unknown is not None and unknown.params == far
    # Nor past twice the incumbent's limit, whatever was fitted: live (run AW, textcls at 95% load), batches of 32
    # fitted during a trial given back let a break's plan go 16 / 2 -> 64 / 0.5 ms, and the row read p99 219 ms.
    doubled = answer_open_plan(m, preds, fit, violation=True, sizes=(4, 8, 16, 32))
    assert doubled is not None and doubled.params == next_


def test_an_open_loop_within_the_slo_on_a_saturated_core_starts_no_search_trial() -> None:
    """Live (run V A, textcls at 80% load, the core 99% busy): under 16 / 2 ms at p99 37 ms, a search tried 32 / 8 ms,
    predicted 26 ms, which read 61 ms at once; the next tried 32 / 10 ms and the row read 49 ms where a static setting
    held 35. Every stable setting serves an open loop's arrivals, so within the SLO its objective is met and a trial
    could only shorten a tail already within it. With the core not saturated the search still tries."""
    here, longer = TuningParams(16, 0.002), TuningParams(32, 0.008)
    m = Measurement(
        params=here, duration_s=1.5, completed=1180, items_per_s=785.1, arrival_rate=796.8, company_share=1.0,
        mean_s=0.0167, mean_se=0.0005, mean_wait_s=0.006, p99_s=0.0369, utilization=0.855, largest_batch=16,
        mean_batch=7.49, peak_in_server=30, lag_ratio=1.02, own_cpu=0.993, full_share=0.1,
    )  # fmt: skip
    assert not read_workload(m).closed
    fit = LatencyFit(0.8e-3, 1.2e-3)
    preds = tuple(CandidatePrediction(p, 796.8, t, 0.5 * t, 8.0, 0.8, False) for p, t in
                  ((here, 0.0369), (longer, 0.0258)))  # fmt: skip
    assert answer_open_plan(m, preds, fit, violation=False) is None
    tried = answer_open_plan(replace(m, own_cpu=0.6), preds, fit, violation=False)
    assert tried is not None and tried.reason == "plan" and tried.params == longer


def test_an_open_loop_on_a_saturated_core_is_never_planned_a_longer_delay() -> None:
    """Live (run V A, textcls, the open loop's 3x step, core 95% busy): a break under 16 / 2 ms was re-planned to 32 /
    8 ms, predicted p99 34 ms; it read 62-72 ms and was declared infeasible. On a saturated core batches form from the
    queue while the executor runs, and a delay only holds back the items that find it idle: no plan lengthens it there
    (a larger limit at the same delay may still be picked). With the core not saturated the longer delay is taken."""
    here, longer, wider = TuningParams(16, 0.002), TuningParams(32, 0.008), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=1290, items_per_s=863.9, arrival_rate=860.0, company_share=1.0,
        mean_s=0.0185, mean_se=0.0006, mean_wait_s=0.007, p99_s=0.0551, utilization=0.825, largest_batch=16,
        mean_batch=8.52, peak_in_server=34, lag_ratio=1.0, own_cpu=0.946, full_share=0.2,
    )  # fmt: skip
    assert not read_workload(m).closed
    fit = LatencyFit(0.8e-3, 1.2e-3)

    def preds(*options: tuple[TuningParams, float]) -> tuple[CandidatePrediction, ...]:
        return tuple(CandidatePrediction(p, 860.0, t, 0.5 * t, 8.0, 0.8, False) for p, t in ((here, 0.055), *options))

    none = answer_open_plan(m, preds((longer, 0.034)), fit, violation=True)
    assert none is not None and none.params == here and not none.changed  # (a first break: measured again)
    kept = answer_open_plan(m, preds((longer, 0.034), (wider, 0.040)), fit, violation=True)
    assert kept is not None and kept.params == wider
    idle_core = answer_open_plan(replace(m, own_cpu=0.6), preds((longer, 0.034)), fit, violation=True)
    assert idle_core is not None and idle_core.params == longer


def test_an_epoch_without_cpu_readings_reads_the_core_as_last_measured() -> None:
    """An epoch cut short by a violation (0.25 s after a change) may hold no two CPU readings: its core shares read 0.
    Live (soak AT2, textcls at 85% load), such a break at 16 / 0 ms passed for a core not saturated, and its plan moved
    to 32 / 8 ms (predicted p99 76 ms, read 80-104), where the soak was then held. The core reads as last measured, so
    no plan lengthens the delay there; a tuner that never measured it still reads it as idle."""
    here = TuningParams(16, 0.0)
    measured = Measurement(
        params=TuningParams(16, 0.002), duration_s=2.0, completed=1750, items_per_s=875.1, arrival_rate=903.0,
        company_share=1.0, mean_s=0.0206, mean_se=0.0005, mean_wait_s=0.0085, p99_s=0.0571, utilization=0.901,
        largest_batch=16, mean_batch=10.1, peak_in_server=46, low_in_server=5, lag_ratio=1.03, own_cpu=0.996,
        frontend_cpu_s=0.215e-3,
    )  # fmt: skip
    short = replace(
        measured, params=here, duration_s=0.25, completed=215, items_per_s=858.7, arrival_rate=1000.3, p99_s=0.0514,
        utilization=0.822, mean_batch=13.86, peak_in_server=44, low_in_server=10, own_cpu=0.0, frontend_cpu_s=None,
    )  # fmt: skip
    w, longer = read_workload(short), TuningParams(32, 0.008)
    assert not w.closed
    tuner = Autotuner(spec(50), here)
    assert tuner._saturated(measured)
    assert tuner._waits_longer(longer, short, w) and not tuner._idle(replace(short, utilization=0.4))
    fresh = Autotuner(spec(50), here)
    assert not fresh._waits_longer(longer, short, w) and fresh._idle(replace(short, utilization=0.4))


def soak_break(
    p99s: dict[TuningParams, float], **figures: float
) -> tuple[Measurement, tuple[CandidatePrediction, ...]]:
    """A break of textcls at 4 / 0 ms in a soak at 85% load (live): 323 items/s arriving, 256 served, batches of 4,
    and an open-loop plan's predicted tails for the settings of `p99s` (the first is the incumbent)."""
    here = TuningParams(4, 0.0)
    m = Measurement(
        params=here, duration_s=2.0, completed=512, items_per_s=256.0, arrival_rate=323.0, company_share=1.0,
        mean_s=0.349, mean_se=0.01, mean_wait_s=0.3, p99_s=0.728, utilization=0.583, largest_batch=4,
        mean_batch=4.0, peak_in_server=4, lag_ratio=1.0, own_cpu=0.655,
    )  # fmt: skip
    preds = tuple(CandidatePrediction(p, 323.0, t, 0.5 * t, 4.0, 0.7, False) for p, t in p99s.items())
    return replace(m, **figures), preds


def test_an_slo_break_is_never_answered_with_a_setting_that_broke_it_since_it_was_last_met() -> None:
    """Live, a soak at 85% load: at each break the re-plan picked 4 / 10 ms and the backoff's delay drop went back to
    4 / 0 ms, every 2 s for 10 s, each setting breaking the SLO again, while the queue grew to a p99 of 1.85 s. A
    re-plan skips the settings that broke the SLO since an epoch last met it; a search is not so restricted."""
    here, waits, wider = TuningParams(4, 0.0), TuningParams(4, 0.010), TuningParams(8, 0.0)
    m, preds = soak_break({here: 0.70, waits: 0.149, wider: 0.30})
    fit = LatencyFit(2.0e-3, 0.1e-3)
    assert answer_open_plan(m, preds, fit, violation=True).params == waits  # type: ignore[union-attr]
    other = answer_open_plan(m, preds, fit, violation=True, broke=(here, waits))
    assert other is not None and other.params == wider


def test_a_limit_that_full_batches_leave_a_queue_behind_is_never_planned_again_or_lower() -> None:
    """The same soak's 4 / 0 ms filled every batch while a queue stood behind them and the executor read only 58%
    busy: neither that limit (with another delay) nor a lower one is a pick for the open loop, at a break or in a
    search; with batches that do not fill it, the limit may stay."""
    here, waits = TuningParams(4, 0.0), TuningParams(4, 0.010)
    halved, wider = TuningParams(2, 0.0), TuningParams(8, 0.0)
    p99s = {here: 0.70, waits: 0.149, halved: 0.20, wider: 0.30}
    fit = LatencyFit(2.0e-3, 0.1e-3)
    binding, preds = soak_break(p99s, full_share=1.0, peak_in_server=12)
    for violation in (True, False):
        pick = answer_open_plan(binding, preds, fit, violation=violation)
        assert pick is not None and pick.params == wider
    unfilled, preds = soak_break(p99s, full_share=0.2, peak_in_server=12)
    pick = answer_open_plan(unfilled, preds, fit, violation=True)
    assert pick is not None and pick.params == waits


def test_an_open_loop_on_a_busy_core_never_backs_off_to_halved_batches() -> None:
    """Live, the soak at 85% load: a break at 4 / 0 ms under batches of 2.6 with the core 76% busy halved the limit to
    2 / 0 ms and the next break came 0.3 s later. An open loop on a busy core that keeps pace under batches short of
    the limit keeps it instead (a doubled one adds no capacity it needs: see
    `test_an_open_loop_that_keeps_pace_never_doubles_a_limit_its_batches_leave_short_of`); on an idle core a halving is
    still the backoff when the batches are slow."""
    here = TuningParams(4, 0.0)
    m, _ = soak_break({}, items_per_s=330.0, arrival_rate=330.0, p99_s=0.094, utilization=0.716, mean_batch=2.61,
                      own_cpu=0.758, mean_wait_s=0.004, mean_s=0.020, peak_in_server=12)  # fmt: skip
    assert not read_workload(m).closed
    assert Autotuner(spec(50), here)._backoff(m) is None
    idle = replace(m, utilization=0.4, own_cpu=0.45)
    assert Autotuner(spec(50), here)._backoff(idle) == TuningParams(2, 0.0)


def test_an_open_loop_on_a_busy_core_keeps_the_delay_that_gathers_its_batches() -> None:
    """Live, run S2 (resnet-mini, Poisson at 80% load): a break at 16 / 2 ms under batches of 6.8 with the core 72%
    busy dropped the delay to 16 / 0 ms, and the row read p99 102 ms where 16 / 2 ms alone held 34. On a busy core the
    backoff keeps such a delay (and, the batches short of the limit keeping pace, the limit), and a re-plan picks no
    shorter one; with full batches (the delay gathers nothing) or on an idle core the delay still drops."""
    here, shorter, wider = TuningParams(16, 0.002), TuningParams(16, 0.0), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=600, items_per_s=402.5, arrival_rate=387.1, company_share=1.0,
        mean_s=0.050, mean_se=0.002, mean_wait_s=0.02, p99_s=0.106, utilization=0.656, largest_batch=16,
        mean_batch=6.77, peak_in_server=30, lag_ratio=1.0, own_cpu=0.723, full_share=0.1,
    )  # fmt: skip
    assert not read_workload(m).closed
    assert Autotuner(spec(50), here)._backoff(m) is None
    assert Autotuner(spec(50), here)._backoff(replace(m, full_share=0.9)) == shorter
    assert Autotuner(spec(50), here)._backoff(replace(m, utilization=0.4, own_cpu=0.45)) == shorter
    fit = LatencyFit(1.4e-3, 1.0e-3)
    preds = tuple(CandidatePrediction(p, 387.1, t, 0.5 * t, 6.0, 0.7, False) for p, t in
                  ((here, 0.106), (shorter, 0.060), (wider, 0.080)))  # fmt: skip
    pick = answer_open_plan(m, preds, fit, violation=True)
    assert pick is not None and pick.params == wider
    idle = answer_open_plan(replace(m, utilization=0.4, own_cpu=0.45), preds, fit, violation=True)
    assert idle is not None and idle.params == shorter
    # Nor does a break declared infeasible drop it (live, run W2: 64 / 2 -> 64 / 0 ms so, the core 94% busy).
    held = Autotuner(spec(50), here)._declare_infeasible(m, now=10.0)
    assert held.params == here and not held.changed
    assert Autotuner(spec(50), here)._declare_infeasible(replace(m, utilization=0.4, own_cpu=0.45), 10.0).changed


def fitted_tuner(
    params: TuningParams, sizes: tuple[int, ...], *, wall: tuple[float, float], cpu: tuple[float, float]
) -> Autotuner:
    """A one-core tuner at `params` that has seen eight batches of each size, taking a * n + b seconds of wall
    time and of CPU (`wall`, `cpu`: a, b)."""
    tuner = Autotuner(spec(50), params, cores=1)
    for i in range(8):
        for n in sizes:
            tuner.record_batch(n, wall[0] * n + wall[1], 10.0 + 0.1 * i, cpu_s=cpu[0] * n + cpu[1])
    return tuner


def test_an_open_loops_cpu_fit_takes_its_level_from_the_epochs_own_batches() -> None:
    """Live, run AZ (textcls, Poisson at 95% of capacity, one core): 16 / 2 ms served 1,389 items/s with the core
    saturated, 0.179 ms of front-end CPU an item and 0.541 of executor CPU, where the CPU fit over the last 30 s (0.46
    ms an item, 2.16 a batch) priced full batches of 16 at 1,292 items/s. Levelled on the epoch's own batches, the fit
    reads 16 at the pace served, its shape kept; before LEVEL_BATCHES batches, or without a CPU reading, it stays as
    fitted, and a reading far off moves it by LEVEL_BOUNDS at most."""
    here, cpu = TuningParams(16, 0.002), LatencyFit(0.46e-3, 2.16e-3)
    m = Measurement(
        params=here, duration_s=1.5, completed=2084, items_per_s=1389.4, arrival_rate=1427.6, company_share=1.0,
        mean_s=0.038, mean_se=0.001, mean_wait_s=0.027, p99_s=0.0704, utilization=0.883, largest_batch=16,
        mean_batch=16.0, full_share=1.0, peak_in_server=80, low_in_server=20, lag_ratio=1.05, own_cpu=1.0,
        frontend_cpu_s=0.179e-3, in_server=60, backlog_growth=40, exec_cpu=ExecCpu(130, 2080, 2080 * 0.541e-3),
    )  # fmt: skip
    tuner = fitted_tuner(here, (4, 8, 16), wall=(0.6e-3, 1.6e-3), cpu=(cpu.a_s, cpu.b_s))
    wall = tuner._memory.fit()
    assert wall is not None

    def capacity(m: Measurement, n: int) -> float:
        return n / tuner._open_fit(m, wall)(n)

    assert capacity(replace(m, exec_cpu=None), 16) == pytest.approx(1292, rel=0.01)
    assert capacity(m, 16) == pytest.approx(1389.4, rel=0.01)
    level = leveled(cpu, m)
    assert level.b_s / level.a_s == pytest.approx(cpu.b_s / cpu.a_s)
    few = replace(m, exec_cpu=ExecCpu(LEVEL_BATCHES - 1, 16 * (LEVEL_BATCHES - 1), 0.1))
    assert leveled(cpu, few) == cpu and leveled(cpu, replace(m, exec_cpu=None)) == cpu
    for per_item, bound in ((0.1e-3, LEVEL_BOUNDS[0]), (2e-3, LEVEL_BOUNDS[1])):
        wild = replace(m, exec_cpu=ExecCpu(130, 2080, 2080 * per_item))
        assert leveled(cpu, wild)(16) == pytest.approx(bound * cpu(16))


def test_an_open_loop_its_full_batches_fall_behind_backs_off_at_its_first_break() -> None:
    """Live, run BA2 (resnet-mini, Poisson at 95% of 32 / 2 ms's capacity, one core): full batches of 16 served 1,147
    items/s against 1,248 arriving. The first break was kept for 2.5 s (a stall passes), the next dropped the delay, and
    the limit doubled 5-6 s after the first break, the p99 by then 235-400 ms; three rows of three read 229-430 ms
    where 32 / 2 ms static held 26-33 ms. Such a break backs off at once: the limit doubled at the same delay where the
    fit says the doubled limit serves more (full batches leave without waiting out the delay: run BD1 lost 6 s and a
    row to the delay dropped first), else the delay, then the limit; batches that leave short of the limit, or a
    setting that keeps pace, are measured again first."""
    here, at_0 = TuningParams(16, 0.002), TuningParams(16, 0.0)
    m = Measurement(
        params=here, duration_s=1.5, completed=1720, items_per_s=1146.5, arrival_rate=1247.7, company_share=1.0,
        mean_s=0.035, mean_se=0.001, mean_wait_s=0.024, p99_s=0.0658, utilization=0.889, largest_batch=16,
        mean_batch=15.62, full_share=0.9, peak_in_server=70, low_in_server=10, lag_ratio=1.0, own_cpu=1.0,
        frontend_cpu_s=0.173e-3, in_server=60, backlog_growth=30, exec_cpu=ExecCpu(110, 1718, 1718 * 0.696e-3),
    )  # fmt: skip
    assert not read_workload(m).closed

    def answer(m: Measurement, params: TuningParams = here, per_batch_s: float = 1.5e-3) -> Decision:
        tuner = fitted_tuner(params, (4, 8, 16), wall=(0.63e-3, 1.67e-3), cpu=(0.55e-3, per_batch_s))
        decision = tuner._nothing_better(m, now=12.0)
        assert decision is not None
        return decision

    first = answer(m)
    assert first.params == TuningParams(32, 0.002) and first.detail.get("outgrown") is True  # (the log says why)
    flat = answer(m, per_batch_s=0.05e-3)  # an item's cost is the batch's: a doubled limit serves no more
    assert flat.params == at_0 and flat.detail.get("outgrown") is True
    assert answer(replace(m, params=at_0), at_0).params == TuningParams(32, 0.0)
    for measured_again in (replace(m, full_share=0.2, mean_batch=9.0), replace(m, arrival_rate=1160.0)):
        kept = answer(measured_again)
        assert kept.params == here and kept.detail.get("knob") == "kept"
    # At a limit itself raised at a break, whose queue it inherited, the delay goes first (run BD2: 16 / 2 -> 32 / 2 ->
    # 64 / 2 ms within a second, twice).
    raised = TuningParams(32, 0.002)
    at_32 = replace(m, params=raised, largest_batch=32, mean_batch=31.2, peak_in_server=140, in_server=120)
    tuner = fitted_tuner(raised, (8, 16, 32), wall=(0.63e-3, 1.67e-3), cpu=(0.55e-3, 1.5e-3))
    assert tuner._backoff(at_32) == TuningParams(64, 0.002)  # (not raised at a break: the limit binds)
    tuner._lifted = (raised, here)
    assert tuner._backoff(at_32) == TuningParams(32, 0.0)


def test_an_open_loop_whose_full_batches_bind_on_a_saturated_core_tries_a_doubled_limit_before_a_break() -> None:
    """Runs BA2 and BB (Poisson at 95% of 32 / 2 ms's capacity, one core): 16 / 2 ms met the SLO for its first seconds
    with its batches leaving full, then fell behind, and the queue gathered before the first break broke the row. Such
    an epoch tries the doubled limit at the same delay at once (`_headroom`). Batches that leave short of the limit, a
    core not saturated, an epoch over the SLO and a doubled limit already given back try nothing."""
    here, wider = TuningParams(16, 0.002), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=1755, items_per_s=1170.0, arrival_rate=1181.0, company_share=1.0,
        mean_s=0.021, mean_se=0.001, mean_wait_s=0.011, p99_s=0.038, utilization=0.89, largest_batch=16,
        mean_batch=15.3, full_share=0.8, peak_in_server=48, low_in_server=2, lag_ratio=1.0, own_cpu=1.0,
        frontend_cpu_s=0.17e-3, in_server=20, backlog_growth=4,
    )  # fmt: skip
    assert not read_workload(m).closed

    def next_move(m: Measurement, rejected: tuple[TuningParams, ...] = ()) -> Decision | None:
        tuner = fitted_tuner(here, (4, 8, 16), wall=(0.63e-3, 1.67e-3), cpu=(0.55e-3, 1.5e-3))
        tuner._inc_meas = m
        tuner._rejected.update(rejected)
        return tuner._next(now=12.0)

    tried = next_move(m)
    assert tried is not None and tried.params == wider and tried.detail.get("knob") == "headroom"
    # Short of full batches, however near the fit reads the arrivals to the limit's capacity (1,229 items/s, the
    # front-ends' CPU counted): on the fit's word alone, limits went on from 32 to 64 at 95% load and broke the SLO.
    early = next_move(replace(m, full_share=0.3, mean_batch=12.5))
    assert early is None or early.detail.get("knob") != "headroom"
    at_80 = replace(m, items_per_s=985.0, arrival_rate=985.0, full_share=0.1, mean_batch=7.5)
    for not_bound in (
        at_80,  # the queue forms the batches, with room to spare
        replace(m, own_cpu=0.6),  # the plan sees the limit's capacity
        replace(m, p99_s=0.06),  # a break: `_nothing_better` answers it
    ):
        other = next_move(not_bound)
        assert other is None or other.detail.get("knob") != "headroom"
    given_back = next_move(m, rejected=(wider,))
    assert given_back is None or given_back.params != wider


def test_a_settled_open_loop_whose_full_batches_bind_on_a_saturated_core_tries_headroom_at_an_epochs_end() -> None:
    """The settled path of `_headroom`, driven through `step` on recorded figures: an open loop settled at 16 / 2 ms,
    Poisson counts of arrivals at about 1,000 items/s leaving in batches of up to 16, the process busy all along (its
    CPU clock read every 0.25 s), answers at 20 ms. At its next epoch's end the search reopens and tries 32 / 2 ms; with
    the process half idle, the settled loop stays where it is."""
    here = TuningParams(16, 0.002)

    def settled_step(*, busy: float = 1.0, exec_cpu_s: float = 0.013) -> Decision | None:
        tuner = fitted_tuner(here, (4, 8, 16), wall=(0.63e-3, 1.67e-3), cpu=(0.55e-3, 1.5e-3))
        tuner._new_epoch(20.0, settle=0.0)
        t, cpu = 20.0, 100.0
        tuner.record_cpu(cpu, t)
        rng, waiting = np.random.default_rng(7), 0
        while t < 22.0:  # Poisson counts of 16 a batch's 16 ms on average, spread over it: 1,000 items/s
            arriving = int(rng.poisson(16))
            for j in range(arriving):
                tuner.record_arrival(1, t + j * 0.016 / max(arriving, 1))
            waiting += arriving
            t += 0.016
            if (n := min(waiting, 16)) > 0:
                tuner.record_batch(n, 0.014, t, cpu_s=exec_cpu_s)
                for _ in range(n):
                    tuner.record_request(0.020, 0.006, t, front_s=0.0002)
                waiting -= n
            if int(t / 0.25) != int((t - 0.016) / 0.25):
                cpu += busy * 0.25
                tuner.record_cpu(cpu, t)
        m = tuner._epoch_at(t).measure(t, tuner._in_server)
        assert not read_workload(m).closed and m.p99_s <= 0.05
        tuner._settled, tuner._ref, tuner._inc_meas = True, m, m
        return tuner.step(t)

    tried = settled_step()
    assert tried is not None and tried.params == TuningParams(32, 0.002) and tried.detail.get("knob") == "headroom"
    half_idle = settled_step(busy=0.5, exec_cpu_s=0.006)
    assert half_idle is None or half_idle.detail.get("knob") != "headroom"


def test_a_limit_tried_for_headroom_is_kept_within_the_trial_margin_whatever_the_incumbents_tail() -> None:
    """Live, run BC1 (textcls, Poisson at 80% load, one core, 16 / 2 ms at its capacity): the headroom trial of 32 / 2
    ms read p99 33.4 ms against 16's 23.5 and was given back on the tail (over 1.25 x + 1 ms); 16 / 2 ms then read p99
    52-57 ms within 2.5 s. Such a trial is judged on what it was tried for: kept within the trial margin (as a trial of
    the same setting for a plan is not), given back over it."""
    here, wider = TuningParams(16, 0.002), TuningParams(32, 0.002)
    inc = Measurement(
        params=here, duration_s=1.5, completed=2070, items_per_s=1379.5, arrival_rate=1382.8, company_share=1.0,
        mean_s=0.012, mean_se=0.0003, mean_wait_s=0.004, p99_s=0.0235, utilization=0.873, largest_batch=16,
        mean_batch=11.6, full_share=0.3, peak_in_server=40, lag_ratio=1.0, own_cpu=0.998, frontend_cpu_s=0.171e-3,
    )  # fmt: skip
    trial = replace(inc, params=wider, items_per_s=1379.8, arrival_rate=1361.9, p99_s=0.0334, mean_batch=13.0)

    def kept(t: Measurement, *, room: bool) -> bool:
        tuner = fitted_tuner(here, (4, 8, 16), wall=(0.63e-3, 1.67e-3), cpu=(0.45e-3, 2.5e-3))
        tuner._inc_meas = inc
        if room:
            assert tuner._make_room(wider, inc, now=12.0) is not None
        return tuner._confirms(t, inc)

    assert kept(trial, room=True)
    assert not kept(trial, room=False)
    assert not kept(replace(trial, p99_s=0.047), room=True)  # over the trial margin


def test_an_open_loops_limit_raised_at_a_break_that_keeps_breaking_tries_the_limit_it_replaced() -> None:
    """Live, run BC's soak (textcls, Poisson at 879 req/s, one core): a plan at a break moved 16 / 2 -> 32 / 2 ms, which
    held for nine minutes through 25 breaks that no plan could better (p99 50-91 ms an epoch), 16 / 2 ms never measured
    again. At the REVISIT-th such break the tuner tries the limit the raise replaced, judged against the break (kept
    within the SLO), and no headroom trial takes it back to the given-up limit at that load. Arrivals near the smaller
    limit's capacity, a growing queue, or a limit not raised at a break try nothing."""
    here, before = TuningParams(32, 0.002), TuningParams(16, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=1318, items_per_s=879.0, arrival_rate=880.0, company_share=1.0,
        mean_s=0.024, mean_se=0.001, mean_wait_s=0.012, p99_s=0.0612, utilization=0.8, largest_batch=32,
        mean_batch=11.2, full_share=0.05, peak_in_server=45, low_in_server=2, lag_ratio=1.0, own_cpu=0.9,
        frontend_cpu_s=0.17e-3, in_server=8, backlog_growth=2,
    )  # fmt: skip
    assert not read_workload(m).closed

    def breaks(m: Measurement, *, lifted: bool = True) -> tuple[Autotuner, list[Decision | None]]:
        tuner = fitted_tuner(here, (8, 16, 32), wall=(0.63e-3, 1.67e-3), cpu=(0.45e-3, 2.5e-3))
        if lifted:
            tuner._mark_raised(before, m)
        answers = []
        for i in range(REVISIT):
            answers.append(tuner._nothing_better(m, now=12.0 + 3 * i))
            tuner._strike = None  # (an epoch within the SLO with margin between the breaks)
        return tuner, answers

    tuner, answers = breaks(m)
    assert all(a is not None and a.params == here and a.detail.get("knob") == "kept" for a in answers[:-1])
    last = answers[-1]
    assert last is not None and last.params == before and last.detail.get("knob") == "revisit"
    # Judged against the break's figures: within the SLO, kept.
    trial = replace(m, params=before, p99_s=0.041, mean_batch=9.5, largest_batch=16, full_share=0.3)
    assert tuner._inc_meas == m and tuner._confirms(trial, m)
    # Kept, 16's full batches on a saturated core try no headroom back to 32 at this load; 30% more arrivals do.
    full = replace(trial, full_share=0.8, mean_batch=15.0, p99_s=0.03, own_cpu=1.0)
    tuner._incumbent = tuner._params = before
    tuner._rejected.clear()
    assert tuner._headroom(full, read_workload(full)) is None
    more = replace(full, arrival_rate=1160.0, items_per_s=1160.0)
    assert tuner._headroom(more, read_workload(more)) == here
    for not_revisited in (
        breaks(replace(m, arrival_rate=1250.0, items_per_s=1240.0))[1][-1],  # 16's full batches near capacity
        breaks(replace(m, arrival_rate=960.0, in_server=120, backlog_growth=110))[1][-1],  # a queue grows
        breaks(m, lifted=False)[1][-1],  # raised by no break
    ):
        assert not_revisited is None or not_revisited.params != before


def test_an_epoch_counts_its_executors_cpu_from_its_first_cpu_reading() -> None:
    """The executor CPU an epoch levels the fit with covers the batches since its first CPU reading (the front-end
    share is read over the same span)."""
    epoch = Epoch(TuningParams(16, 0.002), start=0.0, settled_at=0.0, slo_s=0.05)
    epoch.add_batch(16, 0.010, 0.1, cpu_s=0.009)
    assert epoch.measure(0.15).exec_cpu is None
    epoch.add_cpu(CpuReading(0.2, 1.0))
    epoch.add_batch(16, 0.010, 0.3, cpu_s=0.008)
    epoch.add_batch(8, 0.006, 0.4, cpu_s=0.005)
    epoch.add_cpu(CpuReading(0.5, 1.02))
    e = epoch.measure(0.5).exec_cpu
    assert e is not None and (e.batches, e.items) == (2, 24) and e.seconds == pytest.approx(0.013)
    assert e.mean_batch == 12.0 and e.per_batch_s == pytest.approx(0.0065)


def test_an_open_loop_never_backs_off_to_a_larger_limit_whose_capacity_it_does_not_need() -> None:
    """Live, run N2 (resnet-mini, Poisson at 80% load, one core): breaks under 16 / 2 ms with batches of 7.7 doubled the
    limit to 32, then 64, and the row read p99 152 ms where 16 / 2 ms alone held 36. By the fit (1.2 ms of CPU an item
    plus 0.48 ms of front-end, 2.8 ms a batch) full batches of 16 serve 540 items/s against 385 arriving: a larger limit
    adds capacity no one needs, and only lets a burst form longer batches. Such a break changes nothing; with the
    arrivals near that capacity, the executor busy all along, or before a fit over several sizes, the limit still
    doubles."""
    here, wider = TuningParams(16, 0.002), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=444, items_per_s=295.7, arrival_rate=384.6, company_share=1.0,
        mean_s=0.039, mean_se=0.002, mean_wait_s=0.017, p99_s=0.077, utilization=0.719, largest_batch=16,
        mean_batch=7.69, peak_in_server=40, lag_ratio=1.26, own_cpu=0.66, full_share=0.1, frontend_cpu_s=0.478e-3,
    )  # fmt: skip
    assert not read_workload(m).closed

    def fitted() -> Autotuner:
        return fitted_tuner(here, (2, 4, 8, 16), wall=(1.33e-3, 3.06e-3), cpu=(1.2e-3, 2.8e-3))

    assert fitted()._backoff(m) is None
    assert fitted()._backoff(replace(m, arrival_rate=500.0)) == wider  # 93% of what batches of 16 serve
    assert fitted()._backoff(replace(m, utilization=0.95)) == wider  # busy all along: the fit may predate a slowdown
    assert Autotuner(spec(50), here, cores=1)._backoff(m) == wider  # no fit: capacity unknown


def test_an_open_loop_that_keeps_pace_never_doubles_a_limit_its_batches_leave_short_of() -> None:
    """Live, soak AS4 (textcls, Poisson at 85% load, one core): a break at 16 / 2 ms under batches of 11.6, keeping
    pace (902 items/s served, 894 arriving) with the executor 94% busy, doubled the limit to 32, held for the rest of
    the soak at p99 58 ms; alone at that rate, 16 / 0 and 16 / 2 ms read 38 ms over 90 s, 32 / 0 ms 43. By the fit,
    batches of 32 would serve 5% more than batches of 16, but the batches leave short of 16: that limit holds nothing
    back. Such a break keeps the limit; with full batches and a queue behind them (at once, the delay kept: full
    batches leave without waiting it out), or the queue growing, it doubles."""
    here, wider = TuningParams(16, 0.002), TuningParams(32, 0.002)
    m = Measurement(
        params=here, duration_s=1.5, completed=1354, items_per_s=902.5, arrival_rate=894.0, company_share=1.0,
        mean_s=0.026, mean_se=0.001, mean_wait_s=0.012, p99_s=0.0574, utilization=0.935, largest_batch=16,
        mean_batch=11.6, full_share=0.3, peak_in_server=48, low_in_server=6, lag_ratio=1.13, own_cpu=1.0,
        frontend_cpu_s=0.22e-3,
    )  # fmt: skip
    assert not read_workload(m).closed

    def fitted(params: TuningParams = here) -> Autotuner:
        return fitted_tuner(params, (4, 8, 12, 16), wall=(0.884e-3, 1.81e-3), cpu=(0.884e-3, 1.81e-3))

    assert fitted()._backoff(m) is None
    full = replace(m, full_share=0.8, mean_batch=15.2)
    assert fitted()._backoff(full) == wider
    at_0 = TuningParams(16, 0.0)
    assert fitted(at_0)._backoff(replace(full, params=at_0)) == TuningParams(32, 0.0)
    assert fitted()._backoff(replace(m, arrival_rate=1000.0)) == wider  # (served 10% short of the arrivals)


def test_a_break_never_doubles_a_limit_whose_double_serves_no_more() -> None:
    """Live, run AH (textcls, Poisson at 95% load, one core): a break at 32 / 0 ms with full batches of 32 and the
    executor 92% busy doubled the limit to 64, whose batches (by the fit, 0.94 ms an item, 1.0 ms a batch, 0.36 ms of
    front-end an item) serve 1.2% more; the row held the SLO in 5 of 19 windows where 32 / 0 ms alone held 19 of 20.
    Such a break keeps the limit. Where a batch's fixed cost makes the doubled limit serve more (the same model's fit
    at 16, 3.3 ms a batch), or before a fit, it still doubles."""
    here = TuningParams(32, 0.0)
    m = Measurement(
        params=here, duration_s=1.3, completed=1113, items_per_s=856.6, arrival_rate=857.7, company_share=1.0,
        mean_s=0.096, mean_se=0.004, mean_wait_s=0.062, p99_s=0.142, utilization=0.916, largest_batch=32,
        mean_batch=32.0, peak_in_server=118, lag_ratio=1.05, own_cpu=0.974, full_share=1.0, frontend_cpu_s=0.357e-3,
    )  # fmt: skip
    assert not read_workload(m).closed

    def fitted(params: TuningParams, a_s: float, b_s: float) -> Autotuner:
        return fitted_tuner(params, (4, 8, 16, 32), wall=(a_s, b_s), cpu=(a_s, b_s))

    assert fitted(here, 0.94e-3, 1.0e-3)._backoff(m) is None
    assert fitted(here, 0.94e-3, 1.0e-3)._backoff(replace(m, frontend_cpu_s=None)) is None  # 1.6% more
    sixteen = replace(m, params=TuningParams(16, 0.0), largest_batch=16, mean_batch=16.0)
    assert fitted(TuningParams(16, 0.0), 0.62e-3, 3.3e-3)._backoff(sixteen) == here  # 9.5% more
    assert Autotuner(spec(50), here, cores=1)._backoff(m) == TuningParams(64, 0.0)  # no fit: capacity unknown


def test_a_limit_raised_on_an_open_loops_queue_is_not_doubled_again_while_it_drains_it() -> None:
    """Live, run AY3 (textcls, a 3x step of a Poisson load to 1,482 req/s, one core): a break at 16 / 0 ms, the queue
    growing behind full batches, doubled the limit to 32; 0.76 s later, 32 / 0 ms serving 1,557 items/s against 1,515
    arriving, a break on the 800 requests standing doubled it to 64, which then served no more than arrived, and the
    queue stood for the rest of the step (the same 0.5 s after a re-plan's 16 -> 32, live). Where the fit says its
    double serves no more, a limit raised at a break (by the backoff or a re-plan) is left as it is while it serves
    more than arrives, and for its first MEASURE_S; with the queue growing over a whole epoch, or where doubling pays
    (a batch's fixed cost), a break is acted on at once."""
    at_16, at_32 = TuningParams(16, 0.0), TuningParams(32, 0.0)
    m = Measurement(
        params=at_16, duration_s=0.6, completed=833, items_per_s=1388.6, arrival_rate=1487.2, company_share=1.0,
        mean_s=0.47, mean_se=0.01, mean_wait_s=0.46, p99_s=0.48, utilization=0.893, largest_batch=16,
        mean_batch=16.0, full_share=1.0, peak_in_server=720, lag_ratio=1.2, own_cpu=1.0, in_server=700,
        backlog_growth=120, frontend_cpu_s=0.315e-3,
    )  # fmt: skip
    assert not read_workload(m).closed

    def raised(a_s: float, b_s: float, planned: bool) -> Autotuner:
        """16 / 0 -> 32 / 0 ms at the break `m`: by the backoff, or by a re-plan's pick."""
        tuner = fitted_tuner(at_16, (4, 8, 16), wall=(a_s, b_s), cpu=(a_s, b_s))
        if planned:
            preds = tuple(CandidatePrediction(p, 1487.2, t, t / 2, p.max_batch_size, 0.9, False) for p, t in
                          ((at_16, 0.48), (at_32, 0.045)))  # fmt: skip
            decision = answer_open_plan(m, preds, LatencyFit(a_s, b_s), violation=True, tuner=tuner)
        else:
            decision = tuner._back_off(m, now=10.0)
        assert decision is not None and tuner.params == at_32
        return tuner

    # (0.35 ms an item, 1 ms a batch: 16 serves 1,374 items/s, 32 1,436, 64 1,469, 2.3% more)
    draining = replace(m, params=at_32, duration_s=0.76, items_per_s=1557.2, arrival_rate=1514.6, p99_s=0.533)
    draining = replace(draining, largest_batch=32, mean_batch=32.0, in_server=817, backlog_growth=-30)
    short = replace(draining, duration_s=0.5, items_per_s=1441.1, arrival_rate=1517.6)
    for planned in (False, True):
        tuner = raised(0.35e-3, 1.0e-3, planned)
        assert tuner._on_violation(draining, now=10.8) is None and tuner.params == at_32
        assert tuner.unanswered_break == ("a limit raised at a break: draining the queue", draining)
        tuner = raised(0.35e-3, 1.0e-3, planned)
        assert tuner._on_violation(short, now=10.6) is None and tuner.params == at_32
        assert tuner.unanswered_break == ("a limit raised at a break: judged over a whole epoch", short)
    for acted in (replace(short, duration_s=1.5), replace(short, refused_rate=50.0)):
        tuner = raised(0.35e-3, 1.0e-3, False)
        tuner._on_violation(acted, now=11.6)
        assert tuner.unanswered_break is None or not tuner.unanswered_break[0].startswith("a limit raised")
    for acted in (draining, short):  # (3 ms a batch: 64 serves 6% more than 32)
        tuner = raised(0.3e-3, 3.0e-3, False)
        tuner._on_violation(acted, now=10.8)
        assert tuner.unanswered_break is None or not tuner.unanswered_break[0].startswith("a limit raised")


def ah3_break(limit: int, **figures: float) -> Measurement:
    """Run AH3's break at `limit` / 0 ms (textcls, Poisson at 95% load, one core): full batches, 1,000 requests
    standing, the queue at its limit refusing a third of the arrivals."""
    m = Measurement(
        params=TuningParams(limit, 0.0), duration_s=1.5, completed=860, items_per_s=575.3, arrival_rate=759.0,
        company_share=1.0, mean_s=1.35, mean_se=0.01, mean_wait_s=1.27, p99_s=1.515, utilization=0.918,
        largest_batch=limit, mean_batch=float(limit), full_share=1.0, peak_in_server=1087, low_in_server=779,
        frontend_cpu_s=0.369e-3, own_cpu=0.956, lag_ratio=0.6, in_server=1000, backlog_growth=0, refused_rate=337.0,
    )  # fmt: skip
    return replace(m, **figures)


def run_ah3(tuner: Autotuner, per_item_ms: dict[int, float], at: float = 10.0, spread: float = 0.0) -> Autotuner:
    """`tuner` after PACE_BATCHES full batches of each size, `per_item_ms` of wall time an item (every other batch
    `spread` x slower, the next as much faster), under limits of each size put in force."""
    for n, ms in per_item_ms.items():
        tuner._limits_put.setdefault(n, 0.0)
        for i in range(20):
            wall_s = n * ms * 1e-3 * (1 + spread * (-1) ** i)
            tuner.record_batch(n, wall_s, at + 0.01 * i, cpu_s=wall_s)
    return tuner


def test_a_break_at_a_limit_a_smaller_one_outpaced_goes_back_to_it() -> None:
    """Live, run AH3 (textcls at 95% load, one core): the fit over 16 and 32 promised 64 11% more items/s; full
    batches of 64 then took 102 ms (575 items/s) where those of 32 had taken 25 ms (1,123), and the limit was held at
    64 with 700-1,050 requests standing. A break there goes back to 32 (measured on both sizes' batches; an infeasible
    hold stays one), and no backoff doubles 32 again while 64's batches are remembered. Noise is no such evidence:
    64's items 10% dearer keep the limit while its batches' own spread is as wide (`faster`); 20% dearer, they are sent
    back when every batch ran so (read as a closed loop, as this queue of 1,000 is: its clients wait on the answers)."""
    slow = {32: 0.79, 64: 1.6}
    tuner = run_ah3(Autotuner(spec(50), TuningParams(64, 0.0), cores=1), slow)
    back = tuner._on_violation(ah3_break(64), now=12.0)
    assert back is not None and back.params == TuningParams(32, 0.0)
    assert (back.reason, back.detail["knob"]) == ("slo-violation", "outpaced")
    assert back.detail["pace_before_items_per_s"] > 1.25 * back.detail["pace_items_per_s"]  # (scalars: logged)

    held = run_ah3(Autotuner(spec(50), TuningParams(64, 0.0), cores=1), slow)
    held._feasible = False
    again = held._on_violation(ah3_break(64), now=12.0)
    assert again is not None and again.params == TuningParams(32, 0.0) and not held.feasible

    at_32 = run_ah3(Autotuner(spec(50), TuningParams(32, 0.0), cores=1), {16: 0.9, **slow})
    assert at_32._backoff(ah3_break(32, items_per_s=1123.0, arrival_rate=1096.0, refused_rate=0.0)) is None
    twin = run_ah3(Autotuner(spec(50), TuningParams(32, 0.0), cores=1), {16: 0.9, 32: 0.79})
    assert twin._backoff(ah3_break(32, items_per_s=1123.0)) == TuningParams(64, 0.0)  # 64 unmeasured: the fit

    close = run_ah3(Autotuner(spec(50), TuningParams(64, 0.0), cores=1), {32: 0.79, 64: 0.87}, spread=0.25)
    assert close._outpaced(64, ah3_break(64)) is None
    steady = run_ah3(Autotuner(spec(50), TuningParams(64, 0.0), cores=1), {32: 0.79, 64: 0.95})
    assert steady._outpaced(64, ah3_break(64)) == 32
    assert steady._outpaced(64, ah3_break(64, lag_ratio=1.0)) is None  # an open loop: within SLOWER

    # Nor does a break's plan pick the slower size, whatever it predicts for it (its d(n) is the same line).
    def planned(per_item_ms: dict[int, float], spread: float = 0.0) -> Decision | None:
        here, wide = TuningParams(32, 0.0), TuningParams(64, 0.0)
        tuner = run_ah3(Autotuner(spec(50), here, cores=1), per_item_ms, spread=spread)
        m = ah3_break(32, items_per_s=1000.0, arrival_rate=1096.0, refused_rate=0.0, full_share=1.0)
        fit = LatencyFit(0.66e-3, 5.3e-3)
        preds = (
            CandidatePrediction(here, 1000.0, 0.250, 0.12, 32.0, 0.95, False),
            CandidatePrediction(wide, 1300.0, 0.030, 0.015, 60.0, 0.85, False),
        )
        job = PlanJob("open", fit, (here, wide), 0.045, 0.0, 2000, arrival_rate=m.arrival_rate)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=True)
        return tuner._after_plan(out, Solved(Plan(preds[1], False, 0.045, preds), 0.0), now=12.0)

    picked = planned({16: 0.9, 32: 0.79, 64: 0.87}, spread=0.25)
    assert picked is not None and picked.params == TuningParams(64, 0.0)  # (64 not measured slower: the plan's pick)
    kept = planned({16: 0.9, **slow})
    assert kept is None or kept.params.max_batch_size != 64


def test_an_epoch_without_a_cpu_reading_paces_the_batches_with_the_front_end_cpu_last_measured() -> None:
    """Live (run BC3, textcls at 95% load, one core): a break at 32 / 0 ms was sent back to 16 (`_outpaced`) on paces
    read without front-end CPU, the epoch holding no CPU reading, and 16 could not keep up (the row's p99 361 ms). The
    front-end's share of each item narrows the gap between the two limits' paces: such an epoch takes the last one
    measured, and the gap here stays within SLOWER."""
    per_item_ms = {16: 0.6, 32: 0.76}  # 1,667 and 1,316 items/s by the batches alone: 1.27 x
    measured, unread = ah3_break(32, lag_ratio=1.0, frontend_cpu_s=0.2e-3), ah3_break(32, lag_ratio=1.0)
    unread = replace(unread, frontend_cpu_s=None)
    assert not read_workload(unread).closed
    tuner = run_ah3(Autotuner(spec(50), TuningParams(32, 0.0), cores=1), per_item_ms)
    assert tuner._outpaced(32, measured) is None  # 1,250 and 1,042 items/s with 0.2 ms an item: 1.2 x
    assert tuner._outpaced(32, unread) is None
    never = run_ah3(Autotuner(spec(50), TuningParams(32, 0.0), cores=1), per_item_ms)
    assert never._outpaced(32, unread) == 16  # (no reading yet: the batches alone)


def aj_closed() -> Measurement:
    """Run AJ's epoch at 32 / 2 ms (resnet-mini, 64 clients, all in the server, arriving as the answers leave: a
    closed loop)."""
    return Measurement(
        params=TuningParams(32, 0.002), duration_s=1.0, completed=500, items_per_s=500.0, arrival_rate=540.0,
        company_share=1.0, mean_s=0.115, mean_se=0.002, mean_wait_s=0.058, p99_s=0.136, utilization=0.91,
        largest_batch=32, mean_batch=32.0, full_share=1.0, peak_in_server=64, low_in_server=33,
        frontend_cpu_s=0.18e-3, lag_ratio=0.12,
    )  # fmt: skip


def test_a_closed_loops_larger_limit_is_not_outpaced_by_a_gap_within_the_hosts_drift() -> None:
    """Live (run AV, resnet-mini at 64 closed-loop clients on one core), 32's batches read 3% slower an item than 16's
    and 64's 6.5% slower, each paced at a different time, and both limits went back to 16; timed alone and interleaved,
    its items cost 13% and 18% less CPU in batches of 32 and 64 than in batches of 16. A gap within PACE_DRIFT (8%) is
    the host's, however steady the batches; past it the smaller limit outpaces."""
    closed = replace(ah3_break(64, lag_ratio=0.3), full_share=1.0)
    assert read_workload(closed).closed

    def outpaced(ms_64: float) -> int | None:
        tuner = run_ah3(Autotuner(spec(50), TuningParams(64, 0.010), cores=1), {16: 0.60, 64: ms_64})
        return tuner._outpaced(64, closed)

    assert outpaced(0.64) is None  # 64's items 6.7% dearer (4.2% with the front-end's CPU each: the pace)
    assert outpaced(0.72) == 16  # 20% dearer (12.4% the pace)


def test_a_closed_loop_trial_served_faster_within_the_slo_is_kept_short_of_the_trial_margin() -> None:
    """Live (textcls, 64 closed-loop clients on one core): 16 / 2 -> 64 / 10 ms served 1,818 items/s against 1,651 at
    p99 48.1 ms, within the SLO (50) but not TRIAL_MARGIN of it, and was given back; 16 / 2 ms then broke the SLO every
    10 s for 40 s. In a closed loop more items/s shorten every round trip (Little's law): kept. Not within the count's
    noise, not over the SLO, and not in an open loop, whose tail is its queue's."""
    here, wide = TuningParams(16, 0.002), TuningParams(64, 0.010)
    inc = closed_reading(here, rate=1651.0, mean_s=0.037, p99_s=0.0399, utilization=0.85, peak_in_server=64)
    inc = replace(inc, low_in_server=49)
    assert read_workload(inc).closed and read_workload(inc).clients == 64

    def kept(rate: float, p99_s: float, open_loop: bool = False) -> bool:
        tuner = Autotuner(spec(50), here, cores=1)
        before = replace(inc, lag_ratio=1.0, low_in_server=5) if open_loop else inc
        batch = 20.0 if open_loop else 64.0  # (an open loop's batches leave short of the limit)
        t = replace(before, params=wide, items_per_s=rate, arrival_rate=rate, p99_s=p99_s, mean_batch=batch)
        assert read_workload(t).closed is not open_loop
        return tuner._confirms(t, before)

    assert kept(1818.0, 0.0481)
    assert not kept(1660.0, 0.0481)  # (within the count's noise)
    assert not kept(1818.0, 0.051)
    assert not kept(1818.0, 0.0481, open_loop=True)


def test_a_limit_outpaced_by_a_quarter_of_it_may_still_double_into_the_size_between() -> None:
    """Live (resnet-mini, 64 closed-loop clients on one core): 64 / 10 ms was outpaced by 16's batches and went back to
    16, whose breaks then asked to double to 32, refused as a reversal of the backoff, for the rest of the run. The
    slow size itself stays refused; an unmeasured size between is the next backoff's, and with 32 measured slower too,
    no doubling is left."""
    closed = ah3_break(16, lag_ratio=0.3, refused_rate=0.0, in_server=64, peak_in_server=64, low_in_server=49)
    closed = replace(closed, items_per_s=1437.0, arrival_rate=1437.0, full_share=1.0, mean_batch=16.0)
    assert read_workload(closed).closed and read_workload(closed).clients == 64

    def after_back_to_16(per_item_ms: dict[int, float]) -> Autotuner:
        tuner = run_ah3(Autotuner(spec(50), TuningParams(64, 0.010), cores=1), per_item_ms)
        back = tuner._on_violation(replace(ah3_break(64, lag_ratio=0.3), full_share=1.0), now=12.0)
        assert back is not None and back.params == TuningParams(16, 0.010) and back.detail["knob"] == "outpaced"
        return tuner

    assert after_back_to_16({16: 0.68, 64: 0.90})._backoff(closed) == TuningParams(32, 0.010)
    assert after_back_to_16({16: 0.68, 32: 0.90, 64: 0.90})._backoff(closed) is None


def test_a_limit_just_put_in_force_in_a_closed_loop_is_not_outpaced_on_its_first_batches() -> None:
    """Live, run AJ (resnet-mini, a closed loop of 64 on one core): a break doubled 16 -> 32, and 32's first 8
    batches read 491 items/s against 16's 648; the limit went back to 16 and stayed. In a closed loop, batches within
    PACE_SETTLE_S of a limit's start are no measure of its pace; those after it are. An open loop's are."""

    def at_32(first_ms: float, later_ms: float = 0.0) -> Autotuner:
        tuner = run_ah3(Autotuner(spec(50), TuningParams(32, 0.002), cores=1), {16: 1.4}, at=3.0)
        tuner._limits_put[32] = 10.0
        for i in range(20):  # (within the settling time)
            tuner.record_batch(32, 32 * first_ms * 1e-3, 10.0 + 0.05 * i, cpu_s=32 * first_ms * 1e-3)
        for i in range(20 if later_ms else 0):
            tuner.record_batch(32, 32 * later_ms * 1e-3, 12.5 + 0.05 * i, cpu_s=32 * later_ms * 1e-3)
        return tuner

    closed = aj_closed()
    poisson = ah3_break(32, lag_ratio=1.0)  # (arrivals that ignore the answers: an open loop)
    assert read_workload(closed).closed and not read_workload(poisson).closed
    assert at_32(2.0)._outpaced(32, closed) is None  # 2.0 ms an item, but only on its first second's batches
    assert at_32(2.0, 1.4)._outpaced(32, closed) is None
    assert at_32(1.4, 2.0)._outpaced(32, closed) == 16  # slower once settled: outpaced
    assert at_32(2.0)._outpaced(32, poisson) == 16  # an open loop's queue grows meanwhile: judged at once


def test_a_limit_faster_when_it_started_is_not_outpaced_when_the_host_slows_later() -> None:
    """Live, run AK (textcls, a closed loop of 32 on one core): 32 / 10 ms was kept at 1,437 items/s over 16's 1,152;
    14 s later one slow second (the process at 92% of the core, every batch a third slower) read 863, and the limit
    went back to 16 for the rest of the row. A limit is judged on the better of its latest batches and its first
    settled ones (measured beside the smaller limit's); one slower from its start is still sent back, and a limit put
    in force again is measured afresh."""

    def at_32(settled_ms: float, later_ms: float) -> Autotuner:
        tuner = run_ah3(Autotuner(spec(50), TuningParams(32, 0.01), cores=1), {16: 0.9}, at=3.0)
        tuner._limits_put[32] = 10.0
        for start, ms in ((12.5, settled_ms), (24.0, later_ms)):
            for i in range(20):
                tuner.record_batch(32, 32 * ms * 1e-3, start + 0.05 * i, cpu_s=32 * ms * 1e-3)
        return tuner

    closed = replace(aj_closed(), params=TuningParams(32, 0.01), p99_s=0.052)
    assert at_32(0.7, 1.2)._outpaced(32, closed) is None  # 0.7 ms an item beside 16's 0.9: the host slowed since
    assert at_32(1.2, 1.2)._outpaced(32, closed) == 16  # slower from its start: outpaced
    slowed = at_32(0.7, 1.2)
    decision = slowed._on_violation(closed, now=25.0)
    assert decision is None or decision.detail.get("knob") != "outpaced"

    again = at_32(0.7, 1.2)
    assert again._move(TuningParams(16, 0.01), "test", 25.0, {}) is not None
    assert again._move(TuningParams(32, 0.01), "test", 26.0, {}) is not None  # 32 again: its first pace forgotten
    assert again._outpaced(32, closed) == 16


def test_a_queue_that_refuses_arrivals_does_not_keep_pace() -> None:
    """Live, run AH3: a queue at its limit admitted 759 req/s against 575 served and refused 337 more; read by its
    admissions alone it kept pace, so the infeasible hold left every break alone for 20 s. Refusals count as arrivals,
    and a queue that refuses grows whatever its count reads."""
    tuner = Autotuner(spec(50), TuningParams(64, 0.0), cores=1)
    tuner._feasible = False
    capped = ah3_break(64, arrival_rate=600.0)
    assert tuner._growing(capped) and tuner._queue_grows(capped)
    assert not tuner._growing(replace(capped, refused_rate=0.0))
    tuner._on_violation(capped, now=10.0)
    assert tuner.unanswered_break is None or tuner.unanswered_break[0] != "infeasible: a lost cause that keeps pace"
    tuner._on_violation(replace(capped, refused_rate=0.0, backlog_growth=None), now=10.0)
    assert tuner.unanswered_break == (
        "infeasible: a lost cause that keeps pace",
        replace(capped, refused_rate=0.0, backlog_growth=None),
    )

    epoch = Epoch(TuningParams(64, 0.0), start=0.0, settled_at=1.0, slo_s=0.05)
    epoch.add_refusal(3, 0.5)  # before it settled: not counted
    epoch.add_refusal(4, 1.5)
    assert epoch.measure(3.0).refused_rate == pytest.approx(2.0)


def test_an_slo_break_left_as_it_is_says_why() -> None:
    """A break the tuner leaves as it is makes no decision, so no decision's line shows it: live (run AH), 8-23 s of
    silence while an overloaded open loop's queue grew to 1,000 requests. The tuner says why (here its served rate
    reads above the arrivals', a draining backlog); the next step clears it."""
    here = TuningParams(16, 0.002)
    tuner = Autotuner(spec(50), here)
    m = Measurement(
        params=here, duration_s=1.5, completed=1800, items_per_s=1200.0, arrival_rate=1015.0, company_share=1.0,
        mean_s=0.2, mean_se=0.01, mean_wait_s=0.18, p99_s=0.9, utilization=0.9, largest_batch=16, mean_batch=16.0,
        full_share=1.0, peak_in_server=1038, in_server=1038,
    )  # fmt: skip
    assert tuner._on_violation(m, now=10.0) is None
    assert tuner.unanswered_break == ("a backlog draining", m)
    tuner.step(20.0)
    assert tuner.unanswered_break is None


def test_an_open_loop_break_that_the_window_absorbs_is_not_acted_on() -> None:
    """Two stalls 2.8 s apart (one batch takes 60 ms): each breaks its 1.5-s epoch, while the p99 over the last 10 s
    stays within the SLO. Such breaks are measured again, not backed off (live, runs N1 / N2: 16 / 2 ms broke epochs
    every 3-8 s while the setting held 27-48 ms over 20 s; before this rule the second break in a row here went to 32 /
    2 ms). Stalls the window does not absorb are still acted on: measured again, and kept at the limit, whose batches
    keep pace short of it (before that rule, the second break doubled it to 32)."""
    model = LinearLatency(a_s=1.0e-3, b_s=2.0e-3)

    def stalled(rate: float, stall_s: float) -> tuple[BatcherSim, list[Decision]]:
        sim, _ = tuned(model, Poisson(rate), 30.0, initial=TuningParams(16, 0.002), seed=3)
        n = len(sim.decisions)
        for t in (30.0, 32.8):  # (the second after the first break's re-measurement has settled)
            sim.run_until(t)
            sim.latency = LinearLatency(a_s=1.0e-3, b_s=stall_s)
            sim.run_until(t + 0.02)  # the one batch that starts here
            sim.latency = model
        sim.run_until(40.0)
        return sim, [d for _, d in sim.decisions[n:]]

    sim, after = stalled(400, 0.060)
    assert sim.stats(30.0, 31.0).p99_s > 0.050 >= sim.stats(26.0, 36.0).p99_s
    assert after == []
    sim, after = stalled(700, 0.080)
    assert sim.stats(26.0, 36.0).p99_s > 0.050
    assert any(d.reason == "slo-violation" and d.detail.get("knob") == "kept" for d in after)
    assert sim.params == TuningParams(16, 0.002)


def test_an_open_loop_held_as_infeasible_keeps_the_largest_limit_it_broke_the_slo_at() -> None:
    """Three settings in a row broke the SLO: the open loop is held at one of them. Near capacity a short epoch's p99
    is the queue's state more than the setting's, and a small limit caps the bursts: live, the soak at 85% load held
    4 / 10 ms (read 70 ms, against 89 ms at 16 / 0) and its next break read 0.63 s. The largest limit is held."""
    here = TuningParams(4, 0.008)
    tuner = Autotuner(spec(50), here)
    tuner._breaks = {TuningParams(4, 0.010): 0.070, TuningParams(16, 0.0): 0.089}
    m, _ = soak_break({}, params=here, items_per_s=343.2, arrival_rate=331.4, p99_s=0.073, peak_in_server=12)
    held = tuner._futile(m, now=10.0)
    assert held is not None and (held.reason, held.params) == ("infeasible", TuningParams(16, 0.0))


def closed_reading(
    params: TuningParams, *, rate: float, mean_s: float, p99_s: float, utilization: float, peak_in_server: int
) -> Measurement:
    """A 2-s epoch of a saturated closed loop: full batches of the limit, items answered as they arrive."""
    n = params.max_batch_size
    return Measurement(
        params=params, duration_s=2.0, completed=int(2 * rate), items_per_s=rate, arrival_rate=rate,
        company_share=1.0, mean_s=mean_s, mean_se=0.001, mean_wait_s=mean_s / 2, p99_s=p99_s,
        utilization=utilization, largest_batch=n, mean_batch=float(n), full_share=1.0,
        peak_in_server=peak_in_server, lag_ratio=0.3,
    )  # fmt: skip


def short_reading(
    params: TuningParams, *, rate: float, mean_s: float, p99_s: float, clients: int, mean_batch: float, largest: int
) -> Measurement:
    """A saturated closed loop of `clients` whose batches (`mean_batch` on average) do not fill the limit."""
    m = closed_reading(params, rate=rate, mean_s=mean_s, p99_s=p99_s, utilization=1.0, peak_in_server=clients)
    m = replace(m, mean_batch=mean_batch, largest_batch=largest, full_share=0.0)
    assert read_workload(m).closed and read_workload(m).clients == clients
    return m


def test_a_population_that_comes_back_first_tries_the_setting_its_search_settled_on() -> None:
    """Run AP1 (resnet-mini, 2 -> 32 -> 2 clients): at 2 clients the search settled at 2 / 8 ms, 620 items/s. Back at
    2 clients (a merge probe to 32 / 10 ms kept as the load fell under it: 125 items/s), the plan's 2 / 2 ms served 508
    and held for the rest of the step. The remembered setting is tried first (a trial, judged as any other), not where
    it served no more than the incumbent does now, nor after it lost in this search, nor for another population; a
    search that settled over the SLO leaves nothing to remember."""
    settled, back = TuningParams(2, 0.008), TuningParams(32, 0.010)
    two = closed_reading(settled, rate=620.0, mean_s=0.003, p99_s=0.0035, utilization=0.6, peak_in_server=2)
    assert read_workload(two).closed and read_workload(two).clients == 2

    def returned(settled_reading: Measurement) -> tuple[Autotuner, Measurement]:
        tuner = Autotuner(spec(50), settled, cores=1)
        tuner._settle(settled_reading, 1.0)
        tuner._move(back, "probe:merge", 20.0, {})  # 32 clients' merge probe, as the load falls to 2
        at_two = short_reading(back, rate=125.0, mean_s=0.016, p99_s=0.017, clients=2, mean_batch=2.0, largest=2)
        tuner._judged_elsewhere(at_two, replace(two, params=back), 22.0)
        return tuner, at_two

    tuner, at_two = returned(two)
    move = tuner._next(24.0)
    assert move is not None and move.params == settled and move.detail["knob"] == "remembered"
    assert tuner._recall(replace(at_two, items_per_s=610.0), read_workload(at_two)) is None  # 620 is no gain on 610
    four = short_reading(back, rate=250.0, mean_s=0.016, p99_s=0.017, clients=4, mean_batch=4.0, largest=4)
    assert tuner._recall(four, read_workload(four)) is None
    tuner._rejected.add(settled)
    assert tuner._recall(at_two, read_workload(at_two)) is None
    over, at_two = returned(replace(two, p99_s=0.060))
    assert over._recall(at_two, read_workload(at_two)) is None


def test_a_closed_loop_whose_population_falls_is_measured_again_within_the_epoch() -> None:
    """Live (textcls, 2 -> 32 -> 2 clients): back at 2 clients under 32 / 8 ms, batches of 2 waited out the delay,
    150-200 req/s for 2.5 s until the epoch that spanned the step ended, where 2 / 8 ms served 700. The fall is read
    within the epoch (the latest batches' arrivals, in the server and in rate) and a short epoch measures the new
    population, so the remembered setting is back within a second, and with nothing remembered the plan is; a trial in
    force at the fall stays without a verdict. Steady loads never read as fallen."""
    slow = LinearLatency(a_s=0.4e-3, b_s=1.6e-3, noise=0.1)

    def run(first: int, seed: int, trying: bool = False) -> tuple[BatcherSim, float]:
        tuner = Autotuner(spec(50, minQueueDelayMicroseconds=8000), COLD, cores=1)
        sim = BatcherSim(slow, ClosedLoop(first, think_s=0.0008), COLD, seed=seed, tuner=tuner)
        if first == 2:
            sim.run_until(30.0)
            sim.load = ClosedLoop(32, think_s=0.0008)
        sim.run_until(59.6)
        if trying:  # a merge probe begun just before the fall (live, run AQ2)
            to = replace(tuner.params, max_queue_delay_s=0.010 if tuner.params.max_queue_delay_s < 0.010 else 0.009)
            assert tuner._move(to, "probe:merge", 59.6, {}) is not None
            sim.params = tuner.params
        sim.run_until(60.0)
        assert sim.params.max_batch_size >= 16 and sim.params.max_queue_delay_s >= 0.008  # waits for 32 clients
        sim.load = ClosedLoop(2, think_s=0.0008)
        sim.run_until(64.0)
        return sim, sim.stats(20.0, 30.0).throughput_rps if first == 2 else 0.0

    for seed, trying in ((1, False), (2, False), (3, True)):
        sim, before = run(2, seed, trying)
        fell = [t for t, d in sim.decisions if d.reason == "load-fell"]
        back = [t for t, d in sim.decisions if t > 60.0 and d.detail.get("knob") == "remembered"]
        assert fell and 60.0 < fell[0] <= 60.5 and back and back[0] <= 61.0, sim.decisions[-4:]
        assert sim.stats(61.0, 64.0).throughput_rps >= 0.95 * before
        sim, _ = run(32, seed)
        assert next(t for t, d in sim.decisions if t > 60.0 and d.changed) <= 61.5  # nothing remembered: a plan
        assert sim.params.max_batch_size <= 4
    for load in (ClosedLoop(2, 0.001), ClosedLoop(32, 0.001), ClosedLoop(64, 0.001), Poisson(300), Poisson(1800)):
        steady, _ = tuned(CPU, load, 40.0)
        assert not [d for _, d in steady.decisions if d.reason == "load-fell"], load


def test_a_wider_limit_on_one_core_waits_a_batch_cycle_so_the_clients_groups_merge() -> None:
    """16 clients filling batches of 8 come back in two groups a batch's cycle apart (8 items at 1,181 items/s: 6.8
    ms). On one core the wider limit's probe takes the ladder's first delay of at least that cycle: live, 16 / 4.5 ms
    kept the groups apart (batches of 8.35) where 16 / 8 ms merged them (16.0, 1,374 items/s). Not where the batches
    did not fill the old limit (no groups of it), nor with several cores (not live-measured there)."""
    here = TuningParams(8, 0.0045)
    reading = closed_reading(here, rate=1181.0, mean_s=0.010, p99_s=0.0165, utilization=1.0, peak_in_server=16)
    assert read_workload(reading).closed and read_workload(reading).clients == 16

    def wider(m: Measurement, cores: int = 1) -> TuningParams | None:
        tuner = Autotuner(spec(50), m.params, cores=cores)
        for i, n in enumerate((1, 2, 4, 8) * 12):
            tuner.record_batch(n, 0.8e-3 * n, 1.0 + i * 0.02)
        tuner._inc_meas = m
        move = tuner._next(2.0)
        assert move is not None and move.detail.get("knob") == "wider", move
        return move.params

    assert wider(reading) == TuningParams(16, 0.008)
    assert wider(reading, cores=0) == TuningParams(16, 0.0045)
    assert wider(replace(reading, mean_batch=6.0)) == TuningParams(16, 0.0045)
    assert wider(replace(reading, params=TuningParams(8, 0.010))) == TuningParams(16, 0.010)  # long enough already


def test_no_wider_limit_for_groups_that_cannot_merge_within_the_delay_bound() -> None:
    """64 clients in two groups of 32 (textcls live: 32 / 2 ms, 1,779 items/s, an 18-ms cycle, 15 ms less the
    front-ends' 32 x 0.096 ms): while one group's batch runs the other fills the next one alone, and the group in the
    core comes back after a longer wait than the 10-ms bound allows. The wider probe to 64 / 10 ms kept batches of 32.0
    and broke the SLO; it is no longer taken, in a search or at a break, nor is the limit doubled by a backoff (live,
    resnet-mini: 32 / 10 -> 64 / 10 ms at a break, batches of 32.0), even where the population reads high (live: 73
    for 64 clients that reconnected, and the backoff doubled 32 / 0 -> 64 / 10 ms). Still taken where the queue holds
    more than a batch (64 clients in groups of 16), where the cycle less the front-ends' time fits within the bound
    (live, resnet-mini's 32 clients in groups of 16: a 13-ms cycle, 9 ms less the front-ends', merged under 32 / 10
    ms), and with several cores."""
    here = TuningParams(32, 0.002)
    reading = closed_reading(here, rate=1779.0, mean_s=0.034, p99_s=0.039, utilization=0.84, peak_in_server=64)
    reading = replace(reading, frontend_cpu_s=0.096e-3, low_in_server=33)
    assert read_workload(reading).closed and read_workload(reading).clients == 64

    def wider(m: Measurement, cores: int = 1) -> TuningParams | None:
        tuner = Autotuner(spec(50), m.params, cores=cores)
        for i, n in enumerate((4, 8, 16, m.params.max_batch_size) * 12):
            tuner.record_batch(n, 0.45e-3 * n + 0.5e-3, 1.0 + i * 0.02)
        tuner._inc_meas = m
        return tuner._wider(m, read_workload(m), 2.0)

    assert wider(reading) is None
    assert wider(replace(reading, low_in_server=None)) is None  # (the population read instead: 64, two batches)
    assert wider(replace(reading, peak_in_server=73)) is None  # live: 73 read for 64 clients that reconnected
    assert wider(reading, cores=0) == TuningParams(64, 0.002)
    sixteen = TuningParams(16, 0.002)
    fours = closed_reading(sixteen, rate=1100.0, mean_s=0.05, p99_s=0.045, utilization=1.0, peak_in_server=64)
    assert wider(replace(fours, low_in_server=49)) == TuningParams(64, 0.010)  # 48 behind a batch of 16 fill more
    assert wider(fours) == TuningParams(64, 0.010)
    pairs = closed_reading(
        TuningParams(16, 0.008), rate=1231.0, mean_s=0.02, p99_s=0.028, utilization=1.0, peak_in_server=32
    )
    assert wider(replace(pairs, frontend_cpu_s=0.248e-3)) == TuningParams(32, 0.010)  # back 9 ms after 13: they merge
    assert wider(pairs) is None  # (the same 13-ms cycle with the front-ends unmeasured: taken as the wait)

    def backed_off(m: Measurement) -> TuningParams | None:
        tuner = Autotuner(spec(50), m.params, cores=1)
        return tuner._backoff(replace(m, p99_s=0.052))

    assert backed_off(reading) is None
    assert backed_off(fours) == TuningParams(32, 0.002)


def test_a_limit_narrowed_to_the_clients_on_one_core_waits_a_batch_cycle_so_they_stay_one_batch() -> None:
    """8 clients under 16 / 2 ms form batches of all 8 (8 items at 861 items/s: a 9.3-ms cycle), each waiting out the
    delay for no one more. The size probe narrows the limit to them, and on one core takes the ladder's first delay of
    at least that cycle: live, 8 / 2 ms split them into batches of 4 (685 items/s) where 8 / 5 ms served 1,002-1,070.
    Not with several cores, nor where the batches did not hold every client."""
    here = TuningParams(16, 0.002)
    reading = short_reading(here, rate=861.0, mean_s=0.0093, p99_s=0.0136, clients=8, mean_batch=8.0, largest=8)

    def probed(m: Measurement, cores: int = 1) -> TuningParams:
        tuner = Autotuner(spec(50), m.params, cores=cores)
        for i in range(48):
            tuner.record_batch(8, 7e-3, 1.0 + i * 0.01)
        tuner._inc_meas = m
        move = tuner._next(2.0)
        assert move is not None and move.reason == "probe" and move.detail.get("knob") == "size", move
        return move.params

    assert probed(reading) == TuningParams(8, 0.010)
    assert probed(reading, cores=0) == TuningParams(8, 0.002)
    split = replace(reading, mean_batch=5.0, largest_batch=8)  # groups already apart: the delay stays
    assert probed(split) == TuningParams(8, 0.002)


def test_a_closed_loop_on_one_core_declared_infeasible_keeps_the_delay_that_gathers_its_clients() -> None:
    """64 clients cannot meet 50 ms at 1,214 items/s (Little's law: 53 ms a round trip). Declared infeasible, a closed
    loop on one core whose batches leave short of its clients keeps its delay: live, twice, 64 / 10 ms -> 64 / 0 ms
    served 21-22% fewer items/s at a longer tail (p99 52 -> 80 ms). So does one whose batches fill the limit with
    clients left over (no batch waits out its delay; live, 32 / 10 -> 32 / 0 ms at 64 clients: 1,108 -> 971 items/s,
    p99 63 -> 81 ms). A loop whose batches hold every client short of the limit still drops a delay that waits for
    no one, as does one with several cores (the simulator's, below)."""
    here = TuningParams(64, 0.010)
    reading = short_reading(here, rate=1214.0, mean_s=0.050, p99_s=0.052, clients=64, mean_batch=32.0, largest=40)

    def declared(m: Measurement, cores: int = 1) -> Decision:
        tuner = Autotuner(spec(50), m.params, cores=cores)
        tuner._settled = True
        return tuner._declare_infeasible(m, now=10.0)

    held = declared(reading)
    assert held.reason == "infeasible" and held.params == here and not held.changed
    assert declared(reading, cores=0).params == TuningParams(64, 0.0)
    groups = replace(reading, params=TuningParams(32, 0.010), mean_batch=32.0, largest_batch=32, full_share=1.0)
    assert not declared(groups).changed
    few = replace(reading, mean_batch=8.0, largest_batch=8, peak_in_server=8, items_per_s=600.0, arrival_rate=600.0)
    assert read_workload(few).clients == 8
    assert declared(few).params == TuningParams(64, 0.0)


class Knee(LinearLatency):
    """Dearer per item in small batches than in large ones (a CNN on a CPU core shared with its front-ends:
    resnet-mini read 1.36 ms per item over batches of 1-8 items and about 0.75 beyond)."""

    def mean(self, n: int) -> float:
        return super().mean(n) if n <= 8 else super().mean(8) + 0.55 * self.a_s * (n - 8)


def test_sizes_beyond_those_fitted_are_measured_once_before_being_ruled_out() -> None:
    """A fit over batches of 1-8 items through the origin (1.5 ms per item, no fixed cost) promises nothing from
    larger batches, so no plan tries them: live, 32 clients after a load step stayed at 8-item batches, 76% of the
    best static setting's items/s, as the line fitted over 1-8 items priced 64 at 89 ms. Sizes the clients could
    fill, beyond twice the largest fitted, are measured once (a trial, given back if it loses; after an SLO break,
    judged against the break's figures), not again within the fit's memory, and not for an open loop."""
    here = TuningParams(8, 0.004)
    reading = closed_reading(here, rate=660.0, mean_s=0.045, p99_s=0.048, utilization=0.99, peak_in_server=32)
    assert read_workload(reading).closed and read_workload(reading).clients == 32

    def fitted(tuner: Autotuner, at: float) -> Autotuner:
        for i, n in enumerate((1, 2, 8) * 12):
            tuner.record_batch(n, 1.5e-3 * n, at - 1.0 + i * 0.02)
        return tuner

    def next_move(m: Measurement, tuner: Autotuner | None = None, at: float = 2.0) -> tuple[Autotuner, Decision | None]:
        tuner = fitted(tuner or Autotuner(spec(50), here), at)
        tuner._inc_meas = m
        return tuner, tuner._next(at)

    tuner, wider = next_move(reading)
    assert wider is not None and (wider.reason, wider.detail["knob"]) == ("probe", "wider")
    assert wider.params == TuningParams(32, 0.004)
    tuner._params = here  # given back (it lost): not measured again while its batches are in the fit
    assert next_move(reading, tuner, at=10.0)[1] is None
    _, again = next_move(reading, tuner, at=40.0)
    assert again is not None and again.params == TuningParams(32, 0.004)
    assert next_move(replace(reading, lag_ratio=1.0, peak_in_server=40))[1] is None  # open loop: no
    # Nor when the limit was in force lately for another reason, its batches short of it (32 clients at 32 / 2 ms
    # formed batches of 16 live, so the largest size fitted stayed 16).
    probed = Autotuner(spec(50), here)
    probed._move(TuningParams(32, 0.004), "probe:size", 1.0, {})
    probed._move(here, "revert", 1.5, {})
    assert next_move(reading, probed)[1] is None
    # An SLO break is answered the same way, before any re-plan (whose pick the same line would keep small).
    broken = fitted(Autotuner(spec(50), here), 2.0)
    wide = broken._on_violation(replace(reading, p99_s=0.080), now=3.0)
    assert wide is not None and (wide.reason, wide.detail["knob"]) == ("slo-violation", "wider")
    assert broken.params == wide.params == TuningParams(32, 0.004) and broken._incumbent == here


def test_a_wider_limit_tried_at_a_break_is_given_back_if_its_tail_is_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    """At an SLO break the wider limit is a trial judged against the break's figures: both missing the SLO, the lower
    p99 stays. Live (run AE), textcls at 64 clients broke 16 / 2 ms at p99 63 ms (1,044 items/s, batches of 16), and
    64 / 10 ms, made the incumbent, formed batches of 32 at p99 100 ms (737 items/s) and was held as infeasible, where
    the oracle's 32 / 5 ms read p99 68-85 ms. Given back, its size is not tried again at the next break (the re-plan
    answers it); a trial within the SLO, or with the lower tail, is kept."""
    here, wide = TuningParams(16, 0.002), TuningParams(64, 0.010)
    broke = closed_reading(here, rate=1044.0, mean_s=0.058, p99_s=0.063, utilization=0.82, peak_in_server=64)
    broke = replace(broke, low_in_server=49, frontend_cpu_s=0.167e-3)
    assert read_workload(broke).closed and read_workload(broke).clients == 64
    lost = replace(broke, params=wide, items_per_s=737.0, arrival_rate=737.0, p99_s=0.100, mean_batch=32.0)

    def judged(trial: Measurement) -> tuple[Autotuner, Decision | None]:
        tuner = Autotuner(spec(50), here, cores=1)
        for i, n in enumerate((4, 8, 16) * 12):
            tuner.record_batch(n, 0.84e-3 * n, 1.0 + i * 0.02)
        move = tuner._on_violation(broke, now=3.0)
        assert move is not None and (move.reason, move.detail["knob"], move.params) == ("slo-violation", "wider", wide)
        assert tuner.params == wide and tuner._incumbent == here  # a trial
        assert tuner._epoch is not None
        monkeypatch.setattr(tuner._epoch, "measure", lambda now, in_server=None: trial)
        monkeypatch.setattr(tuner, "_epoch_done", lambda epoch, now: True)
        return tuner, tuner.step(5.0)

    tuner, back = judged(lost)
    assert back is not None and (back.reason, back.params) == ("revert", here)
    assert tuner._wider(broke, read_workload(broke), 6.0) is None  # not again at the next break
    for kept in (replace(lost, p99_s=0.045), replace(lost, p99_s=0.055, items_per_s=1100.0)):
        tuner, verdict = judged(kept)
        assert tuner._incumbent == wide and verdict is not None, verdict
        assert verdict.detail["incumbent_p99_ms"] == 63.0  # the line shows what it was judged against


def test_a_kept_trial_is_one_log_line_beside_the_figures_it_was_judged_against(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that holds up becomes the incumbent with a line of its own (`trial-kept`, knob `confirmed`, no change),
    or, when a move follows at once, that move's line carries the old incumbent's figures. Live (run AF), textcls at
    32 clients: a probe from 16 / 2 to 32 / 10 ms was kept and then declared infeasible on its next epoch, and the log
    showed only the probe and the verdict at the probe's setting."""
    here, probe = TuningParams(16, 0.002), TuningParams(32, 0.010)
    inc = closed_reading(here, rate=935.0, mean_s=0.0317, p99_s=0.0388, utilization=0.81, peak_in_server=32)
    inc = replace(inc, low_in_server=17, frontend_cpu_s=0.211e-3)
    trial = replace(inc, params=probe, items_per_s=950.0, arrival_rate=950.0, p99_s=0.0420, largest_batch=16)
    tuner = Autotuner(spec(50), here, cores=1)
    for i in range(40):
        tuner.record_batch(16, 0.89e-3 * 16, 1.0 + i * 0.02)
    tuner._inc_meas = inc
    assert tuner._move(probe, "probe:size", 2.0, {}) is not None
    assert tuner._epoch is not None
    monkeypatch.setattr(tuner._epoch, "measure", lambda now, in_server=None: trial)
    monkeypatch.setattr(tuner, "_epoch_done", lambda epoch, now: True)
    line = tuner.step(5.0)
    assert line is not None and (line.reason, line.detail["knob"], line.changed) == ("trial-kept", "confirmed", False)
    assert line.params == tuner.params == probe and tuner._incumbent == probe
    assert (line.detail["p99_ms"], line.detail["incumbent_p99_ms"]) == (42.0, 38.8)
    assert (line.detail["items_per_s"], line.detail["incumbent_items_per_s"]) == (950.0, 935.0)


def test_a_load_step_onto_a_knee_reaches_the_best_static_setting() -> None:
    """2 clients, then 32, on a model dearer per item in small batches: measuring wider sizes costs nothing
    lasting (at least 0.95x the best static setting within the SLO after the step)."""
    knee = Knee(a_s=1.36e-3, b_s=1.73e-3, noise=0.1)
    tuner = Autotuner(spec(50), COLD)
    sim = BatcherSim(knee, ClosedLoop(2, think_s=0.0015), COLD, seed=3, tuner=tuner)
    sim.run_until(30.0)
    sim.load = ClosedLoop(32, think_s=0.0015)
    sim.run_until(70.0)
    best_x, _ = oracle(knee, ClosedLoop(32, think_s=0.0015))
    after = sim.stats(45.0, 70.0)
    assert after.throughput_rps >= 0.95 * best_x and after.p99_s <= 0.050


def test_a_closed_loop_on_one_core_never_probes_below_the_batches_it_forms() -> None:
    """32 closed-loop clients on one core form batches of 16 under 32 / 4 ms, the only size fitted. The size probe went
    down to 8 / 4 ms and broke the SLO at once (live: p99 64 ms at 523 items/s, against 785 at 48 ms). On one core a
    closed loop tries the next longer delay instead (fuller batches); with several cores the probe may still go down."""
    here = TuningParams(32, 0.004)
    reading = replace(
        closed_reading(here, rate=785.0, mean_s=0.037, p99_s=0.048, utilization=0.85, peak_in_server=32),
        largest_batch=16, mean_batch=16.0, full_share=0.0,
    )  # fmt: skip
    assert read_workload(reading).closed

    def next_move(cores: int) -> Decision | None:
        tuner = Autotuner(spec(50), here, cores=cores)
        for i in range(40):
            tuner.record_batch(16, 0.018, 1.0 + i * 0.02)
        tuner._inc_meas = reading
        return tuner._next(2.0)

    one_core = next_move(1)
    assert one_core is not None and one_core.params == TuningParams(32, 0.008)
    several = next_move(0)
    assert several is not None and several.params == TuningParams(8, 0.004)


def test_a_closed_loop_whose_batches_hold_every_client_gets_a_limit_they_fill() -> None:
    """Live (one core, 2 clients, the demo's 16 / 2 ms): every batch held both clients and waited out the delay for no
    one more, 208 req/s where 2 / 5 ms served 371; its batches all of one size, no plan (which needs a fit over
    several) ever moved it, and a probe below the batches is not taken on one core. The probe takes the limit to the
    batches instead: they leave as they fill."""
    load = ClosedLoop(2, think_s=0.0)
    tuner = Autotuner(spec(50), TuningParams(16, 0.002), cores=1)
    sim = BatcherSim(CPU, load, tuner.params, seed=1, tuner=tuner)
    sim.run_until(20.0)
    assert tuner.params.max_batch_size == 2
    best = max(t for t, p99 in sweep(CPU, load).values() if p99 <= 0.050)
    assert sim.stats(10.0, 20.0).throughput_rps >= 0.95 * best


def test_a_closed_loop_whose_batches_hold_every_client_is_probed_at_their_size_with_the_alone_fit() -> None:
    """As above, with d(n) timed alone at load (as the server has it): a single size's fit is then a line, not a
    one-size guess, and the probe was never taken; the plan, whose pick must promise GAIN more than its own prediction
    for the incumbent, found nothing. Live (run AX, resnet-mini, 8 clients under 16 / 2 ms, each batch holding all 8
    and waiting out the delay): 823 req/s for a whole level, the plan predicting 942 for its best, where 8 / 2 ms
    served 1,087-1,124. The probe to the batches' size comes first, fit or no fit."""
    here = TuningParams(16, 0.002)
    line = LatencyFit(0.514e-3, 1.97e-3)
    tuner = Autotuner(spec(50), here, cores=1, alone=AloneFits(line, line))
    for i in range(40):
        tuner.record_batch(8, line(8), 1.0 + i * 0.01, cpu_s=line(8))
    assert tuner._memory.fit() is not None and not tuner._memory.fit().one_size
    held = short_reading(here, rate=823.0, mean_s=0.0097, p99_s=0.015, clients=8, mean_batch=8.0, largest=8)
    tuner._inc_meas = held
    probe = tuner._next(2.0)
    assert probe is not None and probe.reason == "probe" and probe.params.max_batch_size == 8


def test_a_size_probe_is_not_repeated_while_its_limit_brought_no_other_size() -> None:
    """32 clients formed batches of 16 under a limit of 16 and of 32 alike (half of them in the front-end while a
    batch runs), so the fit stays one-size and the probe up to 32 came back after every reopen: 8 changes in 17 s
    at one level, live. A limit in force within the fit's memory is not probed again."""
    here = TuningParams(16, 0.002)
    reading = closed_reading(here, rate=880.0, mean_s=0.034, p99_s=0.045, utilization=0.86, peak_in_server=32)
    tuner = Autotuner(spec(50), here)
    for i in range(40):
        tuner.record_batch(16, 0.016, 1.0 + i * 0.02)
    tuner._inc_meas = reading
    probe = tuner._next(2.0)
    assert probe is not None and (probe.reason, probe.params) == ("probe", TuningParams(32, 0.002))
    tuner._move(here, "revert", 4.0, {})  # its batches were 16 again
    tuner._reopen()  # (an SLO break, a re-plan)
    tuner._inc_meas = reading
    again = tuner._next(6.0)
    assert again is None or again.params.max_batch_size != 32


def test_a_closed_loop_backs_off_to_fuller_batches_never_to_emptier_ones() -> None:
    """32 closed-loop clients break the SLO with no plan to answer it (the fixed backoff). Their round trip is
    clients / items per second, so only fuller batches shorten it: full batches of 16 on a 60%-busy executor
    double the limit, and batches leaving short of it take the next longer delay. The old backoff dropped the
    delay, then halved the size (live, textcls at 32 clients: 16 / 2 ms -> 16 / 0 -> 8 / 0, from 1,130 items/s to
    580-810, each further break answered by a further drop)."""
    here = TuningParams(16, 0.002)
    full = closed_reading(here, rate=820.0, mean_s=0.030, p99_s=0.058, utilization=0.6, peak_in_server=32)
    assert read_workload(full).closed
    assert Autotuner(spec(50), here)._backoff(full) == TuningParams(32, 0.002)
    nodelay = TuningParams(16, 0.0)
    short = replace(full, params=nodelay, mean_batch=11.0, full_share=0.2)
    assert Autotuner(spec(50), nodelay)._backoff(short) == TuningParams(16, 0.0005)
    # With the front-ends' CPU per item measured, the delay goes at once to the ladder's first that brings the items
    # missing (16 - 11 items x 0.3 ms: 2 ms), not one step per break (live, 0 -> 0.5 -> 1 -> 2 -> 4 ms, 7 s apart).
    measured = replace(short, frontend_cpu_s=0.3e-3)
    assert Autotuner(spec(50), nodelay)._backoff(measured) == TuningParams(16, 0.002)
    wide = replace(measured, params=TuningParams(32, 0.0))  # 32 clients in batches of 11: 21 items x 0.3 ms, 8 ms
    assert Autotuner(spec(50), wide.params)._backoff(wide) == TuningParams(32, 0.008)
    dearer = replace(wide, frontend_cpu_s=0.6e-3)  # 12.6 ms: the ladder's top
    assert Autotuner(spec(50), wide.params)._backoff(dearer) == TuningParams(32, 0.010)


def test_full_batches_with_a_queue_behind_them_are_never_halved_however_idle_the_executor_reads() -> None:
    """A slowed host (the process had 0.61 of its core) made 32 closed-loop clients read as an open loop: their
    arrivals waited in the front-ends and no longer followed the answers. The executor read 55% busy, so the
    open-loop backoff halved full batches of 16 (16 / 0 -> 8 / 0 ms, p99 60 -> 102 ms, live). Full batches while more
    waited at once than one holds double instead; without such a queue, on an idle core, a break of full batches still
    halves."""
    here = TuningParams(16, 0.0)
    reading = replace(
        closed_reading(here, rate=612.0, mean_s=0.038, p99_s=0.060, utilization=0.55, peak_in_server=32),
        lag_ratio=0.91,
    )
    assert not read_workload(reading).closed
    assert Autotuner(spec(50), here)._backoff(reading) == TuningParams(32, 0.0)
    no_queue = replace(reading, peak_in_server=16, items_per_s=200.0, arrival_rate=200.0, utilization=0.4)
    assert not read_workload(no_queue).closed
    assert Autotuner(spec(50), here)._backoff(no_queue) == TuningParams(8, 0.0)


def test_a_closed_loop_whose_batches_leave_short_of_its_clients_tries_a_longer_delay_before_settling() -> None:
    """32 closed-loop clients on one core under 32 / 2 ms form batches of 16, and the plan finds nothing better (live,
    its turn-taking model does not see the clients come back over the front-ends' time; 32 / 5 ms served 30% more
    at a lower p99). Before settling, the next longer delay is tried; batches that hold the clients settle at once."""
    here, here_4ms = TuningParams(32, 0.002), TuningParams(32, 0.004)
    reading = closed_reading(here, rate=815.0, mean_s=0.039, p99_s=0.044, utilization=0.85, peak_in_server=32)
    short = replace(reading, mean_batch=16.0, full_share=0.0)
    _, probe = answer_nothing_better(short, violation=False)
    assert probe is not None and (probe.reason, probe.detail["knob"], probe.params) == ("probe", "delay", here_4ms)
    tuner, settled = answer_nothing_better(replace(short, mean_batch=31.0), violation=False)
    assert settled is None and tuner.params == here


def test_a_longer_delay_for_fewer_clients_than_the_limit_narrows_the_limit_to_them() -> None:
    """8 closed-loop clients under 16 / 4 ms on one core form batches of 4.8 (two groups). Under the next longer delay
    and a limit of 16, the merged batch of 8 waits out the whole delay for items no one sends (live, textcls: 16 / 8
    ms served 378 items/s, given back; 8 / 9 ms, found by a plan 9 s later, served 835). The probe narrows the limit
    to the clients; with as many clients as the limit it keeps the limit, and so does the backoff at a break."""
    here = TuningParams(16, 0.004)
    reading = short_reading(here, rate=700.0, mean_s=0.011, p99_s=0.020, clients=8, mean_batch=4.8, largest=8)
    _, probe = answer_nothing_better(reading, violation=False)
    assert probe is not None and (probe.reason, probe.detail["knob"]) == ("probe", "delay")
    assert probe.params.max_batch_size == 8 and probe.params.max_queue_delay_s > here.max_queue_delay_s
    _, fuller = answer_nothing_better(replace(reading, p99_s=0.060), violation=True)
    assert fuller is not None and fuller.reason == "slo-violation" and fuller.params.max_batch_size == 8
    as_many = short_reading(here, rate=900.0, mean_s=0.017, p99_s=0.030, clients=16, mean_batch=8.0, largest=12)
    _, probe = answer_nothing_better(as_many, violation=False)
    assert probe is not None and probe.detail["knob"] == "delay" and probe.params.max_batch_size == 16


def answer_nothing_better(m: Measurement, *, violation: bool) -> tuple[Autotuner, Decision | None]:
    """A one-core tuner at `m`'s setting given a closed-loop plan (32 clients) predicting only that setting."""
    here = m.params
    preds = (CandidatePrediction(here, m.items_per_s, 0.044, m.mean_s, 16.0, m.utilization, True),)
    fit = LatencyFit(1.0e-3, 2.0e-3)
    job = PlanJob("closed", fit, (here,), 0.045, 0.0, 2000, clients=32, think_s=0.0)
    tuner = Autotuner(spec(50), here, cores=1)
    out = Outstanding(job, fit, read_workload(m), m, here, violation=violation)
    return tuner, tuner._after_plan(out, Solved(Plan(preds[0], True, 0.045, preds), 0.0), now=10.0)


def test_a_break_of_batches_short_of_a_closed_loops_clients_is_answered_at_once_not_kept() -> None:
    """A first SLO break the plan cannot better is kept and measured again (a passing stall), but not when a closed
    loop on one core forms batches short of its clients: live, textcls at 32 clients kept 32 / 2 ms with batches of
    16 through three breaks (one epoch within the SLO between each resets the strike) and held its SLO in 25% of the
    seconds. It backs off to the next longer delay at once; with full batches the break is still kept."""
    here, here_4ms = TuningParams(32, 0.002), TuningParams(32, 0.004)
    reading = closed_reading(here, rate=955.0, mean_s=0.028, p99_s=0.056, utilization=0.78, peak_in_server=32)
    short = replace(reading, mean_batch=16.0, full_share=0.0)
    _, fuller = answer_nothing_better(short, violation=True)
    assert fuller is not None and (fuller.reason, fuller.params) == ("slo-violation", here_4ms)
    _, kept = answer_nothing_better(replace(short, mean_batch=31.0, full_share=0.9), violation=True)
    assert kept is not None and (kept.detail.get("knob"), kept.changed) == ("kept", False)


def test_a_kept_break_is_forgiven_only_by_an_epoch_within_the_slo_with_margin() -> None:
    """Run AU (resnet-mini, 64 closed-loop clients on one core): 16 / 2 ms with full batches broke the SLO at p99
    50.4-52.5 ms and, the plan predicting nothing better, was kept three times over 14 s, an epoch just within the SLO
    between each resetting the strike; the backoff's doubled limit then served 12% more. An epoch under the SLO by less
    than TRIAL_MARGIN leaves the strike: the next break backs off to a limit of 32 (the clients wait behind full
    batches). An epoch with margin forgives it: the next break is kept again."""
    here = TuningParams(16, 0.002)
    broke = closed_reading(here, rate=1437.0, mean_s=0.044, p99_s=0.0525, utilization=0.86, peak_in_server=64)
    broke = replace(broke, low_in_server=49)
    assert read_workload(broke).clients == 64
    preds = (CandidatePrediction(here, 1437.0, 0.044, 0.044, 16.0, 0.86, True),)
    fit = LatencyFit(0.59e-3, 1.34e-3)
    job = PlanJob("closed", fit, (here,), 0.045, 0.0, 2000, clients=64, think_s=0.0)

    def second_break(between_p99_s: float) -> Decision | None:
        tuner = Autotuner(spec(50), here, cores=1)
        solved = Solved(Plan(preds[0], True, 0.045, preds), 0.0)
        out = Outstanding(job, fit, read_workload(broke), broke, here, violation=True)
        first = tuner._after_plan(out, solved, 10.0)
        assert first is not None and (first.detail.get("knob"), first.changed) == ("kept", False)
        tuner._met_slo(replace(broke, p99_s=between_p99_s))
        return tuner._after_plan(out, solved, 14.0)

    backed_off = second_break(0.048)  # within the SLO (50 ms), not within 0.9 x it
    assert backed_off is not None
    assert (backed_off.reason, backed_off.params) == ("slo-violation", TuningParams(32, 0.002))
    kept = second_break(0.040)
    assert kept is not None and (kept.detail.get("knob"), kept.changed) == ("kept", False)


def test_a_closed_loop_on_one_core_is_never_planned_below_the_batches_it_forms() -> None:
    """32 closed-loop clients on one core fill batches of 32 under 32 / 8 ms and break the SLO (56 ms). The one-core
    plan, blind to the front-ends' queue, predicts 1 / 0 ms at the same items/s with a p99 of 1.6 ms; live that pick
    served 165 items/s at p99 217 ms. It is not taken (nothing else promises better: the setting is kept and measured
    again); with several cores, where the plan simulates no front-end turns, the same answer is taken."""
    here, single = TuningParams(32, 0.008), TuningParams(1, 0.0)
    reading = closed_reading(here, rate=766.0, mean_s=0.036, p99_s=0.056, utilization=0.84, peak_in_server=32)
    preds = (
        CandidatePrediction(here, 766.0, 0.056, 0.036, 32.0, 0.84, True),
        CandidatePrediction(single, 779.0, 0.0016, 0.001, 1.0, 0.9, True),
    )
    fit = LatencyFit(0.9e-3, 2.3e-3)
    job = PlanJob("closed", fit, (here, single), 0.045, 0.0, 2000, clients=32, think_s=0.0)

    def answer(cores: int) -> Decision | None:
        tuner = Autotuner(spec(50), here, cores=cores)
        out = Outstanding(job, fit, read_workload(reading), reading, here, violation=True)
        return tuner._after_plan(out, Solved(Plan(preds[1], True, 0.045, preds), 0.0), now=10.0)

    kept = answer(cores=1)
    assert kept is not None and (kept.reason, kept.detail.get("knob"), kept.changed) == ("slo-violation", "kept", False)
    taken = answer(cores=0)
    assert taken is not None and taken.reason == "slo-violation" and taken.params == single


def test_a_closed_loop_whose_batches_hold_every_client_keeps_a_delay_that_merges_them_again() -> None:
    """16 clients on one core fill batches of 16 under 16 / 7.5 ms (textcls live: 1,385 items/s, 0.14 ms of front-end
    CPU per item). A plan predicting 8% more at 16 / 3 ms is not taken there: should the batch split in two, its halves
    come back 4.7 ms apart (half a cycle, 5.8 ms, less 8 x 0.14 ms), and 3 ms keeps them apart (live: batches of 8.03,
    1,062 items/s, for 6.4 s). 16 / 6 ms is taken, as 16 / 3 ms is with several cores, with batches short of the
    clients, under another limit, or for 8 clients (their batches wait out the delay under a limit of 16)."""
    here = TuningParams(16, 0.0075)
    reading = closed_reading(here, rate=1385.0, mean_s=0.0115, p99_s=0.013, utilization=0.9, peak_in_server=16)
    reading = replace(reading, frontend_cpu_s=0.14e-3)
    fit = LatencyFit(0.45e-3, 0.6e-3)

    def answer(to: TuningParams, m: Measurement = reading, cores: int = 1) -> Decision | None:
        preds = (
            CandidatePrediction(here, 1385.0, 0.013, 0.0115, 16.0, 0.9, True),
            CandidatePrediction(to, 1500.0, 0.011, 0.0107, 16.0, 0.9, True),
        )
        job = PlanJob("closed", fit, (here, to), 0.045, 0.0, 2000, clients=16, think_s=0.0)
        tuner = Autotuner(spec(50), here, cores=cores)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=False)
        return tuner._after_plan(out, Solved(Plan(preds[1], True, 0.045, preds), 0.0), now=10.0)

    short = TuningParams(16, 0.003)
    kept = answer(short)
    assert kept is None or kept.params == here, kept
    for taken in (answer(TuningParams(16, 0.006)), answer(short, cores=0), answer(TuningParams(32, 0.003))):
        assert taken is not None and taken.reason == "plan", taken
    split = replace(reading, mean_batch=10.0, full_share=0.0)  # already apart: the short delay's own trial decides
    assert (moved := answer(short, split)) is not None and moved.params == short
    eight = replace(reading, mean_batch=8.0, largest_batch=8, full_share=0.0, peak_in_server=8)  # 16 / 7.5 ms waits
    eight = replace(eight, items_per_s=900.0, arrival_rate=900.0)
    assert (moved := answer(short, eight)) is not None and moved.params == short


def test_a_closed_loops_plan_must_promise_more_than_the_incumbent_serves_as_measured() -> None:
    """16 closed-loop clients on one core serve 1,747 items/s at 16 / 10 ms (textcls live) where the plan predicts
    1,560. Its pick of 32 / 2 ms, predicted 5% over the incumbent's prediction but at 1,641 items/s, under the
    measured pace, is not tried (live, every such trial was given back: 32 / 2 ms served 1,461). A pick predicted
    over the measured pace is; an open loop's pick is judged against the prediction alone."""
    here, wide = TuningParams(16, 0.010), TuningParams(32, 0.002)
    reading = closed_reading(here, rate=1747.0, mean_s=0.009, p99_s=0.0097, utilization=0.8, peak_in_server=16)
    fit = LatencyFit(0.36e-3, 2.4e-3)

    def answer(predicted: float, m: Measurement = reading) -> Decision | None:
        preds = (
            CandidatePrediction(here, 1560.0, 0.011, 0.009, 16.0, 0.8, True),
            CandidatePrediction(wide, predicted, 0.011, 0.009, 16.0, 0.8, True),
        )
        job = PlanJob("closed", fit, (here, wide), 0.045, 0.0, 2000, clients=16, think_s=0.0)
        tuner = Autotuner(spec(50), here, cores=0)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=False)
        return tuner._after_plan(out, Solved(Plan(preds[1], True, 0.045, preds), 0.0), now=10.0)

    assert read_workload(reading).closed
    kept = answer(1641.0)
    assert kept is None or kept.params == here, kept
    taken = answer(1800.0)
    assert taken is not None and (taken.reason, taken.params) == ("plan", wide), taken
    open_loop = replace(reading, company_share=0.3, peak_in_server=3, lag_ratio=1.0)
    assert not read_workload(open_loop).closed
    moved = answer(1641.0, open_loop)
    assert moved is not None and moved.params == wide, moved


def test_a_closed_loops_predicted_tail_is_never_below_its_round_trip_in_the_server() -> None:
    """Little's law: 64 closed-loop clients served 1,400 items/s spend 46 ms per round trip in the server (no think
    time), so no setting serving them at that pace has a p99 under it. A plan predicting 2.3 ms for 8 / 0 ms (live, a
    one-core plan blind to the front-ends' queue) does not pass for one that meets the SLO; at 2,800 items/s it does."""
    here, small = TuningParams(32, 0.002), TuningParams(8, 0.0)
    reading = closed_reading(here, rate=1400.0, mean_s=0.046, p99_s=0.056, utilization=0.9, peak_in_server=64)
    fit = LatencyFit(0.5e-3, 1.0e-3)
    job = PlanJob("closed", fit, (here, small), 0.045, 0.0, 2000, clients=64, think_s=0.0)

    def answer(small_items_per_s: float) -> Decision | None:
        preds = (
            CandidatePrediction(here, 1400.0, 0.056, 0.046, 32.0, 0.9, True),
            CandidatePrediction(small, small_items_per_s, 0.0023, 0.002, 8.0, 0.9, True),
        )
        tuner = Autotuner(spec(50), here)
        out = Outstanding(job, fit, read_workload(reading), reading, here, violation=True)
        return tuner._after_plan(out, Solved(Plan(preds[1], True, 0.045, preds), 0.0), now=10.0)

    same_pace = answer(1400.0)
    assert same_pace is not None and same_pace.params != small
    faster = answer(2800.0)
    assert faster is not None and faster.params == small


def test_the_epoch_after_a_move_measures_the_new_setting() -> None:
    """An epoch counts full batches against its limit, and the rules read the limit from its measurement: after a
    move from 16 to 32 items, batches of 16 are not full ones (the epoch once started under the setting left behind,
    so every rule read the old limit for the first epoch of each new one)."""
    tuner = Autotuner(spec(50), TuningParams(16, 0.0))
    moved = tuner._move(TuningParams(32, 0.0), "probe:size", 1.0, {})
    assert moved is not None and moved.params == TuningParams(32, 0.0)
    for i in range(20):
        tuner.record_arrival(16, 1.5 + i * 0.05)
        tuner.record_batch(16, 0.01, 1.51 + i * 0.05)
    m = tuner._epoch.measure(2.5)  # type: ignore[union-attr]
    assert m.params == TuningParams(32, 0.0) and m.full_share == 0.0 and m.mean_batch == 16.0


def test_a_plan_that_found_nothing_better_is_not_asked_again_for_the_same_closed_loop() -> None:
    """On one core a plan's CPU is taken from the requests served: live, textcls at 64 clients asked nine plans in 26 s
    that all kept 32 / 10 ms, and the same setting served 1,300-1,520 req/s autotuned against 1,623-1,766 static.
    Once a plan kept the setting for a closed loop, its next SLO break (and the search) ask none for that loop while
    the fit's memory lasts; another population, or a later time, is planned again."""
    here = TuningParams(32, 0.010)
    reading = closed_reading(here, rate=1779.0, mean_s=0.034, p99_s=0.055, utilization=0.84, peak_in_server=64)
    reading = replace(reading, frontend_cpu_s=0.096e-3, low_in_server=33)
    assert read_workload(reading).clients == 64

    def asks_a_plan(m: Measurement, at: float, kept_at: float | None = 10.0) -> bool:
        tuner = Autotuner(spec(50), here, cores=1, inline_plans=False)
        for i, n in enumerate((8, 16, 32) * 12):
            tuner.record_batch(n, 0.45e-3 * n + 0.5e-3, at - 1.0 + i * 0.02)
        if kept_at is not None:
            preds = (CandidatePrediction(here, 1779.0, 0.044, 0.034, 32.0, 0.84, True),)
            job = PlanJob("closed", LatencyFit(0.45e-3, 0.5e-3), (here,), 0.045, 0.0, 2000, clients=64, think_s=0.0)
            out = Outstanding(job, job.fit, read_workload(reading), reading, here, violation=True)
            kept = tuner._after_plan(out, Solved(Plan(preds[0], True, 0.045, preds), 0.0), now=kept_at)
            assert kept is not None and kept.detail["knob"] == "kept" and not kept.changed
        tuner._on_violation(m, at)
        return tuner.plan_job is not None

    assert asks_a_plan(reading, 12.0, kept_at=None)
    assert not asks_a_plan(reading, 12.0)
    assert not asks_a_plan(replace(reading, peak_in_server=62), 12.0)  # (the same clients, read a little lower)
    assert asks_a_plan(replace(reading, peak_in_server=48, low_in_server=17), 12.0)
    assert asks_a_plan(reading, 41.0)


def test_a_break_waits_for_the_search_plan_being_solved_for_the_same_setting() -> None:
    """The worker solves one plan at a time: a break's plan asked while a search's plan for the same setting is being
    solved waits for it and then costs the core as much again (live, textcls at 64 clients: a break's plan 0.26 s
    after the search's, answered 2.4-3.5 s later, both keeping the setting). The search's answer comes first; a
    severe break does not wait. A population read once at 80 (clients that reconnect) does not make the 64-client
    loop's kept plan forgotten."""
    here = TuningParams(16, 0.008)
    reading = closed_reading(here, rate=1540.0, mean_s=0.034, p99_s=0.055, utilization=0.84, peak_in_server=64)
    reading = replace(reading, frontend_cpu_s=0.096e-3, low_in_server=49)
    fit = LatencyFit(0.45e-3, 0.5e-3)

    def searching() -> tuple[Autotuner, PlanJob]:
        tuner = Autotuner(spec(50), here, cores=1, inline_plans=False)
        for i, n in enumerate((4, 8, 16) * 12):
            tuner.record_batch(n, fit(n), 11.0 + i * 0.02)
        tuner._request_plan(fit, read_workload(reading), reading, 12.0, violation=False)
        job = tuner.plan_job
        assert job is not None
        return tuner, job

    tuner, job = searching()
    tuner._on_violation(reading, 12.3)
    assert tuner.plan_job is job
    tuner, job = searching()
    severe = tuner._on_violation(replace(reading, p99_s=0.150), 12.3)
    assert severe is not None and severe.changed  # (here the wider limit: 48 behind a batch of 16 can merge)

    tuner, job = searching()
    kept = (CandidatePrediction(here, 1540.0, 0.044, 0.034, 16.0, 0.84, True),)
    for clients, at in ((64, 10.0), (80, 11.0)):
        m = replace(reading, peak_in_server=clients)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=False)
        tuner._after_plan(out, Solved(Plan(kept[0], True, 0.045, kept), 0.0), now=at)
    assert tuner._plan_fruitless(read_workload(reading), 12.5)


def test_clients_that_outgrow_the_probed_size_get_the_wider_limit_measured() -> None:
    """The search's one probe went from 16 / 2 to 8 / 8 ms while 8 clients filled every batch; the load rose to 16
    clients during its epoch, so the probe was judged (and kept) at 16, and every batch since held 8: a one-size fit,
    no plan, nothing left to probe, settled at 8 / 8 ms (live: 1,410-1,630 req/s where 16 / 8 ms served 1,720-1,880,
    side by side). Clients that could fill twice the batches fitted get the wider limit measured once, as with a
    fit over several sizes."""
    here = TuningParams(8, 0.008)
    reading = closed_reading(here, rate=1560.0, mean_s=0.010, p99_s=0.012, utilization=1.0, peak_in_server=16)
    reading = replace(reading, frontend_cpu_s=0.14e-3, low_in_server=8)
    assert read_workload(reading).closed and read_workload(reading).clients == 16
    tuner = Autotuner(spec(50), here)
    for i in range(40):
        tuner.record_batch(8, 0.005, 1.0 + i * 0.02)
    tuner._probed = True  # (spent on the move to 8 / 8 ms)
    tuner._inc_meas = reading
    move = tuner._next(2.0)
    assert move is not None and move.detail.get("knob") == "wider", move
    assert move.params == TuningParams(16, 0.008)


def test_a_settled_closed_loop_whose_batches_split_tries_a_delay_that_merges_them() -> None:
    """16 clients settled at 16 / 2 ms in full batches of 16; one late request split them into groups of 9 and 7,
    and 2 ms (shorter than the groups' distance) kept them apart at the same clients and setting: 16% fewer items/s,
    settled, live. The tuner tries the incumbent with the ladder's first delay of at least a batch's cycle (8 items at
    1,570 items/s: 5.1 ms -> 8 ms), once: not where the batches were already short when it settled, nor after that
    delay was given back."""
    here = TuningParams(16, 0.002)
    full = closed_reading(here, rate=1870.0, mean_s=0.009, p99_s=0.010, utilization=1.0, peak_in_server=16)
    split = short_reading(here, rate=1570.0, mean_s=0.010, p99_s=0.011, clients=16, mean_batch=8.0, largest=9)

    def remerge(settled_on: Measurement) -> TuningParams | None:
        tuner = Autotuner(spec(50), here, cores=1)
        tuner._settle(settled_on, 1.0)
        return tuner._remerge(split, read_workload(split))

    assert remerge(full) == TuningParams(16, 0.008)
    assert remerge(split) is None  # short when it settled: the search's own rules had their say
    fewer = closed_reading(here, rate=1870.0, mean_s=0.009, p99_s=0.010, utilization=1.0, peak_in_server=12)
    assert remerge(replace(fewer, mean_batch=12.0)) is None  # another population: not a split
    one = closed_reading(
        TuningParams(16, 0.0), rate=250.0, mean_s=0.004, p99_s=0.005, utilization=0.5, peak_in_server=1
    )
    pair = short_reading(
        TuningParams(16, 0.0), rate=250.0, mean_s=0.004, p99_s=0.005, clients=2, mean_batch=1.0, largest=1
    )
    alone = Autotuner(spec(50), TuningParams(16, 0.0), cores=1)
    alone._settle(replace(one, mean_batch=1.0, largest_batch=1), 1.0)
    assert alone._remerge(pair, read_workload(pair)) is None  # (live: 1 client read as 2 for an epoch)
    tuner = Autotuner(spec(50), here, cores=1)
    tuner._settle(full, 1.0)
    tuner._rejected.add(TuningParams(16, 0.008))
    assert tuner._remerge(split, read_workload(split)) is None
    several = Autotuner(spec(50), here, cores=2)  # (one core only: with several the plan simulates the returns)
    several._settle(full, 1.0)
    assert several._remerge(split, read_workload(split)) is None


def test_a_trial_judged_while_the_load_moved_stays_without_a_verdict() -> None:
    """A trial's epoch saw another population than the incumbent's (8 clients became 16 during a probe to 8 / 8 ms):
    comparing them says nothing about either setting, so neither is given back nor rejected; the trial stays in force,
    the search starts over at the new load (its size probe free again). At the same load a losing trial is still given
    back, and one client read as two is the same load."""
    here, trial = TuningParams(16, 0.002), TuningParams(8, 0.008)
    inc = closed_reading(here, rate=1700.0, mean_s=0.005, p99_s=0.008, utilization=1.0, peak_in_server=8)
    inc = replace(inc, mean_batch=8.0, largest_batch=8, full_share=0.0)

    risen = closed_reading(trial, rate=1450.0, mean_s=0.011, p99_s=0.014, utilization=1.0, peak_in_server=16)
    assert read_workload(risen).clients == 16
    tuner = Autotuner(spec(50), here, cores=1)
    tuner._inc_meas, tuner._probed = inc, True
    tuner._rejected.add(TuningParams(32, 0.002))
    tuner._params = trial
    decision = tuner._judged_elsewhere(risen, inc, 2.0) if tuner._load_changed(risen, inc) else None
    assert decision is not None and decision.reason == "trial-kept" and not decision.changed
    assert decision.detail["knob"] == "load-moved" and decision.detail["incumbent_clients"] == 8
    assert tuner.params == trial and tuner._incumbent == trial and tuner._inc_meas is risen
    assert not tuner._rejected and not tuner._probed and tuner._planned is None  # a new search from the trial

    # A plan made for the closed loop whose trial then met an open one is given back, unjudged (run BE's second soak: a
    # warm-up's 8 clients, then Poisson arrivals at 405.6/s, under the warm-up's 8 / 7 ms for the whole soak).
    arrivals = Measurement(
        params=trial, duration_s=1.5, completed=590, items_per_s=393.9, arrival_rate=395.8, company_share=0.9,
        mean_s=0.02, mean_se=0.001, mean_wait_s=0.008, p99_s=0.033, utilization=0.75, largest_batch=8, mean_batch=3.3,
        full_share=0.05, peak_in_server=15, low_in_server=0, lag_ratio=1.1,
    )  # fmt: skip
    assert not read_workload(arrivals).closed
    planned = Autotuner(spec(50), here, cores=1)
    planned._inc_meas, planned._params, planned._planned = inc, trial, trial
    assert planned._load_changed(arrivals, inc)
    back = planned._judged_elsewhere(arrivals, inc, 2.0)
    assert back.params == here and back.reason == "revert" and back.changed and back.detail["knob"] == "load-moved"
    assert planned.params == here and planned._incumbent == here and planned._inc_meas is None
    assert not planned._rejected and planned._planned is None
    probed = Autotuner(spec(50), here, cores=1)  # (a probe, no plan: kept as before)
    probed._inc_meas, probed._params = inc, trial
    assert probed._judged_elsewhere(arrivals, inc, 2.0).reason == "trial-kept" and probed.params == trial

    same = closed_reading(trial, rate=1400.0, mean_s=0.006, p99_s=0.009, utilization=1.0, peak_in_server=8)
    assert not Autotuner._load_changed(replace(same, mean_batch=8.0), inc)  # fewer items/s at 8 clients: a loss
    one = closed_reading(here, rate=250.0, mean_s=0.004, p99_s=0.005, utilization=0.5, peak_in_server=1)
    two = replace(one, peak_in_server=2)
    assert not Autotuner._load_changed(two, one)  # (live: 1 client read as 2 for an epoch)
    fallen = closed_reading(trial, rate=120.0, mean_s=0.008, p99_s=0.012, utilization=0.3, peak_in_server=1)
    assert Autotuner._load_changed(fallen, inc)


def test_a_trial_after_an_epoch_that_spanned_a_fall_in_clients_is_not_judged_against_it() -> None:
    """Run AN's textcls, 32 clients down to 2: the incumbent's epoch (32 / 8 ms) spanned the step, its peak 32 in the
    server and its arrivals read as open; the plan's 8 / 1 ms then served 429 items/s at 2 clients against that
    epoch's 499 and was given back (its next epoch at 32 / 8 ms: 162). Two clients in a closed loop never put 32 in
    the server, so the load moved. Not where the open reading's peak is the closed loop's own population (a closed
    loop near capacity can read as open)."""
    inc = Measurement(
        params=TuningParams(32, 0.008), duration_s=1.5, completed=748, items_per_s=498.94, arrival_rate=479.04,
        company_share=0.9, mean_s=0.0131, mean_se=0.001, mean_wait_s=0.002, p99_s=0.0214, utilization=0.315,
        largest_batch=32, mean_batch=6.21, full_share=0.1, peak_in_server=32, low_in_server=1, lag_ratio=0.23,
    )  # fmt: skip
    trial = Measurement(
        params=TuningParams(8, 0.001), duration_s=1.5, completed=643, items_per_s=429.05, arrival_rate=428.46,
        company_share=0.5, mean_s=0.0043, mean_se=0.0002, mean_wait_s=0.0015, p99_s=0.0123, utilization=0.59,
        largest_batch=2, mean_batch=1.76, full_share=0.0, peak_in_server=2, low_in_server=1, lag_ratio=0.32,
    )  # fmt: skip
    assert not read_workload(inc).closed and read_workload(trial).closed and read_workload(trial).clients == 2
    tuner = Autotuner(spec(50), inc.params, cores=1)
    assert not tuner._confirms(trial, inc)  # judged against the spanning epoch it would be given back
    assert Autotuner._load_changed(trial, inc) and Autotuner._load_changed(inc, trial)
    near = replace(inc, peak_in_server=2, lag_ratio=1.2)  # open by its reading, no more in it than the 2 clients
    assert not read_workload(near).closed
    assert not Autotuner._load_changed(trial, near)
    full = closed_reading(TuningParams(32, 0.008), rate=1150.0, mean_s=0.027, p99_s=0.033, utilization=1.0,
                          peak_in_server=32)  # fmt: skip
    as_open = replace(full, lag_ratio=1.0, low_in_server=1, mean_batch=16.0, largest_batch=32)
    assert not read_workload(as_open).closed and read_workload(as_open).clients == 32
    assert not Autotuner._load_changed(as_open, full)  # 32 clients read as open: the same population


def test_a_trial_the_load_steps_under_is_not_given_back_on_the_simulator() -> None:
    """The same in the closed loop: 32 clients, a trial begins, the population drops to 4 before its epoch ends. The
    trial's end brings no revert (its figures at 4 clients against the incumbent's at 32 would read as a loss): the fall
    is read within the epoch (`load-fell`, before the epoch's end would judge it as `trial-kept`, knob `load-moved`),
    and the trial is kept."""
    tuner = Autotuner(spec(50), COLD)
    sim = BatcherSim(CPU, ClosedLoop(32, think_s=0.001), COLD, seed=1, tuner=tuner)
    while not tuner.trying(sim.now):
        assert sim.now < 30.0, "no trial in 30 s"
        sim.run_until(sim.now + 0.05)
    trial, started = tuner.params, len(sim.decisions)
    sim.load = ClosedLoop(4, think_s=0.001)
    while len(sim.decisions) == started:
        assert sim.now < 60.0, "the trial never ended"
        sim.run_until(sim.now + 0.05)
    ended = sim.decisions[started][1]
    assert ended.reason == "load-fell", ended
    assert not ended.changed and ended.params == trial and tuner._incumbent == trial


def test_a_closed_loop_over_a_knee_goes_back_to_the_limit_whose_batches_serve_more() -> None:
    """Items past the 16th of a batch 30% dearer (resnet-mini on one core: 32's batches 7-9% slower than 16's, live): at
    64 clients no setting meets the SLO, so the lowest p99 is sought, and in a closed loop that is the faster batches'.
    The breaks' doublings past 16 read slower batches, within SLOWER, and go back."""
    knee = KneeLatency(a_s=0.75e-3, b_s=1.2e-3, noise=0.05, knee=16, past_a_s=0.975e-3)
    load = ClosedLoop(64, think_s=0.001)
    sim, tuner = tuned(knee, load, 40.0)
    best_p99 = min(p99 for _, p99 in sweep(knee, load).values())
    assert not tuner.feasible
    assert sim.stats(20.0, 40.0).p99_s <= 1.05 * best_p99
    assert any(d.detail.get("knob") == "outpaced" for _, d in sim.decisions)


def test_a_wider_trial_whose_full_batches_run_slower_is_given_back_within_the_counts_noise() -> None:
    """The figures of a live probe (resnet-mini, 32 clients on one core): 16 / 10 -> 32 / 10 ms served 1,122 items/s
    against 1,192, within the epochs' count noise (7%), and was kept. Had its full batches run 8% slower an item than
    those of 16, their medians tell it apart and the trial goes back; a trial as fast is kept."""
    here, wide = TuningParams(16, 0.010), TuningParams(32, 0.010)

    def judged(wide_ms: float) -> bool:
        tuner = Autotuner(spec(50), here, cores=1)
        for i in range(32):
            tuner.record_batch(16, 16 * 0.77e-3 * (1 + 0.03 * (-1) ** i), 5.0 + 0.013 * i)
        for i in range(32):
            tuner.record_batch(32, 32 * wide_ms * 1e-3 * (1 + 0.03 * (-1) ** i), 8.0 + 0.027 * i)
        inc = Measurement(
            params=here, duration_s=1.5, completed=1788, items_per_s=1192.3, arrival_rate=1202.9, company_share=1.0,
            mean_s=0.0168, mean_se=0.0004, mean_wait_s=0.0059, p99_s=0.0274, utilization=0.755, largest_batch=16,
            mean_batch=16.0, full_share=1.0, peak_in_server=32, frontend_cpu_s=0.259e-3, lag_ratio=0.61,
        )  # fmt: skip
        trial = replace(
            inc, params=wide, completed=1683, items_per_s=1121.9, arrival_rate=1121.9, mean_s=0.0239, p99_s=0.0315,
            largest_batch=32, mean_batch=32.0, lag_ratio=0.32,
        )  # fmt: skip
        assert read_workload(trial).closed
        return tuner._confirms(trial, inc)

    assert not judged(0.84)
    assert judged(0.78)
