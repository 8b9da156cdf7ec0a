"""Runs batches through the model, off the event loop, and isolates the requests a model fails on.

Collation and splitting belong to the model's kind (runtime/kinds): a CV batch concatenates same-shape
tensors along dim 0; an NLP batch pads token ids to its longest sequence with an attention mask.

On a GPU (and on the CPU when asked: `staging=True`, which is how the path is tested without one):
- each request's rows are copied once, into the batch's host buffer: a preallocated one, reused, per
  model, input and pipeline slot (page-locked on a GPU, so its copy to the device is asynchronous);
- the model has its own CUDA streams: the host-to-device copy of batch k+1 runs on a copy stream while
  batch k computes on the compute stream (`pipeline_depth` 2: two batches in flight, each in its own
  thread of the runner; launches are serialised, completion is waited for outside the lock);
- outputs come back once per batch (one device-to-host copy per output into page-locked memory), and
  each request gets views of its rows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from batchpilot.runtime.batching.request import Outputs, Slice
from batchpilot.runtime.errors import InternalError, ModelFailed, RequestError
from batchpilot.runtime.kinds import kind_for
from batchpilot.spec.model import ModelSpec

log = logging.getLogger("batchpilot.executor")


@dataclass
class BatchTimings:
    input_s: float = 0.0
    infer_s: float = 0.0
    output_s: float = 0.0
    tokens_useful: int = 0
    tokens_computed: int = 0
    executions: list[tuple[int, float, float, float]] = field(default_factory=list)  # (size, in, infer, out)
    cpu_s: list[float] = field(default_factory=list)  # per execution: the executing thread's CPU time

    def add(self, size: int, t_in: float, t_infer: float, t_out: float, cpu_s: float) -> None:
        self.executions.append((size, t_in, t_infer, t_out))
        self.cpu_s.append(cpu_s)
        self.input_s += t_in
        self.infer_s += t_infer
        self.output_s += t_out


def _last_line(exc: BaseException, limit: int = 200) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class HostStaging:
    """Reused host buffers a batch's inputs are collated into: one per input position, grown when a batch
    needs more room (page-locked when `pin`). One staging set belongs to one batch at a time."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._buffers: dict[int, np.ndarray] = {}  # input position -> flat uint8 buffer

    def take(self, index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A [shape] array of `dtype` over this position's buffer (its content is whatever was there)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = self._buffers.get(index)
        if buffer is None or buffer.nbytes < nbytes:
            size = max(nbytes, 2 * (buffer.nbytes if buffer is not None else 0), 64)
            if self.pin:
                buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True).numpy()
            else:
                buffer = np.empty(size, dtype=np.uint8)
            self._buffers[index] = buffer
        return buffer[:nbytes].view(dtype).reshape(shape)

    def holds(self, array: np.ndarray) -> bool:
        """Whether `array` shares memory with one of the buffers (a model output aliasing its input)."""
        return any(np.may_share_memory(array, b) for b in self._buffers.values())


