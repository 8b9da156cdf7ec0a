"""The batch planner's predictions against simulated truth (the deterministic batcher simulator).

Prediction error measured here (Poisson loads on CPU-like and GPU-like d(n), the 7 x 5 grid of sizes
1-64 x delays 0-10 ms, the simulator's truth over a run of >= 3 s and >= 6,000 arrivals):
- throughput: within 2% of the simulator's everywhere (asserted: 5%); over capacity the planner's
  figure is the full-batch capacity n / d(n);
- p99, where the simulated p99 meets the SLO: within 7% at executor load (rate / capacity of the
  setting) up to 0.75 (123 settings; asserted: 25%), within 49% between 0.75 and 1 (30 settings;
  asserted: 60%), where both the planner's sample and the simulator's truth are noisy (a queue near
  saturation forgets its state slowly, so a few long busy periods set the tail);
- the pick: its simulated throughput within 5% of the best static setting's, with its simulated p99
  within the SLO; or, when no setting meets the SLO, its simulated p99 within 10% of the lowest (1%
  when the SLO is below one batch's time; 7% over capacity, where settings of the largest size differ
  only by the simulator's service noise) and its throughput within 5% of the most;
- infeasible is reported exactly when no static setting meets the SLO in the simulator.

Closed loop (`predict_closed`: a population of clients with exponential think times), against the
simulator over 8 s after 2 s, 8 cases of 1-64 clients on the three models, the same 35 settings:
throughput within 4.2% (95% of settings within 1.4%; asserted: 6%), p99 within 9% (median 0.8%, 95%
within 3.7%; asserted: 12%).
"""

from __future__ import annotations

import statistics
import time
from functools import cache

import pytest

from batchpilot.runtime.autotune_model import LatencyFit, TuningParams
from batchpilot.runtime.batch_planner import (
    Plan,
    candidate_grid,
    pick_closed,
    plan,
    plan_closed,
    predict_candidate,
    predict_closed,
)
from batchpilot.testing.queue_sim import BatcherSim, ClosedLoop, LinearLatency, Poisson

CPU = LinearLatency(a_s=0.4e-3, b_s=1.2e-3, noise=0.1)  # the demo CNN on one core: capacity 625-2,388 items/s
GPU = LinearLatency(a_s=0.05e-3, b_s=4e-3, noise=0.1)  # launch-bound: capacity 250-8,889 items/s
SLOW = LinearLatency(a_s=0.4e-3, b_s=30e-3, noise=0.1)  # one item alone takes 30 ms
MODELS = {"cpu": CPU, "gpu": GPU, "slow": SLOW}
GRID = tuple(TuningParams(n, d_ms / 1000) for n in (1, 2, 4, 8, 16, 32, 64) for d_ms in (0, 1, 2, 5, 10))

# (model, rate items/s, SLO ms): low, medium, near capacity, over capacity for each model, and an SLO
# no setting can meet; one with an SLO that only some settings meet.
CASES = [
    ("cpu", 100, 50),
    ("cpu", 800, 50),
    ("cpu", 2000, 50),  # 84% of the largest capacity
    ("cpu", 3000, 50),  # over every setting's capacity: infeasible
    ("cpu", 1200, 11),  # a tight SLO: only some settings meet it
    ("gpu", 100, 50),
    ("gpu", 1500, 50),
    ("gpu", 8000, 50),  # 90% of the largest capacity
    ("gpu", 11000, 50),  # over capacity: infeasible
    ("slow", 100, 20),  # the SLO is below one batch's execution time: infeasible
]
IDS = [f"{m}-{r}rps-slo{s}ms" for m, r, s in CASES]


def fit_of(latency: LinearLatency) -> LatencyFit:
    return LatencyFit(latency.a_s, latency.b_s)


@cache
def truth(model: str, rate: float) -> dict[TuningParams, tuple[float, float]]:
    """Brute force: every static setting of the grid in the simulator -> (items/s, p99 s)."""
    horizon = max(3.0, 6000 / rate)
    out = {}
    for p in GRID:
        sim = BatcherSim(MODELS[model], Poisson(rate), p, seed=1)
        sim.run_until(horizon)
        s = sim.stats(0.2 * horizon, horizon)
        out[p] = (s.throughput_rps, s.p99_s)
    return out


