"""The two JSON readers of the v2 codec give every body the same verdict and the same message.

`load_json` reads a body under `_SIMD_MIN_BYTES` with orjson and a larger one with simdjson, which reads a
numeric input's `data` straight into a flat array (so the list path's checks never see its nesting). Each bad
`data` here goes both ways: a small body as it is and padded with whitespace past the switch (the same
document: whitespace counts toward the size), and a large tensor with one defect as it is and with the switch
moved out of reach (orjson then reads it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.protocol import v2_codec
from batchpilot.runtime.tensors import array_from_list

SWITCH = v2_codec._SIMD_MIN_BYTES


def body(datatype: str, shape: list[int], data: str | bytes) -> bytes:
    """A one-input v2 body; `data` is JSON text, so that it may hold what `json.dumps` does not write."""
    text = data.encode() if isinstance(data, str) else data
    head = json.dumps({"name": "x", "datatype": datatype, "shape": shape}, separators=(",", ":"))[:-1].encode()
    return b'{"inputs":[' + head + b',"data":' + text + b"}]}"


def padded(text: bytes) -> bytes:
    """The same document, long enough for simdjson."""
    return text + b" " * max(0, SWITCH - len(text))


def outcome(text: bytes) -> tuple[int, str] | list[np.ndarray]:
    """What the server makes of the body's JSON data: the arrays, or the refusal's status and message."""
    try:
        request = v2_codec.decode(text, None)
        return [array_from_list(raw, data) for raw, data in request.inputs]
    except RequestError as exc:
        return exc.status, exc.message


def by_orjson(text: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str] | list[np.ndarray]:
    with monkeypatch.context() as patch:
        patch.setattr(v2_codec, "_SIMD_MIN_BYTES", len(text) + 1)
        return outcome(text)


def assert_same(small: tuple[int, str] | list[np.ndarray], large: tuple[int, str] | list[np.ndarray]) -> None:
    """The same refusal, or the same arrays."""
    verdicts = [got if isinstance(got, tuple) else "accepted" for got in (small, large)]
    assert verdicts[0] == verdicts[1]
    if isinstance(small, list) and isinstance(large, list):
        assert len(small) == len(large)
        for a, b in zip(small, large, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


# (datatype, shape, data as JSON text, words the 400's message must hold)
REFUSED = {
    "ragged, right count": ("FP32", [1, 5], "[[1,2,3],[4,5]]", "ragged"),
    "ragged, rows balance": ("FP32", [3, 2], "[[1,2],[3,4,5],[6]]", "ragged"),
    "ragged, short": ("INT64", [2, 3], "[[1,2,3],[4,5]]", "ragged"),
    "ragged, deeper": ("FP32", [1, 2, 2, 2], "[[[1,2],[3,4]],[[5,6],[7]]]", "ragged"),
    "number beside a list": ("FP32", [1, 3], "[1,[2,3]]", "ragged"),
    "list in a row": ("FP32", [2, 2], "[[1,2],[[3],4]]", "ragged"),
    "lists in a row that balance": ("INT64", [2, 2], "[[1,[]],[[2,3],4]]", "ragged"),
    "empty row": ("FP32", [1, 2], "[[],[1,2]]", "ragged"),
    "empty data": ("FP32", [1, 1], "[]", "0 values sent"),
    "empty nested data": ("INT64", [1, 1], "[[]]", "0 values sent"),
    "too few values": ("FP32", [1, 4], "[1,2,3]", "3 values sent"),
    "too many values": ("FP32", [1, 2], "[1,2,3]", "3 values sent"),
    "too many values, nested": ("FP32", [1, 2], "[[1,1],[2,2],[3,3]]", "6 values sent"),
    "nesting deeper than the shape, too many": ("FP32", [2, 2], "[[[1,2],[3,4]],[[5,6],[7,8]]]", "8 values sent"),
    "too many values and out of range": ("INT8", [1, 2], "[[1,2],[3,300]]", "4 values sent"),
    "string in FP32": ("FP32", [1, 2], '[1,"2"]', "does not fit FP32"),
    "string in INT64": ("INT64", [1, 2], '[[1,"x"]]', "does not fit INT64"),
    "null in FP32": ("FP32", [1, 2], "[1,null]", "does not fit FP32"),
    "object in FP32": ("FP32", [1, 2], '[1,{"a":1}]', "does not fit FP32"),
    "float in INT64": ("INT64", [1, 2], "[1,2.5]", "cannot be INT64"),
    "float in UINT64": ("UINT64", [1, 2], "[1,2.0]", "cannot be UINT64"),
    "INT8 out of range": ("INT8", [1, 2], "[1,300]", "out of range for INT8"),
    "UINT8 negative": ("UINT8", [1, 2], "[1,-1]", "out of range for UINT8"),
    "UINT64 negative": ("UINT64", [1, 2], "[1,-1]", "out of range for UINT64"),
    "INT64 past its range": ("INT64", [1, 1], "[9223372036854775808]", "out of range for INT64"),
    "FP16 overflow, integer": ("FP16", [1, 2], "[1,70000]", "overflow"),
    "FP16 overflow, float": ("FP16", [1, 2], "[1,70000.5]", "overflow"),
    "FP32 overflow": ("FP32", [1, 2], "[1,1e39]", "overflow"),
    "NaN": ("FP32", [1, 2], "[1,NaN]", "not valid JSON"),
    "Infinity": ("FP32", [1, 2], "[1,-Infinity]", "not valid JSON"),
    "number past a double": ("FP64", [1, 2], "[1,1e400]", "not valid JSON"),
    "numbers in BOOL": ("BOOL", [1, 2], "[1,0]", "BOOL data must be true/false"),
    "BYTES": ("BYTES", [1, 2], '["a","b"]', "unsupported datatype 'BYTES'"),
    "data not a list": ("FP32", [1, 1], "1.5", "'data' must be a list"),
    "data an object": ("FP32", [1, 1], '{"a":[1]}', "'data' must be a list"),
}

#: Accepted by both readers, with the same values (not every one of them is a good idea, but both agree).
ACCEPTED = {
    "flat": ("FP32", [2, 3], "[1,2,3,4,5,6.5]"),
    "nested as the shape": ("INT64", [2, 3], "[[1,2,3],[4,5,6]]"),
    "nested otherwise than the shape": ("FP32", [2, 3], "[[1,2],[3,4],[5,6]]"),
    "nested deeper than the shape": ("FP32", [1, 4], "[[[1],[2]],[[3],[4]]]"),
    "integers in FP16": ("FP16", [1, 3], "[1,2049,65504]"),
    "integers past 2**53 in FP32": ("FP32", [1, 2], "[9007199791611905,-9007199791611905]"),
    "integers past 2**53 in FP64": ("FP64", [1, 2], "[9007199254740993,18446744073709551615]"),
    "UINT64 past INT64": ("UINT64", [1, 2], "[0,18446744073709551615]"),
    "booleans in FP32": ("FP32", [1, 2], "[true,1.5]"),
    "booleans in INT64": ("INT64", [1, 2], "[true,false]"),
    "BOOL": ("BOOL", [1, 2], "[true,false]"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_small_body_is_refused_alike_when_padded_past_the_switch(case: str) -> None:
    datatype, shape, data, words = REFUSED[case]
    small = body(datatype, shape, data)
    assert len(small) < SWITCH <= len(padded(small))
    got = outcome(small)
    assert isinstance(got, tuple), f"{case}: accepted"
    assert got[0] == 400 and words in got[1], got
    assert outcome(padded(small)) == got


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_a_good_small_body_reads_alike_when_padded_past_the_switch(case: str) -> None:
    datatype, shape, data = ACCEPTED[case]
    small = body(datatype, shape, data)
    got = outcome(small)
    assert not isinstance(got, tuple), got
    assert_same(got, outcome(padded(small)))


# -- a large tensor with one defect: simdjson reads it as it is, orjson with the switch out of reach ----------
IMAGE = [1, 3, 64, 64]


def image_rows() -> list[list[str]]:
    """The 192 rows of a 1x3x64x64 image, each value as JSON text."""
    values = np.round(np.random.default_rng(0).standard_normal(IMAGE), 3).reshape(-1, IMAGE[-1])
    return [[repr(float(v)) for v in row] for row in values]


def image_body(rows: list[list[str]], datatype: str = "FP32") -> bytes:
    channels = [rows[c * 64 : (c + 1) * 64] for c in range(3)]
    data = "[[" + ",".join("[" + ",".join("[" + ",".join(r) + "]" for r in ch) + "]" for ch in channels) + "]]"
    return body(datatype, IMAGE, data)


def defect(name: str) -> list[list[str]]:
    rows = image_rows()
    if name == "a row one short":
        rows[5].pop()
    elif name == "rows one short and one long":
        rows[7].append(rows[5].pop())
    elif name == "a value in a list":
        rows[100][3] = f"[{rows[100][3]}]"
    elif name == "an empty list and a pair that balance":
        rows[100][3], rows[150][9] = "[]", f"[{rows[150][9]},0.5]"  # every row 64 long, 12288 numbers
    elif name == "a string":
        rows[191][63] = '"0.5"'
    elif name == "a boolean":
        rows[0][0] = "true"
    elif name == "null":
        rows[64][1] = "null"
    elif name == "an integer past 2**53":
        rows[3][3] = "9007199791611905"
    elif name == "a value past FP32":
        rows[3][3] = "3.5e38"
    return rows


LARGE = [
    "none",
    "a row one short",
    "rows one short and one long",
    "a value in a list",
    "an empty list and a pair that balance",
    "a string",
    "a boolean",
    "null",
    "an integer past 2**53",
    "a value past FP32",
]


@pytest.mark.parametrize("case", LARGE)
def test_a_large_tensor_reads_alike_in_both_readers(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = image_body(defect(case))
    assert len(text) >= SWITCH
    large = outcome(text)
    assert_same(by_orjson(text, monkeypatch), large)
    if case in ("a row one short", "rows one short and one long", "a value in a list"):
        assert isinstance(large, tuple) and large[0] == 400 and "ragged" in large[1], large
    elif case in ("none", "an integer past 2**53", "a boolean"):
        assert not isinstance(large, tuple), large
    else:
        assert isinstance(large, tuple) and large[0] == 400, large


def test_good_large_bodies_still_take_the_buffer_path() -> None:
    """The checks send nothing good the slow way: a nested image and a flat token list both come out flat, and
    so they do beside a `[` or an escape in a string, or a parameter nested past orjson's writing depth."""
    image = image_body(image_rows())
    deep = b'{"parameters":{"deep":' + b"[" * 300 + b"]" * 300 + b"}," + image[1:]
    for text in (
        image,
        body("INT64", [1, 3000], json.dumps(list(range(3000)))),
        image.replace(b'"name":"x"', b'"name":"x[0]"'),
        image.replace(b'"name":"x"', b'"name":"x\\u00e9"'),
        deep,
    ):
        (_, data), *_ = v2_codec.decode(text, None).inputs
        assert isinstance(data, np.ndarray) and data.ndim == 1, text[:80]
        assert not isinstance(outcome(text), tuple)


def test_brackets_in_strings_do_not_hide_a_list() -> None:
    """The count of `[` that shows no list hides in a row is not fooled by one in a string, as is or escaped."""
    rows = image_rows()
    rows[100][3] = f"[{rows[100][3]}]"
    for name in (b"x[", b"x\\u005b", b"x\\u005B"):
        got = outcome(image_body(rows).replace(b'"name":"x"', b'"name":"' + name + b'"'))
        assert isinstance(got, tuple) and "ragged" in got[1], got


# -- any nest of numbers and lists: both readers agree ------------------------------------------------------------
NESTS = st.recursive(
    st.sampled_from(["1", "2.5", "-3", "[]"]),
    lambda inner: st.lists(inner, min_size=0, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(
    data=NESTS.filter(lambda s: s.startswith("[")),
    datatype=st.sampled_from(["FP32", "INT64", "UINT8"]),
    shape=st.sampled_from([[1, 4], [2, 2], [1, 2, 2], [1, 6], [3, 2]]),
)
def test_any_nest_of_lists_reads_alike_in_both_readers(data: str, datatype: str, shape: list[int]) -> None:
    small = body(datatype, shape, data)
    assert_same(outcome(small), outcome(padded(small)))
