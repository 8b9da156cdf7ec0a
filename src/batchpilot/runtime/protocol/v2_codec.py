"""Open Inference Protocol v2 over REST: JSON bodies and Triton's binary tensor extension.

Binary tensors are read with `np.frombuffer` straight from the body, never through Python lists.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.tensors import DATATYPE_OF, NUMPY_DTYPES, Decoded, RawInput
from batchpilot.spec.model import ModelSpec

BINARY_HEADER = "inference-header-content-length"


@dataclass
class V2Request:
    id: str
    inputs: list[Decoded]
    priority: int = 0
    timeout_us: int | None = None
    outputs: list[str] | None = None  # None: all outputs
    binary_outputs: set[str] = field(default_factory=set)


def _int_param(params: dict[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"parameter {key!r} must be an integer")
    return value


# simdjson reads a JSON array of numbers straight into a machine buffer: for a 64x64 RGB image sent as
# JSON that halves decoding (no Python float per value). Small bodies gain nothing and take orjson.
_SIMD_MIN_BYTES = 8192
# Other integer types read as int64.
_BUFFER_TYPES: dict[str, Literal["d", "i", "u"]] = {"FP16": "d", "FP32": "d", "FP64": "d", "UINT64": "u"}
_BUFFER_DTYPES = {"d": np.float64, "i": np.int64, "u": np.uint64}
_NUMERIC = {name for name in NUMPY_DTYPES if name != "BOOL"}


_BOM = b"\xef\xbb\xbf"


def load_json(text: bytes) -> Any:
    """The body as Python objects, except that a large body's numeric input `data` arrays come back as
    flat numpy arrays (float64/int64/uint64; converted and range-checked later, like lists).

    Both readers give the same answer for the same document: a repeated key takes its last value (as
    orjson and Python's json do), a byte order mark is refused, and every way the text can fail to be
    JSON (syntax, depth past 1024, a number out of range, invalid UTF-8) is an InvalidRequest naming it.
    """
    if text[:3] == _BOM:
        raise InvalidRequest("request body is not valid JSON: it starts with a UTF-8 byte order mark (BOM)")
    if len(text) >= _SIMD_MIN_BYTES:
        try:
            return _from_simdjson(_simd_parse(bytes(text)))
        except (ValueError, RuntimeError, _RepeatedKey):
            # simdjson raises ValueError for syntax and encoding errors, but RuntimeError for a document
            # nested too deep (DEPTH_ERROR) or an integer past 64 bits (BIGINT_ERROR, which orjson reads as
            # a float): that was a 500. orjson has the last word on any body simdjson does not take, so
            # both readers agree on every body (and a repeated key keeps its last value, as in orjson).
            pass
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


_local = threading.local()
_REUSE_REFUSED = "Tried to re-use a parser"


def _simd_parse(text: bytes) -> Any:
    """`text` parsed by this thread's own simdjson parser. A parser's first document allocates its buffers
    (for a 78 KB body that cost twice the parse itself), so each thread keeps one. Nothing from a document
    outlives `load_json` (every value is copied out), and simdjson refuses to reuse a parser whose document
    is still referenced rather than corrupt it: then a fresh parser takes over."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        return parser.parse(text)
    except RuntimeError as exc:
        if not str(exc).startswith(_REUSE_REFUSED):
            raise
        parser = _local.parser = simdjson.Parser()
        return parser.parse(text)


class _RepeatedKey(Exception):
    """An object repeats a key: simdjson's lookup would take its first value, orjson takes the last."""


def _fields(obj: Any) -> list[str]:
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise _RepeatedKey
    return keys


def _from_simdjson(root: Any) -> Any:
    if not isinstance(root, simdjson.Object):
        return _plain(root)
    doc = {key: _plain(root[key]) for key in _fields(root) if key != "inputs"}
    if "inputs" in root:
        inputs = root["inputs"]
        doc["inputs"] = [_input_item(item) for item in inputs] if isinstance(inputs, simdjson.Array) else _plain(inputs)
    return doc


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _input_item(item: Any) -> Any:
    if not isinstance(item, simdjson.Object):
        return _plain(item)
    keys = _fields(item)
    out = {key: _plain(item[key]) for key in keys if key != "data"}
    datatype = out.get("datatype")
    if "data" not in keys:
        return out
    data = item["data"]
    if isinstance(data, simdjson.Array) and isinstance(datatype, str) and datatype in _NUMERIC:
        kind: Literal["d", "i", "u"] = _BUFFER_TYPES.get(datatype, "i")
        try:
            out["data"] = np.frombuffer(data.as_buffer(of_type=kind), dtype=_BUFFER_DTYPES[kind])
            return out
        except (TypeError, ValueError, RuntimeError):  # mixed or wrong-typed values: the list path names the problem
            pass
    out["data"] = _plain(data)
    return out


def _shape(item: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidRequest(f"input {name!r}: 'shape' must be a list of integers")
    return tuple(shape)


def decode(body: bytes, header_length: str | None) -> V2Request:
    """Parse a v2 infer request body (JSON, or JSON header + binary tensors)."""
    if header_length is not None:
        try:
            json_len = int(header_length)
        except ValueError:
            raise InvalidRequest("Inference-Header-Content-Length must be an integer") from None
        if not 0 < json_len <= len(body):
            raise InvalidRequest(f"Inference-Header-Content-Length {json_len} outside the body ({len(body)} bytes)")
        header, blob = body[:json_len], memoryview(body)[json_len:]
    else:
        header, blob = body, memoryview(b"")
    doc = load_json(header)
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise InvalidRequest("'inputs' must be a non-empty list")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("'parameters' must be an object")
    offset = 0
    inputs: list[Decoded] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each input must be an object with a string 'name'")
        name = item["name"]
        datatype = item.get("datatype")
        if not isinstance(datatype, str) or datatype not in NUMPY_DTYPES:
            raise InvalidRequest(f"input {name!r}: unsupported datatype {datatype!r}")
        raw = RawInput(name, datatype, _shape(item, name))
        item_params = item.get("parameters") or {}
        size = item_params.get("binary_data_size") if isinstance(item_params, dict) else None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(blob):
                raise InvalidRequest(f"input {name!r}: binary_data_size {size!r} does not fit the body")
            inputs.append((raw, blob[offset : offset + size]))
            offset += size
        elif "data" in item:
            inputs.append((raw, item["data"]))
        else:
            raise InvalidRequest(f"input {name!r} has neither 'data' nor binary_data_size")
    if offset != len(blob):
        raise InvalidRequest(f"{len(blob) - offset} bytes of binary data belong to no input")
    request = V2Request(
        id=str(doc.get("id", "")),
        inputs=inputs,
        priority=_int_param(params, "priority") or 0,
        timeout_us=_int_param(params, "timeout"),
    )
    binary_all = params.get("binary_data_output") is True
    wanted = doc.get("outputs")
    if wanted is not None:
        if not isinstance(wanted, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted
        ):
            raise InvalidRequest("'outputs' must be a list of objects with a 'name'")
        if not all(isinstance(o.get("parameters") or {}, dict) for o in wanted):
            raise InvalidRequest("an output's 'parameters' must be an object")
        request.outputs = [o["name"] for o in wanted]
        request.binary_outputs = {
            o["name"] for o in wanted if binary_all or (o.get("parameters") or {}).get("binary_data") is True
        }
    elif binary_all:
        request.binary_outputs = {"*"}
    return request


def encode(spec: ModelSpec, request: V2Request, outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers (binary extension when any output is binary). `outputs` are
    the ones the request asked for, in order (the hub selected them)."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, output in outputs.items():
        array = np.ascontiguousarray(output)
        entry: dict[str, Any] = {"name": name, "datatype": DATATYPE_OF[array.dtype], "shape": list(array.shape)}
        if "*" in request.binary_outputs or name in request.binary_outputs:
            # A view of the output batch's rows: the one copy is the join below.
            entry["parameters"] = {"binary_data_size": array.nbytes}
            blobs.append(array.reshape(-1).data.cast("B"))
        else:
            entry["data"] = array.reshape(-1)
        entries.append(entry)
    doc = {"model_name": spec.name, "model_version": "1", "id": request.id, "outputs": entries}
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, {"content-type": "application/json"}
    return b"".join([header, *blobs]), {
        "content-type": "application/octet-stream",
        BINARY_HEADER: str(len(header)),
    }
