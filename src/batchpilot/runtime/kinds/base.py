"""The model kind's contract, and the fixed-shape kind every other kind starts from.

A kind is what `ModelSpec.type` names: it decides how a model's requests are batched and fed to it.
`ModelKind` is the whole contract; `StackedKind` implements it for models whose requests stack along
dim 0 (requests with equal per-item shapes share a batch, inputs are concatenated, outputs are cut
back per request), and a kind overrides only what it does differently.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from batchpilot.runtime.batching.policy import BatchPolicy, StackPolicy
from batchpilot.runtime.batching.request import Outputs, Slice
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.tensors import NUMPY_DTYPES, Decoded, RawInput
from batchpilot.spec.model import ModelSpec

#: Where a kind may collate a batch: `take(position, shape, dtype)` is an array over a reused host buffer.
Take = Callable[[int, tuple[int, ...], np.dtype], np.ndarray]


class TokenCount(Protocol):
    """Where collation reports the token slots it filled (padding efficiency); BatchTimings is one."""

    tokens_useful: int
    tokens_computed: int


class ModelKind(Protocol):
    """What the runtime asks of a model kind, for one model (`spec`)."""

    name: ClassVar[str]
    spec: ModelSpec

    def check_input(self, raw: RawInput) -> None:
        """Refuse an input the kind cannot take (beyond name, datatype and shape, checked for every kind)."""

    def batch_policy(self) -> BatchPolicy:
        """Which waiting requests make up the next batch."""

    def request_key(self, inputs: dict[str, np.ndarray]) -> Hashable:
        """Requests with different keys never share a batch."""

    def request_length(self, inputs: dict[str, np.ndarray]) -> int:
        """Tokens per item (what length-grouping reads), 0 for kinds without a sequence."""

    def collate(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount) -> list[np.ndarray]:
        """One model call's positional arguments from the slices' inputs (each [k, ...])."""

    def collate_into(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount, take: Take) -> list[np.ndarray]:
        """`collate`, into the arrays `take` gives (the batch's reused host buffers): each row copied once.
        Optional: a kind without it is collated, then copied into the buffers."""

    def split(self, part: Sequence[Slice], output_names: Sequence[str], arrays: Sequence[np.ndarray]) -> list[Outputs]:
        """Each slice's share of the model's outputs (each [batch, ...]), in slice order."""

    def v1_groups(self, per_input: dict[str, list[Any]]) -> list[list[Decoded]]:
        """KServe v1 instances (values per input name) as requests: one list of decoded inputs each."""

    def example_inputs(self, batch: int) -> list[np.ndarray]:
        """Positional model arguments of the right shape and type for `batch` items (warm-up)."""


class StackedKind:
    """Fixed-shape items stacked along dim 0: a batch holds requests of equal per-item shapes."""

    name: ClassVar[str] = "stacked"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def check_input(self, raw: RawInput) -> None:
        return None

    def batch_policy(self) -> BatchPolicy:
        return StackPolicy()

    def request_key(self, inputs: dict[str, np.ndarray]) -> Hashable:
        return tuple(a.shape[1:] for a in inputs.values())

    def request_length(self, inputs: dict[str, np.ndarray]) -> int:
        return 0

    def collate(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount) -> list[np.ndarray]:
        if len(parts) == 1:
            return [parts[0][t.name] for t in self.spec.inputs]
        return [np.concatenate([p[t.name] for p in parts]) for t in self.spec.inputs]

    def collate_into(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount, take: Take) -> list[np.ndarray]:
        out = []
        for i, t in enumerate(self.spec.inputs):
            pieces = [p[t.name] for p in parts]
            rows = sum(piece.shape[0] for piece in pieces)
            buffer = take(i, (rows, *pieces[0].shape[1:]), pieces[0].dtype)
            np.concatenate(pieces, out=buffer)
            out.append(buffer)
        return out

    def trim(self, name: str, piece: np.ndarray, slice_: Slice) -> np.ndarray:
        """One output of one slice, as the client gets it (a kind that pads cuts the padding off here)."""
        return piece

    def split(self, part: Sequence[Slice], output_names: Sequence[str], arrays: Sequence[np.ndarray]) -> list[Outputs]:
        results, row = [], 0
        for s in part:
            results.append(
                {name: self.trim(name, a[row : row + s.size], s) for name, a in zip(output_names, arrays, strict=True)}
            )
            row += s.size
        return results

    def v1_groups(self, per_input: dict[str, list[Any]]) -> list[list[Decoded]]:
        """All instances as one request (they stack when their shapes agree; conversion names it otherwise)."""
        decoded: list[Decoded] = []
        for t in self.spec.inputs:
            values = per_input[t.name]
            item_shape = nested_shape(values[0])
            if item_shape is None:
                raise InvalidRequest(f"input {t.name!r}: each instance must be a (nested) list of numbers")
            decoded.append((RawInput(t.name, t.datatype, (len(values), *item_shape)), values))
        return [decoded]

    def example_inputs(self, batch: int) -> list[np.ndarray]:
        """Zeros; a variable dimension gets 8."""
        return [
            np.zeros([batch, *(8 if d == -1 else d for d in t.shape)], dtype=NUMPY_DTYPES[t.datatype])
            for t in self.spec.inputs
        ]


def nested_shape(value: Any) -> tuple[int, ...] | None:
    """Shape of a nested list, read along its first elements (raggedness is caught on conversion)."""
    shape = []
    while isinstance(value, list):
        if not value:
            return None
        shape.append(len(value))
        value = value[0]
    return tuple(shape) if shape else None
