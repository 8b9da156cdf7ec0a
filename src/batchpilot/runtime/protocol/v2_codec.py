"""Open Inference Protocol v2 over REST: JSON bodies and Triton's binary tensor extension.

Binary tensors are read with `np.frombuffer` straight from the body, never through Python lists.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from itertools import chain
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
    flat numpy arrays (float64/int64/uint64; converted and range-checked later, like lists) where they are
    rectangular grids of numbers. Any other `data` stays a list, and the list path names what is wrong.

    Both readers give the same answer for the same document: a repeated key takes its last value (as
    orjson and Python's json do), a byte order mark is refused, and every way the text can fail to be
    JSON (syntax, depth past 1024, a number out of range, invalid UTF-8) is an InvalidRequest naming it.
    """
    if text[:3] == _BOM:
        raise InvalidRequest("request body is not valid JSON: it starts with a UTF-8 byte order mark (BOM)")
    if len(text) >= _SIMD_MIN_BYTES:
        try:
            return _from_simdjson(_simd_parse(bytes(text)), text)
        except (ValueError, RuntimeError, _OrjsonDecides):
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


class _OrjsonDecides(Exception):
    """simdjson's reading of the body might differ from orjson's (and the list path's): orjson reads it."""


class _RepeatedKey(_OrjsonDecides):
    """An object repeats a key: simdjson's lookup would take its first value, orjson takes the last."""


class _HiddenArray(_OrjsonDecides):
    """An innermost array of a numeric `data` may hold arrays, which `as_buffer` flattens unseen."""


def _fields(obj: Any) -> list[str]:
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise _RepeatedKey
    return keys


def _from_simdjson(root: Any, text: bytes) -> Any:
    if not isinstance(root, simdjson.Object):
        return _plain(root)
    doc = {key: _plain(root[key]) for key in _fields(root) if key != "inputs"}
    grid_arrays = 0
    if "inputs" in root:
        inputs = root["inputs"]
        if isinstance(inputs, simdjson.Array):
            doc["inputs"] = []
            for item in inputs:
                value, arrays = _input_item(item)
                doc["inputs"].append(value)
                grid_arrays += arrays
        else:
            doc["inputs"] = _plain(inputs)
    # `_grid` saw each array of a numeric `data` down to the innermost ones, but not inside those: a `[` there
    # (`[[1,2],[[3],4]]` is as good a grid of four numbers to `as_buffer` as `[[1,2],[3,4]]`) makes the text hold
    # more `[` than the grids and the rest of the document account for.
    if grid_arrays and _brackets(text) != grid_arrays + _brackets_outside_grids(doc, text):
        raise _HiddenArray
    return doc


def _brackets(text: bytes) -> int:
    """How many `[` the text holds (numpy compares many bytes at a time; bytes.count, one: 4x slower)."""
    return int(np.count_nonzero(np.frombuffer(text, dtype=np.uint8) == ord("[")))


def _brackets_outside_grids(doc: dict[str, Any], text: bytes) -> int:
    """The `[` that `text` should hold outside the grids (the flat arrays `_grid` made of `doc`'s numeric
    `data`): one per array of the rest of the document, and one per `[` in its strings.

    orjson writes each `[` of a string as is: where the text has no escape (no backslash), so does the text, and
    orjson's count is right. Elsewhere an escape may have written one (`\\u005b`) that the text does not hold:
    then only the arrays are counted, and a `[` written as is in a string makes the counts differ (orjson reads
    such a rare body)."""
    if b"\\" not in text:
        try:
            return orjson.dumps(doc, default=_grid_as_null).count(b"[")
        except orjson.JSONEncodeError:  # nested past orjson's depth limit for writing
            pass
    arrays = 0
    stack: list[Any] = [doc]
    while stack:
        value = stack.pop()
        if type(value) is list:
            arrays += 1
            stack.extend(value)
        elif type(value) is dict:
            stack.extend(value.values())
    return arrays


def _grid_as_null(value: Any) -> None:
    if not isinstance(value, np.ndarray):
        raise TypeError
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _input_item(item: Any) -> tuple[Any, int]:
    """The input as a plain object, with a numeric `data` as a flat array where `_grid` takes it, and the
    number of arrays that `data` was made of (0 when it stays a list)."""
    if not isinstance(item, simdjson.Object):
        return _plain(item), 0
    keys = _fields(item)
    out = {key: _plain(item[key]) for key in keys if key != "data"}
    datatype = out.get("datatype")
    if "data" not in keys:
        return out, 0
    data = item["data"]
    if isinstance(data, simdjson.Array) and isinstance(datatype, str) and datatype in _NUMERIC:
        grid = _grid(data, datatype)
        if grid is not None:
            out["data"], arrays = grid
            return out, arrays
    out["data"] = _plain(data)  # the list path names what is wrong with it, if anything
    return out, 0


def _grid(data: Any, datatype: str) -> tuple[np.ndarray, int] | None:
    """`data` as a flat array, and the number of arrays it is made of, when it is a rectangular grid of numbers
    that the list path would read to the same values; else None, and the list path decides (it names what is
    wrong: a ragged or empty array, a value that is not a number of this type).

    `as_buffer` flattens any nest of arrays, ragged or not, so the grid is checked here: each array at one depth
    has the length of the first one there. That the innermost arrays hold numbers only (`as_buffer` refuses any
    other value, but takes arrays) is for the caller to check, on the whole text."""
    kind: Literal["d", "i", "u"] = _BUFFER_TYPES.get(datatype, "i")
    try:
        flat = np.frombuffer(data.as_buffer(of_type=kind), dtype=_BUFFER_DTYPES[kind])
    except (TypeError, ValueError, RuntimeError):  # a value that is not a number of this kind
        return None
    sizes: list[int] = []
    first: Any = data
    while isinstance(first, simdjson.Array):
        if len(first) == 0:
            return None
        sizes.append(len(first))
        first = first[0]
    arrays, level = 0, [data]
    for depth, size in enumerate(sizes):
        try:
            lengths = list(map(len, level))
        except TypeError:  # a number where an array should be (`as_buffer` left only numbers and arrays)
            return None
        if lengths.count(size) != len(level):
            return None
        arrays += len(level)
        if depth + 1 < len(sizes):
            level = list(chain.from_iterable(level))
    return flat, arrays


def _shape(item: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = item.get("shape")
    if isinstance(shape, list):
        for d in shape:  # loops here and below, not generators: this runs for every request
            if not isinstance(d, int) or isinstance(d, bool):
                break
        else:
            return tuple(shape)
    raise InvalidRequest(f"input {name!r}: 'shape' must be a list of integers")


def _outputs(wanted: Any, binary_all: bool) -> tuple[list[str], set[str]]:
    """The names of the outputs `wanted` asks for, and those of them to answer in binary."""
    if not isinstance(wanted, list):
        raise InvalidRequest("'outputs' must be a list of objects with a 'name'")
    for o in wanted:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidRequest("'outputs' must be a list of objects with a 'name'")
    names: list[str] = []
    binary: set[str] = set()
    for o in wanted:
        params = o.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidRequest("an output's 'parameters' must be an object")
        names.append(o["name"])
        if binary_all or params.get("binary_data") is True:
            binary.add(o["name"])
    return names, binary


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
        request.outputs, request.binary_outputs = _outputs(wanted, binary_all)
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