@cache
def planned(model: str, rate: float, slo_ms: float) -> Plan:
    return plan(fit_of(MODELS[model]), rate, slo_ms / 1000, GRID, service_sigma=MODELS[model].noise)


@pytest.mark.parametrize(("model", "rate", "slo_ms"), CASES, ids=IDS)
def test_throughput_prediction_within_5_percent(model: str, rate: float, slo_ms: float) -> None:
    real = truth(model, rate)
    for c in planned(model, rate, slo_ms).predictions:
        assert c.items_per_s == pytest.approx(real[c.params][0], rel=0.05), c.params


@pytest.mark.parametrize(("model", "rate", "slo_ms"), CASES, ids=IDS)
def test_p99_prediction_where_the_slo_is_met(model: str, rate: float, slo_ms: float) -> None:
    real = truth(model, rate)
    latency = MODELS[model]
    for c in planned(model, rate, slo_ms).predictions:
        p99 = real[c.params][1]
        if p99 > slo_ms / 1000:
            continue
        n = c.params.max_batch_size
        rho = rate * latency.mean(n) / n  # the executor's load with full batches of this setting
        assert c.stable
        assert c.p99_s == pytest.approx(p99, rel=0.25 if rho <= 0.75 else 0.60), (c.params, rho)


@pytest.mark.parametrize(("model", "rate", "slo_ms"), CASES, ids=IDS)
def test_pick_is_within_5_percent_of_the_best_static_setting(model: str, rate: float, slo_ms: float) -> None:
    real = truth(model, rate)
    slo = slo_ms / 1000
    p = planned(model, rate, slo_ms)
    meeting = [x for x, p99 in real.values() if p99 <= slo]
    assert p.feasible == bool(meeting)  # infeasible exactly when no static setting meets the SLO
    got_x, got_p99 = real[p.params]
    if meeting:
        assert got_p99 <= slo
        assert got_x >= 0.95 * max(meeting)
    else:
        # Over capacity every queue grows, and the size-64 settings differ only by the simulator's
        # service noise (p99 0.55-0.63 s after 8 s): within 10% there, within 1% on the slow model.
        assert got_p99 <= 1.10 * min(p99 for _, p99 in real.values())
        assert got_x >= 0.95 * max(x for x, _ in real.values())
        assert p.best.p99_s > slo


def test_the_cases_are_what_they_say() -> None:
    """Guard the table: feasible cases meet the SLO with margin, infeasible ones miss it clearly, and
    the tight-SLO case really splits the grid (so 'infeasible exactly when' is not decided by noise)."""
    for model, rate, slo_ms in CASES:
        p99s = [p99 for _, p99 in truth(model, rate).values()]
        best = min(p99s)
        assert best <= 0.8 * slo_ms / 1000 or best >= 1.2 * slo_ms / 1000, (model, rate)
    tight = [p99 <= 0.011 for _, p99 in truth("cpu", 1200).values()]
    assert any(tight) and not all(tight)


def test_plan_is_deterministic_and_fast() -> None:
    """The whole 35-setting grid in well under 50 ms (measured 4-32 ms on a shared 2-core box)."""
    fit = fit_of(CPU)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = plan(fit, 800, 0.05, GRID, service_sigma=0.1)
        times.append(time.perf_counter() - t0)
    assert p == plan(fit, 800, 0.05, GRID, service_sigma=0.1)
    assert statistics.median(times) < 0.1  # loose: the CI box is shared


def test_cpu_share_stretches_the_batch_latency() -> None:
    half = plan(LatencyFit(0.4e-3, 1.2e-3), 500, 0.05, GRID, cpu_share=0.5)
    slow = plan(LatencyFit(0.8e-3, 2.4e-3), 500, 0.05, GRID)
    assert [c.p99_s for c in half.predictions] == [c.p99_s for c in slow.predictions]
    full = plan(LatencyFit(0.4e-3, 1.2e-3), 500, 0.05, GRID)
    assert half.best.p99_s > full.best.p99_s
    with pytest.raises(ValueError):
        plan(LatencyFit(0.4e-3, 1.2e-3), 500, 0.05, GRID, cpu_share=0.0)


