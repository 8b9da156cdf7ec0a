"""The v2 JSON reader: large bodies read numbers straight into arrays, with the same checks as lists."""

from __future__ import annotations

import json

import numpy as np
import pytest

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.protocol.v2_codec import decode
from batchpilot.runtime.tensors import RawInput, array_from_list


def body(datatype: str, shape: list[int], data: object) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}).encode()


def convert(request_body: bytes) -> np.ndarray:
    raw, data = decode(request_body, None).inputs[0]
    return array_from_list(raw, data)


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64"])
def test_large_float_bodies_match_the_list_path(datatype: str) -> None:
    values = np.random.default_rng(0).standard_normal((2, 3, 40, 40)).astype(np.float32)
    nested = convert(body(datatype, [2, 3, 40, 40], values.tolist()))
    flat = convert(body(datatype, [2, 3, 40, 40], values.reshape(-1).tolist()))
    assert decode(body(datatype, [2, 3, 40, 40], values.tolist()), None).inputs[0][1].__class__ is np.ndarray
    np.testing.assert_array_equal(nested, values.astype(nested.dtype))
    np.testing.assert_array_equal(flat, nested)


def test_large_integer_bodies_keep_their_checks() -> None:
    ids = list(range(3000))
    assert convert(body("INT64", [1, 3000], ids)).tolist() == [ids]
    assert convert(body("FP32", [1, 3000], ids)).dtype == np.float32  # ints are fine for floats
    with pytest.raises(InvalidRequest, match="cannot be INT64"):
        convert(body("INT64", [1, 3000], [0.5] * 3000))  # floats are not token ids
    with pytest.raises(InvalidRequest, match="out of range for INT8"):
        convert(body("INT8", [1, 3000], ids))
    with pytest.raises(InvalidRequest, match="values sent"):
        convert(body("INT64", [1, 3001], ids))
    with pytest.raises(InvalidRequest, match="does not fit INT64"):
        convert(body("INT64", [1, 3000], [*ids[:-1], "x"]))
    bools = convert(body("BOOL", [1, 3000], [True, False] * 1500))
    assert bools.dtype == np.bool_ and bools.sum() == 1500


def test_large_invalid_json_is_a_client_error() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode(body("FP32", [1, 3000], [1.0] * 3000)[:-5], None)
    with pytest.raises(InvalidRequest):
        array_from_list(RawInput("x", "FP32", (2,)), "nope")
