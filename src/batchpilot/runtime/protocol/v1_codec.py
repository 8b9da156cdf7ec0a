"""KServe v1 `:predict`: {"instances": [...]} in, {"predictions": [...]} out.

An instance is one item: a nested list for a single-input model, or an object keyed by input name.
For an NLP model each instance is one token sequence and is queued on its own, so the batcher can
group it with others of similar length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from batchpilot.spec.model import ModelSpec

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.hub import Decoded
from batchpilot.runtime.tensors import RawInput

MAX_INSTANCES = 4096


def decode(spec: ModelSpec, body: bytes) -> list[list[Decoded]]:
    """One request (list of decoded inputs) per group of instances that is queued together."""
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
    if spec.type == "nlp":
        name, datatype = spec.inputs[0].name, spec.inputs[0].datatype
        groups = []
        for seq in per_input[name]:
            if not isinstance(seq, list):
                raise InvalidRequest(f"input {name!r}: each instance must be a list of token ids")
            groups.append([(RawInput(name, datatype, (1, len(seq))), [seq])])
        return groups
    decoded: list[Decoded] = []
    for t in spec.inputs:
        values = per_input[t.name]
        item_shape = _nested_shape(values[0])
        if item_shape is None:
            raise InvalidRequest(f"input {t.name!r}: each instance must be a (nested) list of numbers")
        decoded.append((RawInput(t.name, t.datatype, (len(values), *item_shape)), values))
    return [decoded]


def _nested_shape(value: Any) -> tuple[int, ...] | None:
    """Shape of a nested list, read along its first elements (raggedness is caught on conversion)."""
    shape = []
    while isinstance(value, list):
        if not value:
            return None
        shape.append(len(value))
        value = value[0]
    return tuple(shape) if shape else None


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
