"""Hostile JSON *structure*: every way a body can fail to be JSON, or be JSON of the wrong shape, is a 4xx.

tests/test_hardening_fuzz.py generates valid JSON with wrong content; this file generates the text itself
from a JSON grammar (valid, nearly valid and hostile documents: truncation, duplicate keys, nesting far
past any parser's depth limit, numbers past 64 bits or past a double, NaN/Infinity, invalid UTF-8, lone
surrogates, byte order marks, control characters, wrong types at every position of the v1/v2 schema),
and checks both JSON readers of the v2 codec (orjson for small bodies, simdjson for large ones: every
document is also sent padded past the switch) and v1. Live, the same bodies go to a real server next to
good traffic: only 4xx, a message in every answer, good requests answered, the server still ready.
`bench/fuzz.py --structure` runs the same properties with a much larger budget.
"""

from __future__ import annotations

import pytest

from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.protocol import v2_codec
from test_hardening_fuzz import V2Body, decode_v1, decode_v2

GOOD_ITEM = b'{"name":"input_ids","datatype":"INT64","shape":[1,2],"data":[1,2]}'
PAD = b" " * (v2_codec._SIMD_MIN_BYTES + 1)  # whitespace past the switch: the same document, read by simdjson


def wrap(data: bytes) -> bytes:
    return b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,1],"data":' + data + b"}]}"


#: Bodies that once reached the 500 handler, or that the two readers of the v2 codec answered differently.
REGRESSIONS = {
    # simdjson raises RuntimeError (not ValueError) for these: they were answered 500 "internal error".
    "nested 100k deep, closed": (b"[" * 100_000 + b"]" * 100_000, "depth limit exceeded"),
    "nested 5000 deep in data": (wrap(b"[" * 5000 + b"1" + b"]" * 5000), "depth limit exceeded"),
    "objects nested 5000 deep": (b'{"a":' * 5000 + b"1" + b"}" * 5000, "depth limit exceeded"),
    "integer past 64 bits in data": (wrap(b"[" + b"9" * 30 + b"]"), "cannot be INT64"),
    "integer past 64 bits in shape": (b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,' + b"9" * 30
                                      + b'],"data":[1]}]}', "'shape' must be a list of integers"),
    # simdjson took a byte order mark, orjson refused it.
    "byte order mark": (b"\xef\xbb\xbf{\"inputs\":[" + GOOD_ITEM + b"]}", "byte order mark"),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
@pytest.mark.parametrize("padded", [False, True], ids=["orjson", "simdjson"])
def test_malformed_structure_is_a_client_error_naming_it(name: str, padded: bool) -> None:
    body, words = REGRESSIONS[name]
    with pytest.raises(RequestError) as refused:
        decode_v2("textcls", V2Body(body + PAD if padded else body, None))
    assert refused.value.status == 400, refused.value.message
    assert refused.value.message
    assert words in refused.value.message, refused.value.message


def test_integer_past_64_bits_reads_the_same_in_both_readers() -> None:
    """orjson reads it as a float; simdjson refused it (BIGINT_ERROR, a 500): now it defers to orjson."""
    body = b'{"id":' + b"9" * 30 + b',"inputs":[' + GOOD_ITEM + b"]}"
    assert v2_codec.decode(body, None).id == v2_codec.decode(body + PAD, None).id == "1e+30"


@pytest.mark.parametrize("padded", [False, True], ids=["orjson", "simdjson"])
def test_repeated_key_takes_its_last_value_in_both_readers(padded: bool) -> None:
    """{"inputs": [], "inputs": [good]} is good for both readers (simdjson's get() returned the first)."""
    body = b'{"inputs":[],"inputs":[' + GOOD_ITEM.replace(b'"data":[1,2]', b'"data":"x","data":[1,2]') + b"]}"
    decode_v2("textcls", V2Body(body + PAD if padded else body, None))
    decode_v1("textcls", b'{"instances":[],"instances":[[1,2]]}')