def test_burstier_arrivals_predict_a_longer_tail() -> None:
    fit, p = fit_of(CPU), TuningParams(8, 0.001)
    regular, poisson, bursty = (predict_candidate(p, fit, 1200, arrival_cv2=cv2) for cv2 in (0.0, 1.0, 4.0))
    assert regular.p99_s < poisson.p99_s < bursty.p99_s


def test_over_capacity_settings_are_unstable_and_rank_by_capacity() -> None:
    p = plan(fit_of(CPU), 3000, 0.05, GRID)
    assert not p.feasible and not any(c.stable for c in p.predictions)
    assert p.params == TuningParams(64, 0.0)  # the most capacity, no waiting
    assert p.best.items_per_s == pytest.approx(64 / CPU.mean(64))


def test_no_load_predicts_one_item_alone() -> None:
    c = predict_candidate(TuningParams(8, 0.002), fit_of(CPU), 0.0)
    assert c.p99_s == pytest.approx(0.002 + CPU.mean(1)) and c.items_per_s == 0.0


def test_candidate_grid_stays_in_bounds() -> None:
    grid = candidate_grid(3, 48, 0.0005, 0.003)
    assert sorted({p.max_batch_size for p in grid}) == [3, 4, 8, 16, 32, 48]
    assert sorted({p.max_queue_delay_s for p in grid}) == [0.0005, 0.001, 0.002, 0.003]
    assert candidate_grid(1, 1, 0.0, 0.0) == [TuningParams(1, 0.0)]


# -- closed loop ----------------------------------------------------------------------------------
CLOSED = [("cpu", 1, 0.001), ("cpu", 4, 0.001), ("cpu", 16, 0.002), ("cpu", 64, 0.001), ("gpu", 8, 0.002),
          ("gpu", 32, 0.001), ("gpu", 64, 0.005), ("slow", 4, 0.01)]  # fmt: skip


@pytest.mark.parametrize(("model", "clients", "think_s"), CLOSED, ids=[f"{m}-{c}-clients" for m, c, _ in CLOSED])
def test_closed_loop_predictions_against_the_simulator(model: str, clients: int, think_s: float) -> None:
    latency = MODELS[model]
    preds = predict_closed(GRID, fit_of(latency), clients, think_s, service_sigma=latency.noise)
    for c in preds:
        sim = BatcherSim(latency, ClosedLoop(clients, think_s), c.params, seed=1)
        sim.run_until(10.0)
        real = sim.stats(2.0, 10.0)
        assert c.items_per_s == pytest.approx(real.throughput_rps, rel=0.06), c.params
        assert c.p99_s == pytest.approx(real.p99_s, rel=0.12), c.params


def test_closed_loop_pick_and_limits() -> None:
    """More clients than the size limit: the largest batches win; a size limit above the population
    waits out its delay every time (nobody else comes), which the model must not confuse with a full
    batch; an SLO below one round trip is infeasible."""
    fit = fit_of(CPU)
    p = plan_closed(fit, 64, 0.001, 0.05, GRID)
    assert p.feasible and p.params.max_batch_size >= 32
    alone = predict_closed([TuningParams(1, 0.0), TuningParams(8, 0.004)], fit, 1, 0.001)
    assert alone[1].mean_s == pytest.approx(alone[0].mean_s + 0.004, rel=0.02)
    assert not plan_closed(fit, 64, 0.001, 0.005, GRID).feasible
    with pytest.raises(ValueError):
        predict_closed(GRID, fit, 0, 0.001)


def test_a_closed_loop_pick_keeps_a_margin_on_the_delay() -> None:
    """4 clients that come straight back: batches of 4 fill once a short delay catches them all; the pick
    waits up to twice that shortest delay (late clients in life), for the same predicted items/s."""
    fit = LatencyFit(0.85e-3, 1.0e-3)
    grid = candidate_grid(1, 64, 0.0, 0.010)
    p = plan_closed(fit, 4, 0.0002, 0.045, grid, service_sigma=0.1)
    shortest, chosen = pick_closed(p.predictions, 0.045)[0], p.best
    assert chosen.params.max_batch_size == shortest.params.max_batch_size == 4
    assert shortest.params.max_queue_delay_s < chosen.params.max_queue_delay_s <= 2 * shortest.params.max_queue_delay_s
    assert chosen.items_per_s >= 0.99 * shortest.items_per_s
