"""KServe v1 `:predict`: {"instances": [...]} in, {"predictions": [...]} out.

An instance is one item: a nested list for a single-input model, or an object keyed by input name.
The model's kind groups instances into requests (an NLP model queues each sequence on its own, so the
batcher can group it with others of similar length).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import simdjson

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.kinds import StackedKind, kind_for
from batchpilot.runtime.protocol.v2_codec import _simd_parse
from batchpilot.runtime.tensors import Decoded, RawInput
from batchpilot.spec.model import ModelSpec

MAX_INSTANCES = 4096


#: Datatypes whose instances may be read straight into a float64 buffer (then converted as JSON lists are).
_FLOAT_TYPES = {"FP16", "FP32", "FP64"}
_FAST_MIN_BYTES = 4096
_EXACT = float(2**53)


def _fast_instances(spec: ModelSpec, body: bytes) -> list[list[Decoded]] | None:
    """The common large request, `{"instances": [...]}` of float items for a single-input model whose kind stacks
    all instances into one request, read by simdjson into one flat float64 array: no Python float per value.

    Taken only when the answer is certain to be the one the general path gives: the body has no other key,
    every array has the length its first sibling implies (a ragged or irregularly nested body goes the general
    way, which names the problem), every leaf is a number, and the body holds no array beyond those counted.
    Anything else (None) goes the general way."""
    if len(body) < _FAST_MIN_BYTES or len(spec.inputs) != 1 or spec.inputs[0].datatype not in _FLOAT_TYPES:
        return None
    kind = kind_for(spec)
    if type(kind).v1_groups is not StackedKind.v1_groups:
        return None
    try:
        root = _simd_parse(bytes(body))
        if not isinstance(root, simdjson.Object) or list(root.keys()) != ["instances"]:
            return None
        instances = root["instances"]
        if not isinstance(instances, simdjson.Array) or not 0 < len(instances) <= MAX_INSTANCES:
            return None
        shape = [len(instances)]
        first: Any = instances
        while True:
            first = first[0]
            if not isinstance(first, simdjson.Array):
                break
            if len(first) == 0:
                return None
            shape.append(len(first))
        if len(shape) < 2:
            return None
        arrays, level = 0, [instances]
        for depth, size in enumerate(shape):
            arrays += len(level)
            if depth == len(shape) - 1:
                if any(len(a) != size for a in level):
                    return None
                break
            children: list[Any] = []
            for a in level:  # a non-array here fails len() or, below, as_buffer (numbers and arrays only)
                if len(a) != size:
                    return None
                children.extend(a)
            level = children
        if body.count(b"[") != arrays:  # an array nested inside a leaf array (its numbers would be flattened)
            return None
        data = np.frombuffer(instances.as_buffer(of_type="d"), dtype=np.float64)
    except (ValueError, TypeError, RuntimeError, IndexError):
        return None
    if data.size != math.prod(shape):
        return None
    # An integer past 2**53 is not exact as a float64 (and one past 64 bits is refused by the general path).
    if data.size and np.abs(data).max() >= _EXACT:
        return None
    t = spec.inputs[0]
    return [[(RawInput(t.name, t.datatype, tuple(shape)), data)]]


def decode(spec: ModelSpec, body: bytes) -> list[list[Decoded]]:
    """One request (list of decoded inputs) per group of instances that is queued together."""
    fast = _fast_instances(spec, body)
    if fast is not None:
        return fast
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    instances = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("v1 requests need a non-empty 'instances' list")
    if len(instances) > MAX_INSTANCES:
        raise InvalidRequest(f"{len(instances)} instances exceed the limit of {MAX_INSTANCES}")
    per_input: dict[str, list[Any]] = {t.name: [] for t in spec.inputs}
    for instance in instances:
        if len(spec.inputs) == 1 and not isinstance(instance, dict):
            instance = {spec.inputs[0].name: instance}
        if not isinstance(instance, dict) or set(instance) != set(per_input):
            raise InvalidRequest(f"each instance must give exactly the inputs {sorted(per_input)}")
        for name, value in instance.items():
            per_input[name].append(value)
    return kind_for(spec).v1_groups(per_input)


def encode(spec: ModelSpec, results: list[dict[str, np.ndarray]]) -> bytes:
    predictions: list[Any] = []
    for outputs in results:
        n = next(iter(outputs.values())).shape[0]
        for i in range(n):
            if len(outputs) == 1:
                predictions.append(next(iter(outputs.values()))[i])
            else:
                predictions.append({name: a[i] for name, a in outputs.items()})
    return orjson.dumps({"predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY)
