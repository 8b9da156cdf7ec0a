"""What watches a batcher: Triton statistics, Prometheus metrics, the recent window (and the tuner, see tuning).

The batcher tells one `BatchObserver` (a fan-out over all of them) what happens, in these events:
- `arrived`: a request was admitted to the queue;
- `released`: a batch left the queue, and why (full, preferred, delay, deadline, drained);
- `executed`: one model call of `size` items ran, with its input/infer/output seconds;
- `batch_done`: a batch finished (its token counts, for padding efficiency);
- `finished`: a request left with an answer or an error of its own (outcome success, error, invalid);
  a batch's answers arrive together as one `finished_batch` (by default: `finished` for each), so an
  observer that can aggregate pays once per batch, not once per request;
- `dropped`: a request left without one (outcome timeout, or error when the model hangs);
- `params_changed`: the batching parameters in force changed;
- `tuned`: the tuner looked at the figures (whether the SLO is feasible, whether it moved the parameters);
- `health`: the model stopped or started serving (a hung batch, and its return).
Each observer overrides the events it cares about; the rest do nothing. (The queue's depth is no event: the
metrics read it when scraped, so an arrival costs no gauge update.)
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any, NamedTuple

from batchpilot.runtime.autotuner import TuningParams
from batchpilot.runtime.batching.executor import BatchTimings
from batchpilot.runtime.batching.request import Pending, Slice
from batchpilot.runtime.batching.window import RecentWindow
from batchpilot.runtime.metrics import OUTCOMES, RuntimeMetrics, observe_many
from batchpilot.runtime.stats import ModelStats

NS = 1e9


class Finished(NamedTuple):
    """One request that left with an answer or an error of its own."""

    request: Pending
    outcome: str
    queued_s: float  # in the batch queue
    total_s: float  # from the front-end's read of the request (`Pending.received_mono`) to its batch's end


class BatchObserver:
    """Every event a batcher reports; each does nothing here."""

    def arrived(self, request: Pending) -> None:
        pass

    def released(self, reason: str, slices: Sequence[Slice]) -> None:
        pass

    def executed(self, size: int, input_s: float, infer_s: float, output_s: float) -> None:
        pass

    def batch_done(self, timings: BatchTimings) -> None:
        pass

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        """`now` is the loop's clock (what the recent window counts in)."""

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        """The requests one batch answered, together; by default each is `finished` in turn."""
        for f in done:
            self.finished(f.request, f.outcome, f.queued_s, f.total_s, timings, now)

    def dropped(self, request: Pending, outcome: str) -> None:
        pass

    def refused(self, n_items: int) -> None:
        """A request the queue refused, full (never admitted)."""

    def params_changed(self, params: TuningParams) -> None:
        pass

    def tuned(self, slo_feasible: bool, changed: bool) -> None:
        pass

    def health(self, serving: bool) -> None:
        pass


class Observers(BatchObserver):
    """Fan-out: each event goes to every observer, in order (only to those that override it: an event no one
    handles costs one call, not one per observer)."""

    def __init__(self, observers: Sequence[BatchObserver]) -> None:
        self.observers = list(observers)

        def handlers(event: str) -> list[Any]:
            return [getattr(o, event) for o in self.observers if self._overrides(o, event)]

        self._arrived = handlers("arrived")
        self._released = handlers("released")
        self._executed = handlers("executed")
        self._batch_done = handlers("batch_done")
        self._finished = handlers("finished")
        self._finished_batch = [
            o.finished_batch
            for o in self.observers
            if type(o).finished_batch is not BatchObserver.finished_batch
            or type(o).finished is not BatchObserver.finished
        ]
        self._dropped = handlers("dropped")
        self._refused = handlers("refused")
        self._params_changed = handlers("params_changed")
        self._tuned = handlers("tuned")
        self._health = handlers("health")

    @staticmethod
    def _overrides(observer: BatchObserver, *events: str) -> bool:
        return any(getattr(type(observer), e) is not getattr(BatchObserver, e) for e in events)

    def arrived(self, request: Pending) -> None:
        for handler in self._arrived:
            handler(request)

    def released(self, reason: str, slices: Sequence[Slice]) -> None:
        for handler in self._released:
            handler(reason, slices)

    def executed(self, size: int, input_s: float, infer_s: float, output_s: float) -> None:
        for handler in self._executed:
            handler(size, input_s, infer_s, output_s)

    def batch_done(self, timings: BatchTimings) -> None:
        for handler in self._batch_done:
            handler(timings)

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        for handler in self._finished:
            handler(request, outcome, queued_s, total_s, timings, now)

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        for handler in self._finished_batch:
            handler(done, timings, now)

    def dropped(self, request: Pending, outcome: str) -> None:
        for handler in self._dropped:
            handler(request, outcome)

    def refused(self, n_items: int) -> None:
        for handler in self._refused:
            handler(n_items)

    def params_changed(self, params: TuningParams) -> None:
        for handler in self._params_changed:
            handler(params)

    def tuned(self, slo_feasible: bool, changed: bool) -> None:
        for handler in self._tuned:
            handler(slo_feasible, changed)

    def health(self, serving: bool) -> None:
        for handler in self._health:
            handler(serving)


