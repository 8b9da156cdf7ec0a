"""Runs batches through the model, off the event loop, and isolates the requests a model fails on.

Collation and splitting belong to the model's kind (runtime/kinds): a CV batch concatenates same-shape
tensors along dim 0; an NLP batch pads token ids to its longest sequence with an attention mask.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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

    def add(self, size: int, t_in: float, t_infer: float, t_out: float) -> None:
        self.executions.append((size, t_in, t_infer, t_out))
        self.input_s += t_in
        self.infer_s += t_infer
        self.output_s += t_out


def _last_line(exc: BaseException, limit: int = 200) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Executor:
    """Turns a list of slices into one model call; on failure, bisects so only the culprits fail."""

    def __init__(
        self,
        spec: ModelSpec,
        module: Callable[..., object],
        device: torch.device,
        on_out_of_memory: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.spec = spec
        self.module = module
        self.device = device
        self.on_out_of_memory = on_out_of_memory
        self.kind = kind_for(spec)
        self.output_names = [t.name for t in spec.outputs]
        self.pin = device.type == "cuda"

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
        t0 = time.perf_counter()
        args = self._collate(part, timings)
        t1 = time.perf_counter()
        raw = self.module(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        outputs = self._split(part, self._as_arrays(raw, sum(s.size for s in part)))
        t3 = time.perf_counter()
        timings.add(sum(s.size for s in part), t1 - t0, t2 - t1, t3 - t2)
        return outputs

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cpu":
            return tensor
        if self.pin:
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _collate(self, part: list[Slice], timings: BatchTimings) -> list[torch.Tensor]:
        return [self._to_device(a) for a in self.kind.collate([s.arrays() for s in part], timings)]

    def _as_arrays(self, raw: object, batch: int) -> list[np.ndarray]:
        if isinstance(raw, torch.Tensor):
            tensors = [raw]
        elif isinstance(raw, dict):
            tensors = [raw[name] for name in self.output_names]
        else:
            tensors = list(raw)  # type: ignore[call-overload]  # tuple or list, in the order of the spec's outputs
        if len(tensors) != len(self.output_names):
            raise InternalError(f"model returned {len(tensors)} outputs, config declares {len(self.output_names)}")
        arrays = []
        for name, t in zip(self.output_names, tensors, strict=False):
            if t.dim() == 0 or t.shape[0] != batch:
                raise RuntimeError(f"output {name!r} has shape {list(t.shape)}, expected batch {batch} first")
            arrays.append(t.detach().cpu().numpy())
        return arrays

    def _split(self, part: list[Slice], arrays: list[np.ndarray]) -> list[Outputs]:
        return self.kind.split(part, self.output_names, arrays)
