"""d(n) timed alone at load (runtime/batching/alone.py) and the autotuner's use of it: the floor under a live line's
fixed cost, and the shape of a settled tuner's single size."""

from __future__ import annotations

import pytest
import torch

from batchpilot.runtime.autotune_model import AloneFits, LatencyFit, TuningParams
from batchpilot.runtime.autotuner import Autotuner
from batchpilot.runtime.batching.alone import LARGEST, time_alone
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.batching.tuning import make_tuner
from batchpilot.runtime.demo_models import build_demo_modules
from batchpilot.spec.model import AutotuneSpec

ALONE = LatencyFit(0.65e-3, 1.7e-3)  # resnet-mini alone on this machine, about


def tuner(alone: LatencyFit | None) -> Autotuner:
    return Autotuner(
        AutotuneSpec(latency_slo_p99_ms=50),
        TuningParams(16, 0.002),
        alone=None if alone is None else AloneFits(alone, alone),
    )


def feed(t: Autotuner, sizes: list[int], seconds: LatencyFit) -> None:
    for i in range(60):
        n = sizes[i % len(sizes)]
        d = seconds(n)
        t.record_batch(n, d, 0.01 * i, cpu_s=d)


def fitted(t: Autotuner, cpu: bool = False) -> LatencyFit:
    figures = t.snapshot(0.6)["cpu_latency_model" if cpu else "latency_model"]
    return LatencyFit(figures["a_ms_per_item"] / 1e3, figures["b_ms"] / 1e3)


def test_a_live_line_that_lost_its_fixed_cost_takes_the_share_the_model_showed_alone() -> None:
    """Batches whose live line runs through 0 below the smallest size (as an open loop's do where the larger batches
    form in the host's slow seconds) fit with no fixed cost; the alone shape puts it back, through the same mean."""
    tilted = LatencyFit(1.6e-3, -2e-3)  # d(n) as the live batches read, intercept below 0
    sizes = [4, 8, 12, 16]
    bare, floored = tuner(None), tuner(ALONE)
    feed(bare, sizes, tilted)
    feed(floored, sizes, tilted)
    mean = sum(sizes) / len(sizes)
    assert fitted(bare).b_s == 0.0
    for cpu in (False, True):
        line = fitted(floored, cpu)
        assert line(mean) == pytest.approx(tilted(mean), rel=1e-3)  # the level is the live one
        assert line.b_s / line.a_s == pytest.approx(ALONE.b_s / ALONE.a_s, rel=1e-2)  # the shape is the alone one
    assert floored.snapshot(0.6)["alone_latency_model"] == {"a_ms_per_item": 0.65, "b_ms": 1.7}


def test_a_live_line_with_more_fixed_cost_than_alone_is_kept() -> None:
    live = LatencyFit(0.5e-3, 4e-3)
    t = tuner(ALONE)
    feed(t, [4, 8, 16], live)
    assert fitted(t).a_s == pytest.approx(live.a_s, rel=1e-3)
    assert fitted(t).b_s == pytest.approx(live.b_s, rel=1e-3)


def test_a_settled_size_takes_its_shape_from_the_model_alone_not_the_pessimistic_guess() -> None:
    """Only full batches of 16 seen: without another size the fit is the pessimistic d/n (nothing from batching);
    the alone shape, scaled through the size's median, gives the fixed cost."""
    truth = LatencyFit(1.0e-3, 2.6e-3)
    bare, shaped = tuner(None), tuner(ALONE)
    feed(bare, [16], truth)
    feed(shaped, [16], truth)
    assert fitted(bare).b_s == 0.0
    line = fitted(shaped)
    assert line(16) == pytest.approx(truth(16), rel=1e-3)
    assert line.b_s == pytest.approx(truth(16) * ALONE.b_s / ALONE(16), rel=1e-3)


@pytest.fixture(scope="module")
def resnet() -> Executor:
    spec, module = build_demo_modules()["resnet-mini"]
    return Executor(spec, module.eval(), torch.device("cpu"))


def test_the_demo_image_model_alone_has_a_fixed_cost_and_a_cost_per_item(resnet: Executor) -> None:
    fits = time_alone(resnet, 64)
    assert fits is not None
    for line in (fits.wall, fits.cpu):
        assert line.a_s > 0 and line.b_s > 0
        assert line(LARGEST) < LARGEST * line(1)  # a batch of 32 costs less than 32 batches of 1


def test_too_few_sizes_or_a_failing_model_give_no_shape(resnet: Executor) -> None:
    assert time_alone(resnet, 2) is None
    spec, _ = build_demo_modules()["resnet-mini"]

    def broken(*_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no")

    assert time_alone(Executor(spec, broken, torch.device("cpu")), 64) is None


def test_only_an_autotuned_fixed_shape_model_is_timed(resnet: Executor) -> None:
    """The image model is timed when autotuned; not when its parameters are static."""
    spec = resnet.spec
    tuned = make_tuner(
        spec.model_copy(update={"autotune": spec.autotune.model_copy(update={"enabled": True})}), True, resnet
    )
    assert tuned.report().alone_latency_model is not None
    static = make_tuner(
        spec.model_copy(update={"autotune": spec.autotune.model_copy(update={"enabled": False})}), True, resnet
    )
    assert static.report().alone_latency_model is None


def test_a_sequence_model_is_not_timed() -> None:
    """A sequence model's cost per item follows the lengths its traffic brings, which zeros of one length cannot."""
    spec, module = build_demo_modules()["textcls"]
    spec = spec.model_copy(update={"autotune": spec.autotune.model_copy(update={"enabled": True})})
    t = make_tuner(spec, True, Executor(spec, module.eval(), torch.device("cpu")))
    assert t.adaptive and t.report().alone_latency_model is None
