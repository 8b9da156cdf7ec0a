"""Tensor datatypes and the validation every input passes before it may join a batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchpilot.runtime.errors import InvalidRequest, PayloadTooLarge
from batchpilot.spec.model import ModelSpec, TensorSpec

NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
DATATYPE_OF = {dtype: name for name, dtype in NUMPY_DTYPES.items()}

#: Hard ceiling on elements per input tensor: refused before anything is allocated.
MAX_ELEMENTS = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RawInput:
    """An input as the wire describes it, before its data is turned into an array."""

    name: str
    datatype: str
    shape: tuple[int, ...]


#: An input as decoded from the wire: its description and raw bytes, a JSON list, or the flat numeric
#: array the JSON reader made of that list.
Decoded = tuple[RawInput, "bytes | memoryview | list[Any] | np.ndarray"]


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def check_input(spec: ModelSpec, raw: RawInput, max_items: int) -> TensorSpec:
    """Validate one input's name, datatype and shape against the model; return its spec. (What a model kind
    adds, such as a sequence length limit, is checked by the kind: see runtime/kinds.)"""
    for tensor in spec.inputs:  # a loop, not next() over a generator: this runs for every request
        if tensor.name == raw.name:
            break
    else:
        known = ", ".join(t.name for t in spec.inputs)
        raise InvalidRequest(f"unknown input {raw.name!r}; model {spec.name!r} takes: {known}")
    if raw.datatype != tensor.datatype:
        raise InvalidRequest(
            f"input {raw.name!r}: datatype {raw.datatype!r} does not match the model's {tensor.datatype}"
        )
    shape = raw.shape
    if len(shape) != len(tensor.shape) + 1:
        want = [-1, *tensor.shape]
        raise InvalidRequest(f"input {raw.name!r}: shape {list(shape)} does not match {want} (batch dim first)")
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise InvalidRequest(f"input {raw.name!r}: shape {list(shape)} must hold non-negative integers")
    if shape[0] < 1:
        raise InvalidRequest(f"input {raw.name!r}: the batch dimension must be at least 1")
    if shape[0] > max_items:
        raise InvalidRequest(f"input {raw.name!r}: batch of {shape[0]} items exceeds max_batch_size {max_items}")
    for got, declared in zip(shape[1:], tensor.shape, strict=True):
        if declared != -1 and got != declared:
            raise InvalidRequest(f"input {raw.name!r}: shape {list(shape)} does not match {[-1, *tensor.shape]}")
        if got == 0:
            raise InvalidRequest(f"input {raw.name!r}: empty dimension in shape {list(shape)}")
    if element_count(shape) > MAX_ELEMENTS:
        raise PayloadTooLarge(f"input {raw.name!r}: {element_count(shape)} elements exceed the limit of {MAX_ELEMENTS}")
    return tensor


def check_complete(spec: ModelSpec, names: list[str]) -> None:
    """Every model input is present exactly once."""
    known = [t.name for t in spec.inputs]
    if names == known:  # the usual request: each input once, in the model's order
        return
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidRequest(f"unknown input(s) {unknown}; model {spec.name!r} takes {known}")
    if len(set(names)) != len(names):
        raise InvalidRequest(f"duplicate input names in request: {names}")
    missing = [t.name for t in spec.inputs if t.name not in names]
    if missing:
        raise InvalidRequest(f"missing input(s) {missing} for model {spec.name!r}")


def array_from_bytes(raw: RawInput, data: bytes | memoryview) -> np.ndarray:
    dtype = NUMPY_DTYPES[raw.datatype]
    expected = element_count(raw.shape) * dtype.itemsize
    if len(data) != expected:
        raise InvalidRequest(
            f"input {raw.name!r}: {len(data)} bytes sent, shape {list(raw.shape)} of {raw.datatype} needs {expected}"
        )
    return np.ndarray(raw.shape, dtype, buffer=data)  # frombuffer().reshape() in one call (read-only as well)


def array_from_list(raw: RawInput, data: object) -> np.ndarray:
    """JSON `data` (flat or nested list, or the flat array the JSON reader made of it) to an array of the
    declared shape.

    The checks run in one order whatever form `data` takes, so that a body gets the same answer from either
    JSON reader of the v2 codec: a ragged nest of lists first, then the number of values, then their type and
    range."""
    if not isinstance(data, (list, np.ndarray)):
        raise InvalidRequest(f"input {raw.name!r}: 'data' must be a list")
    try:
        array = np.asarray(data)
    except ValueError as exc:  # numpy: "... inhomogeneous shape after 1 dimensions ..."
        raise InvalidRequest(
            f"input {raw.name!r}: 'data' is ragged (lists of unequal lengths or depths): {exc}"
        ) from None
    count = element_count(raw.shape)
    if array.size != count:
        raise InvalidRequest(f"input {raw.name!r}: {array.size} values sent, shape {list(raw.shape)} needs {count}")
    dtype = NUMPY_DTYPES[raw.datatype]
    try:
        if raw.datatype == "BOOL":
            if array.dtype != np.bool_:
                raise TypeError("BOOL data must be true/false")
        else:
            if dtype.kind in "iu" and array.dtype.kind == "f" and isinstance(data, list):
                array = _integers(data, array, raw.datatype)
            if array.dtype.kind not in "biuf" or (dtype.kind in "iu" and array.dtype.kind == "f"):
                raise TypeError(f"values of kind {array.dtype} cannot be {raw.datatype}")
            if dtype.kind == "f" and array.dtype.kind in "iu":
                # A JSON number is a double, whichever reader read it: integers past 2**53 rounded straight
                # to float32 could end one float32 apart from the same integers read as doubles first (as
                # the v2 codec's large-body reader and any list with a fraction in it read them).
                array = array.astype(np.float64)
            with np.errstate(over="raise", invalid="raise"):
                if dtype.kind in "iu":
                    info = np.iinfo(dtype)
                    if array.size and (array.min() < info.min or array.max() > info.max):
                        raise OverflowError(f"values out of range for {raw.datatype}")
                array = array.astype(dtype)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise InvalidRequest(f"input {raw.name!r}: data does not fit {raw.datatype}: {exc}") from None
    return array.reshape(raw.shape)


def _integers(data: list[Any], floats: np.ndarray, datatype: str) -> np.ndarray:
    """`data` read exactly as `datatype` (an integer type) when numpy made floats of it although every value
    is an integer: integers on both sides of int64's range (0 and 2**64-1, say) have no common integer type,
    so numpy rounds them to float64. Otherwise the floats, which the caller refuses."""
    values = np.asarray(data, dtype=object)
    if not all(isinstance(v, int) for v in values.flat):
        return floats
    info = np.iinfo(NUMPY_DTYPES[datatype])
    if min(values.flat) < info.min or max(values.flat) > info.max:
        raise OverflowError(f"values out of range for {datatype}")
    return values.astype(NUMPY_DTYPES[datatype])


def select_outputs(spec: ModelSpec, wanted: list[str] | None) -> list[str]:
    """The outputs to answer with (all when none are named); an unknown name is the client's error."""
    names = [t.name for t in spec.outputs]
    if wanted is None:
        return names
    for w in wanted:
        if w not in names:
            unknown = [w for w in wanted if w not in names]
            raise InvalidRequest(f"unknown output(s) {unknown}; model {spec.name!r} has {names}")
    return wanted