class StatsObserver(BatchObserver):
    """Triton's cumulative statistics (`GET /v2/models/{m}/stats`)."""

    def __init__(self, stats: ModelStats) -> None:
        self.stats = stats

    def executed(self, size: int, input_s: float, infer_s: float, output_s: float) -> None:
        self.stats.record_execution(size, int(input_s * NS), int(infer_s * NS), int(output_s * NS))

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        if outcome != "success":
            self.stats.record_failure(int(total_s * NS))
            return
        self.stats.record_success(
            int(queued_s * NS),
            int(timings.input_s * NS),
            int(timings.infer_s * NS),
            int(timings.output_s * NS),
            int(total_s * NS),
        )

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        ok = [f for f in done if f.outcome == "success"]
        if len(ok) != len(done):
            for f in done:
                if f.outcome != "success":
                    self.stats.record_failure(int(f.total_s * NS))
        if ok:
            self.stats.record_successes(
                len(ok),
                sum(int(f.queued_s * NS) for f in ok),
                int(timings.input_s * NS),
                int(timings.infer_s * NS),
                int(timings.output_s * NS),
                sum(int(f.total_s * NS) for f in ok),
            )


class RecentObserver(BatchObserver):
    """Latency and throughput of the last seconds (what the operator shows in status)."""

    def __init__(self, window: RecentWindow) -> None:
        self.window = window

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        if outcome == "success":
            self.window.add(now, total_s, request.n)

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        self.window.add_many(now, [(f.total_s, f.request.n) for f in done if f.outcome == "success"])


class MetricsObserver(BatchObserver):
    """The model's Prometheus series (names in runtime/metrics.py)."""

    def __init__(self, metrics: RuntimeMetrics, model: str) -> None:
        self.metrics = metrics
        self.model = model
        m = metrics
        labelled: dict[str, Any] = {
            "queue_wait": m.queue_wait,
            "compute": m.compute,
            "latency": m.latency,
            "batch_size": m.batch_size,
            "depth": m.queue_depth,
            "max_batch": m.max_batch_size,
            "max_delay": m.max_queue_delay,
            "slo": m.latency_slo,
            "changes": m.autotune_changes,
            "feasible": m.slo_feasible,
            "padding": m.padding_efficiency,
            "tok_useful": m.tokens_useful,
            "tok_computed": m.tokens_computed,
            "ready": m.model_ready,
        }
        self._m = {name: metric.labels(model=model) for name, metric in labelled.items()}
        self._outcomes = {outcome: metrics.requests.labels(model=model, outcome=outcome) for outcome in OUTCOMES}
        self._releases: dict[str, Any] = {}  # reason -> its counter child

    def slo(self, seconds: float) -> None:
        self._m["slo"].set(seconds)

    def watch_queue(self, queue: Sized) -> None:
        """The queue depth gauge reads `len(queue)` when scraped."""
        self._m["depth"].set_function(lambda: len(queue))

    def released(self, reason: str, slices: Sequence[Slice]) -> None:
        self._inc(self._releases, self.metrics.release, "reason", reason)

    def executed(self, size: int, input_s: float, infer_s: float, output_s: float) -> None:
        self._m["batch_size"].observe(size)
        self._m["compute"].observe(input_s + infer_s + output_s)

    def batch_done(self, timings: BatchTimings) -> None:
        if timings.tokens_computed:
            self._m["tok_useful"].inc(timings.tokens_useful)
            self._m["tok_computed"].inc(timings.tokens_computed)
            self._m["padding"].set(timings.tokens_useful / timings.tokens_computed)

    def finished(
        self, request: Pending, outcome: str, queued_s: float, total_s: float, timings: BatchTimings, now: float
    ) -> None:
        if outcome == "success":
            self._m["queue_wait"].observe(queued_s)
            self._m["latency"].observe(total_s)
        self._outcome(outcome)

    def finished_batch(self, done: Sequence[Finished], timings: BatchTimings, now: float) -> None:
        ok = [f for f in done if f.outcome == "success"]
        if ok:
            observe_many(self._m["queue_wait"], [f.queued_s for f in ok])
            observe_many(self._m["latency"], [f.total_s for f in ok])
            self._outcomes["success"].inc(len(ok))
        if len(ok) != len(done):
            for f in done:
                if f.outcome != "success":
                    self._outcome(f.outcome)

    def dropped(self, request: Pending, outcome: str) -> None:
        self._outcome(outcome)

    def _outcome(self, outcome: str) -> None:
        self._inc(self._outcomes, self.metrics.requests, "outcome", outcome)

    def _inc(self, children: dict[str, Any], metric: Any, label: str, value: str) -> None:
        """Count one in `metric`{model, label=value}: its children are kept (labels() takes a lock and a lookup)."""
        child = children.get(value)
        if child is None:
            child = children[value] = metric.labels(**{"model": self.model, label: value})
        child.inc()

    def params_changed(self, params: TuningParams) -> None:
        self._m["max_batch"].set(params.max_batch_size)
        self._m["max_delay"].set(params.max_queue_delay_s)

    def tuned(self, slo_feasible: bool, changed: bool) -> None:
        self._m["feasible"].set(1 if slo_feasible else 0)
        if changed:
            self._m["changes"].inc()

    def health(self, serving: bool) -> None:
        self._m["ready"].set(1 if serving else 0)