class Executor:
    """Turns a list of slices into one model call; on failure, bisects so only the culprits fail."""

    def __init__(
        self,
        spec: ModelSpec,
        module: Callable[..., object],
        device: torch.device,
        on_out_of_memory: Callable[[int], None] = lambda size: None,
        *,
        staging: bool | None = None,
        pipeline_depth: int | None = None,
    ) -> None:
        self.spec = spec
        self.module = module
        self.device = device
        self.on_out_of_memory = on_out_of_memory
        self.kind = kind_for(spec)
        self.output_names = [t.name for t in spec.outputs]
        cuda = device.type == "cuda"
        self.pin = cuda
        #: Batches in flight at once: 2 on a GPU (copy of the next overlaps compute of this one), else 1.
        #: Responses in order (preserve_ordering) keep one.
        depth = pipeline_depth if pipeline_depth is not None else (2 if cuda else 1)
        self.pipeline_depth = 1 if spec.batching.preserve_ordering else max(1, depth)
        self.staging = cuda if staging is None else staging
        self._slots: queue.SimpleQueue[HostStaging] = queue.SimpleQueue()
        for _ in range(self.pipeline_depth):
            self._slots.put(HostStaging(self.pin))
        self._launch = threading.Lock()
        self._copy_stream: Any = torch.cuda.Stream(device) if cuda else None
        self._compute_stream: Any = torch.cuda.Stream(device) if cuda else None

    # -- the public entry point, run in the executor thread ------------------------------------------
    def run(self, slices: list[Slice]) -> tuple[list[Outputs | RequestError], BatchTimings]:
        timings = BatchTimings()
        results: list[Outputs | RequestError] = [InternalError("not run")] * len(slices)
        self._run_isolated(slices, list(range(len(slices))), results, timings)
        return results, timings

    def _run_isolated(self, slices: list[Slice], index: list[int], results: list, timings: BatchTimings) -> None:
        part = [slices[i] for i in index]
        try:
            outputs = self._forward(part, timings)
        except Exception as exc:  # the model raised: find out whose items did it
            size = sum(s.size for s in part)
            if is_out_of_memory(exc):
                # Not the input's fault: lower the ceiling and retry in halves.
                self.on_out_of_memory(size)
            if len(part) == 1:
                # Neither the log nor the answer carries the traceback (server paths) or more than the
                # error's last line (which a model might fill with its input).
                log.warning("model %s failed on one request (%d items): %s", self.spec.name, size, type(exc).__name__)
                results[index[0]] = ModelFailed(f"model {self.spec.name!r} failed on this input: {_last_line(exc)}")
                return
            half = len(index) // 2
            self._run_isolated(slices, index[:half], results, timings)
            self._run_isolated(slices, index[half:], results, timings)
            return
        for i, out in zip(index, outputs, strict=False):
            results[i] = out

    # -- one model call ---------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, part: list[Slice], timings: BatchTimings) -> list[Outputs]:
        slot = self._slots.get() if self.staging else None  # one of pipeline_depth, so never waits long
        try:
            if self._compute_stream is not None:
                return self._forward_cuda(part, timings, slot)
            return self._forward_host(part, timings, slot)
        finally:
            if slot is not None:
                self._slots.put(slot)

    def _forward_host(self, part: list[Slice], timings: BatchTimings, slot: HostStaging | None) -> list[Outputs]:
        """The model on the CPU (or any device without streams: a synchronous copy each way)."""
        size = sum(s.size for s in part)
        c0, t0 = time.thread_time(), time.perf_counter()
        args = [self._to_device(a) for a in self._host_batch(part, timings, slot)]
        t1 = time.perf_counter()
        with self._launch:
            raw = self.module(*args)
        t2 = time.perf_counter()
        arrays = self._as_arrays(raw, size)
        if slot is not None:  # a model may hand back (a view of) its input: the buffer is reused
            arrays = [a.copy() if slot.holds(a) else a for a in arrays]
        outputs = self._split(part, arrays)
        t3 = time.perf_counter()
        timings.add(size, t1 - t0, t2 - t1, t3 - t2, time.thread_time() - c0)
        return outputs

    def _forward_cuda(self, part: list[Slice], timings: BatchTimings, slot: HostStaging | None) -> list[Outputs]:
        """Copy in on the copy stream, compute on the compute stream after it, copy the outputs back once,
        then wait, without the launch lock, for this batch only (the next one's copy and launch go on)."""
        size = sum(s.size for s in part)
        copy_stream, compute_stream = self._copy_stream, self._compute_stream
        c0, t0 = time.thread_time(), time.perf_counter()
        host = self._host_batch(part, timings, slot)
        with torch.cuda.stream(copy_stream):
            args = [torch.from_numpy(a).to(self.device, non_blocking=True) for a in host]
            copied = torch.cuda.Event()
            copied.record(copy_stream)
        with self._launch:
            compute_stream.wait_event(copied)
            t1 = time.perf_counter()
            with torch.cuda.stream(compute_stream):
                for a in args:  # made on the copy stream, used on this one: not freed before compute ends
                    a.record_stream(compute_stream)
                raw = self.module(*args)
                tensors = self._output_tensors(raw, size)
                back = []
                for t in tensors:
                    pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    pinned.copy_(t.detach(), non_blocking=True)
                    back.append(pinned)
                done = torch.cuda.Event()
                done.record(compute_stream)
        done.synchronize()  # the host buffers (slot) and the outputs are safe to use from here
        t2 = time.perf_counter()
        outputs = self._split(part, [b.numpy() for b in back])
        t3 = time.perf_counter()
        timings.add(size, t1 - t0, t2 - t1, t3 - t2, time.thread_time() - c0)
        return outputs

    def _host_batch(self, part: list[Slice], timings: BatchTimings, slot: HostStaging | None) -> list[np.ndarray]:
        """The batch's inputs on the host: its rows copied once, into the slot's buffers when staging."""
        parts = [s.arrays() for s in part]
        if slot is None:
            return self.kind.collate(parts, timings)
        collate_into = getattr(self.kind, "collate_into", None)
        if collate_into is None:  # a kind that only collates: one more copy, into the staging buffer
            arrays = self.kind.collate(parts, timings)
            staged = []
            for i, a in enumerate(arrays):
                buffer = slot.take(i, a.shape, a.dtype)
                np.copyto(buffer, a)
                staged.append(buffer)
            return staged
        return list(collate_into(parts, timings, slot.take))

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cpu":
            return tensor
        if self.pin and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _output_tensors(self, raw: object, batch: int) -> list[torch.Tensor]:
        if isinstance(raw, torch.Tensor):
            tensors = [raw]
        elif isinstance(raw, dict):
            tensors = [raw[name] for name in self.output_names]
        else:
            tensors = list(raw)  # type: ignore[call-overload]  # tuple or list, in the order of the spec's outputs
        if len(tensors) != len(self.output_names):
            raise InternalError(f"model returned {len(tensors)} outputs, config declares {len(self.output_names)}")
        for name, t in zip(self.output_names, tensors, strict=False):
            if t.dim() == 0 or t.shape[0] != batch:
                raise RuntimeError(f"output {name!r} has shape {list(t.shape)}, expected batch {batch} first")
        return tensors

    def _as_arrays(self, raw: object, batch: int) -> list[np.ndarray]:
        arrays = [t.detach().cpu().numpy() for t in self._output_tensors(raw, batch)]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return arrays

    def _split(self, part: list[Slice], arrays: list[np.ndarray]) -> list[Outputs]:
        return self.kind.split(part, self.output_names, arrays)
