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

import dataclasses
import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.protocol import v2_codec
from test_hardening_fuzz import (
    GRPC_CLIENT_CODES,
    V2Body,
    assert_still_serving,
    decode_v1,
    decode_v2,
    only_client_errors,
    post,
)

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
    "integer past 64 bits in shape": (
        b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,' + b"9" * 30 + b'],"data":[1]}]}',
        "'shape' must be a list of integers",
    ),
    # simdjson took a byte order mark, orjson refused it.
    "byte order mark": (b'\xef\xbb\xbf{"inputs":[' + GOOD_ITEM + b"]}", "byte order mark"),
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


# -- a JSON grammar with hostile productions ----------------------------------------------------------------
@dataclass(frozen=True)
class Raw:
    """A token written as is: valid JSON, or one of the hostile productions (`kind` says which)."""

    text: bytes
    kind: str | None = None


@dataclass(frozen=True)
class Arr:
    items: tuple[Node, ...]
    kind: str | None = None


@dataclass(frozen=True)
class Obj:
    pairs: tuple[tuple[bytes, Node], ...]  # pairs, not a dict: a key may repeat
    kind: str | None = None


Node = Raw | Arr | Obj


def render(node: Node, out: list[bytes], kinds: set[str]) -> None:
    if node.kind:
        kinds.add(node.kind)
    if isinstance(node, Raw):
        out.append(node.text)
    elif isinstance(node, Arr):
        out.append(b"[")
        for i, item in enumerate(node.items):
            if i:
                out.append(b",")
            render(item, out, kinds)
        out.append(b"]")
    else:
        names = [k for k, _ in node.pairs]
        if len(set(names)) != len(names):
            kinds.add("duplicate keys")
        out.append(b"{")
        for i, (key, value) in enumerate(node.pairs):
            out.append((b"," if i else b"") + key + b":")
            render(value, out, kinds)
        out.append(b"}")


def tagged(node: Node, kind: str) -> Node:
    return dataclasses.replace(node, kind=kind)


def raw(kind: str | None, *texts: bytes) -> st.SearchStrategy[Raw]:
    return st.sampled_from(texts).map(lambda t: Raw(t, kind))


def dumps(value: Any) -> Raw:
    return Raw(orjson.dumps(value))


HOSTILE_SCALARS: st.SearchStrategy[Raw] = st.one_of(
    st.integers(20, 400).map(lambda n: Raw(b"9" * n, "integer past 64 bits")),
    st.integers(20, 400).map(lambda n: Raw(b"-" + b"9" * n, "integer past 64 bits")),
    raw(
        "number past a double",
        b"1e999999",
        b"-1e400",
        b"1e-999999",
        b"123456789e123456789",
        b"0.1e+99999999999999999999",
    ),
    raw("NaN / Infinity", b"NaN", b"nan", b"Infinity", b"-Infinity", b"inf", b"-NaN"),
    raw("invalid number syntax", b"01", b"1.", b".5", b"+1", b"0x10", b"1e", b"-", b"1.2.3", b"1_000", b"--1", b"1e+"),
    raw(
        "invalid UTF-8", b'"\xff"', b'"\xc3\x28"', b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"a\x80b"'
    ),
    raw("lone surrogate escape", b'"\\ud800"', b'"\\udfff"', b'"\\ud800\\u0041"', b'"\\ud83d"'),
    raw("bad escape", b'"\\x41"', b'"\\u12"', b'"\\uZZZZ"', b'"\\"', b'"\\q"', b'"\\u"'),
    raw("raw control character", b'"a\x00b"', b'"\x01"', b'"\n"', b'"\t"', b'"\x1f"'),
    raw("bad literal", b"True", b"nul", b"undefined", b"None", b"tru", b"'single'", b"falsey"),
    st.integers(1, 10_000).map(lambda n: Raw(b'"' + b"x" * n, "unterminated string")),
)
GOOD_SCALARS: st.SearchStrategy[Raw] = st.one_of(
    st.none().map(dumps),
    st.booleans().map(dumps),
    st.integers(-(2**63), 2**64 - 1).map(dumps),
    st.floats(allow_nan=False, allow_infinity=False).map(dumps),
    st.text(max_size=12).map(dumps),
)
KEYS: st.SearchStrategy[bytes] = st.sampled_from(
    ["inputs", "outputs", "parameters", "id", "name", "datatype", "shape", "data", "binary_data_size", "instances"]
).map(orjson.dumps) | st.text(max_size=6).map(orjson.dumps)

#: Any JSON value: a small tree whose leaves may be hostile tokens.
ANY: st.SearchStrategy[Node] = st.recursive(
    GOOD_SCALARS | HOSTILE_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda xs: Arr(tuple(xs)))
        | st.lists(st.tuples(KEYS, inner), max_size=4).map(lambda ps: Obj(tuple(ps)))
    ),
    max_leaves=12,
)


@st.composite
def slot(draw: st.DrawFn, good: Node, position: str) -> Node:
    """A value at one position of the request schema: usually the right one, else any JSON value there
    (the wrong type) or a hostile token."""
    if draw(st.integers(0, 9)) < 7:
        return good
    return tagged(draw(ANY), f"wrong type at {position}")


@st.composite
def obj(draw: st.DrawFn, fields: list[tuple[str, Node]], position: str) -> Obj:
    """An object of the schema, each field in its slot; sometimes a field dropped, repeated or added."""
    pairs = [(orjson.dumps(k), draw(slot(v, f"{position}.{k}"))) for k, v in fields]
    for action in draw(st.lists(st.sampled_from(["drop", "repeat", "extra"]), max_size=2)):
        if action == "drop" and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))
        elif action == "repeat" and pairs:
            key, _ = pairs[draw(st.integers(0, len(pairs) - 1))]
            pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(ANY)))
        elif action == "extra":
            pairs.append((draw(KEYS), draw(ANY)))
    return Obj(tuple(pairs))


def ints(values: list[int]) -> Arr:
    return Arr(tuple(Raw(str(v).encode()) for v in values))


@st.composite
def numbers(draw: st.DrawFn, count: int, floats: bool) -> Arr:
    """`count` good numbers, a few of them (sometimes) hostile; sometimes nested."""
    good = [Raw(orjson.dumps(0.25 if floats else 7))] * count
    for _ in range(draw(st.integers(0, 2))):
        good[draw(st.integers(0, count - 1))] = draw(HOSTILE_SCALARS | GOOD_SCALARS)
    return Arr(tuple(good)) if draw(st.integers(0, 3)) else Arr((Arr(tuple(good)),), kind="nested data")


@st.composite
def v2_tree(draw: st.DrawFn) -> Obj:
    """A v2 infer request for textcls (or, now and then, resnet-mini), every position of it drawn by `slot`."""
    if draw(st.integers(0, 7)):
        n = draw(st.integers(1, 24))
        item = [
            ("name", dumps("input_ids")),
            ("datatype", dumps("INT64")),
            ("shape", ints([1, n])),
            ("data", draw(numbers(n, floats=False))),
        ]
    else:
        item = [
            ("name", dumps("image")),
            ("datatype", dumps("FP32")),
            ("shape", ints([1, 3, 64, 64])),
            ("data", draw(numbers(3 * 64 * 64, floats=True))),
        ]
    items = Arr(tuple(draw(st.lists(obj(item, "inputs[]"), min_size=1, max_size=2))))
    params = draw(obj([("priority", dumps(1)), ("timeout", dumps(10**7))], "parameters"))
    outputs = Arr(
        (draw(obj([("name", dumps("logits")), ("parameters", Obj(((b'"binary_data"', dumps(False)),)))], "outputs[]")),)
    )
    fields: list[tuple[str, Node]] = [("id", dumps("r1")), ("inputs", items)]
    fields += draw(st.sampled_from([[], [("parameters", params)], [("outputs", outputs)]]))
    return draw(obj(fields, "$"))


@st.composite
def v1_tree(draw: st.DrawFn) -> Obj:
    n = draw(st.integers(1, 24))
    instance = draw(slot(draw(numbers(n, floats=False)), "instances[]"))
    return draw(obj([("instances", Arr((instance,) * draw(st.integers(1, 3))))], "$"))


MUTATIONS = [
    "truncated",
    "byte deleted",
    "stray structural byte",
    "byte flipped",
    "byte order mark",
    "trailing garbage",
    "second document",
    "non-JSON whitespace",
    "empty body",
    *["deep nesting around", "deep nesting inside"] * 2,
]  # the class that was a 500: twice as often
DEPTHS = [1023, 1025, 5000, 100_000]


@st.composite
def mutated(draw: st.DrawFn, text: bytes, kinds: set[str]) -> bytes:
    """The rendered document, with 0-2 byte-level mutations (each named in `kinds`)."""
    for kind in draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)):
        kinds.add(kind)
        i = draw(st.integers(0, max(0, len(text) - 1)))
        if kind == "truncated":
            text = text[:i]
        elif kind == "byte deleted":
            text = text[:i] + text[i + 1 :]
        elif kind == "stray structural byte":
            text = text[:i] + draw(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b":", b",", b"\\"])) + text[i:]
        elif kind == "byte flipped" and text:
            text = text[:i] + bytes([text[i] ^ draw(st.integers(1, 255))]) + text[i + 1 :]
        elif kind == "deep nesting around":
            n = draw(st.sampled_from(DEPTHS))
            text = b"[" * n + text + (b"]" * n if draw(st.booleans()) else b"")
        elif kind == "deep nesting inside":
            n = draw(st.sampled_from(DEPTHS))
            opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
            at = text.find(b"[", i) if text.find(b"[", i) >= 0 else i
            text = text[:at] + opener * n + b"1" + closer * n + b"," + text[at:] if at else opener * n + closer * n
        elif kind == "byte order mark":
            text = b"\xef\xbb\xbf" + text
        elif kind == "trailing garbage":
            text += draw(st.sampled_from([b"x", b"\x00", b"}", b"]", b",", b"\xff"]))
        elif kind == "second document":
            text += b" " + text
        elif kind == "non-JSON whitespace":
            text = text[:i] + draw(st.sampled_from([b"\x0b", b"\x0c", b"\xc2\xa0", b"\xe2\x80\x8b"])) + text[i:]
        elif kind == "empty body":
            text = draw(st.sampled_from([b"", b" ", b"\n"]))
    return text


@dataclass(frozen=True)
class Body:
    protocol: str  # "v2" | "v1"
    text: bytes
    header_length: str | None
    kinds: frozenset[str]

    @property
    def may_time_out(self) -> bool:
        return self.protocol == "v2" and b'"timeout"' in self.text


@st.composite
def hostile_bodies(draw: st.DrawFn, protocol: str | None = None) -> Body:
    """A v2 (JSON or binary extension) or v1 body from the grammar, mutated, sometimes padded past the switch
    from orjson to simdjson."""
    protocol = protocol or draw(st.sampled_from(["v2", "v2", "v1"]))
    kinds: set[str] = set()
    out: list[bytes] = []
    render(draw(v2_tree() if protocol == "v2" else v1_tree()), out, kinds)
    text = draw(mutated(b"".join(out), kinds))
    if draw(st.integers(0, 3)) == 0:
        text += draw(st.sampled_from([b" ", b"\n", b"\t"])) * (v2_codec._SIMD_MIN_BYTES + 1)
        kinds.add("padded past the simdjson switch")
    header_length = None
    if protocol == "v2" and draw(st.integers(0, 4)) == 0:  # the binary extension: JSON header + tensor bytes
        blob = draw(st.binary(max_size=64))
        header_length = str(len(text) + draw(st.sampled_from([0, 0, -1, 1, -len(text), 10**6])))
        kinds.add("binary tensors" if header_length == str(len(text)) else "binary: wrong header length")
        if draw(st.booleans()) and blob:
            blob = blob[: draw(st.integers(0, len(blob) - 1))]
            kinds.add("binary: truncated tensor bytes")
        text += blob
    return Body(protocol, text, header_length, frozenset(kinds))


# -- in-process: both v2 readers and v1 refuse as the client's fault ---------------------------------------------
#: CI runs a fixed seed (derandomize); bench/fuzz.py --structure explores with a bigger budget.
STRUCTURE = settings(
    max_examples=400, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
STRUCTURE_LIVE = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


def check_in_process(body: Body, model: str = "textcls") -> None:
    """Decoding + validation raise nothing but RequestErrors below 500, each with a message."""

    def decode() -> None:
        try:
            if body.protocol == "v1":
                decode_v1(model, body.text)
            else:
                decode_v2(model, V2Body(body.text, body.header_length))
        except RequestError as exc:
            assert exc.message.strip(), body
            raise

    only_client_errors(decode)


@STRUCTURE
@given(body=hostile_bodies(), model=st.sampled_from(["textcls", "resnet-mini"]))
def test_hostile_structure_decodes_to_client_errors_only(body: Body, model: str) -> None:
    check_in_process(body, model)


# -- live: a real server, hostile bodies next to good traffic ------------------------------------------------------
@dataclass
class GoodTraffic:
    """A thread sending good v2 requests on its own keep-alive connection until stopped."""

    port: int
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        doc = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 8], "data": list(range(1, 9))}]}
        body = json.dumps(doc).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            start = time.perf_counter()
            conn.request("POST", "/v2/models/textcls/infer", body=body, headers={"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
            self.statuses[response.status] += 1
            self.seconds.append(time.perf_counter() - start)
            time.sleep(0.01)
        conn.close()


def check_live(port: int, body: Body, statuses: Counter[int]) -> None:
    path = "/v2/models/textcls/infer" if body.protocol == "v2" else "/v1/models/textcls:predict"
    headers = {} if body.header_length is None else {v2_codec.BINARY_HEADER: body.header_length}
    status, reply = post(port, path, body.text, headers)
    statuses[status] += 1
    assert status < 500 or (status == 504 and body.may_time_out), f"{status} {reply[:300]!r} for {sorted(body.kinds)}"
    if status >= 400:
        assert json.loads(reply)["error"].strip(), reply[:300]


def live_structure_fuzz(port: int, examples: int) -> tuple[Counter[int], Counter[str], GoodTraffic]:
    """Send `examples` hostile bodies while a good client runs alongside; return what came back."""
    statuses: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    good = GoodTraffic(port)
    thread = threading.Thread(target=good.run, daemon=True)
    thread.start()

    @settings(STRUCTURE_LIVE, max_examples=examples)
    @given(body=hostile_bodies())
    def one(body: Body) -> None:
        kinds.update(body.kinds or {"none (valid)"})
        check_live(port, body, statuses)

    try:
        one()
    finally:
        good.stop.set()
        thread.join(timeout=30)
    return statuses, kinds, good


def test_live_hostile_structure_is_4xx_next_to_good_traffic(server: tuple[int, int], demo_repository: Path) -> None:
    statuses, kinds, good = live_structure_fuzz(server[0], STRUCTURE_LIVE.max_examples)
    print(
        f"\nlive structure fuzz: {sum(statuses.values())} bodies, statuses {dict(statuses)}; "
        f"{len(kinds)} kinds of hostile structure: {dict(kinds.most_common())}; "
        f"good traffic alongside: {dict(good.statuses)}, max {max(good.seconds, default=0) * 1e3:.0f} ms"
    )
    assert sum(statuses.values()) >= STRUCTURE_LIVE.max_examples and not [s for s in statuses if s >= 500]
    assert statuses[400] > 0 and len(kinds) >= 20, (statuses, kinds)
    assert good.statuses and set(good.statuses) == {200}, good.statuses
    assert max(good.seconds) < 10, max(good.seconds)
    assert_still_serving(server, demo_repository)


# -- gRPC: hostile protobuf structure ---------------------------------------------------------------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


@st.composite
def hostile_protobuf(draw: st.DrawFn) -> tuple[bytes, str]:
    """A ModelInferRequest's bytes with hostile structure: nesting past the parser's recursion limit, groups
    never closed, varints past 64 bits, lengths past the end, wrong wire types for known fields."""
    kind = draw(
        st.sampled_from(
            [
                "deep nesting",
                "open groups",
                "long varint",
                "length past the end",
                "wrong wire type",
                "huge field number",
                "packed shape truncated",
            ]
        )
    )
    name = field_bytes(1, b"textcls")
    if kind == "deep nesting":
        depth = draw(st.sampled_from([101, 200, 5000]))
        inner = b""
        for _ in range(depth):
            inner = field_bytes(5, inner)  # inputs (field 5) nested in itself, as an unknown submessage
        return name + inner, kind
    if kind == "open groups":
        return name + varint(99 << 3 | 3) * draw(st.sampled_from([1, 200, 5000])), kind
    if kind == "long varint":
        return name + varint(5 << 3 | 0) + b"\xff" * draw(st.integers(10, 40)) + b"\x01", kind
    if kind == "length past the end":
        return name + varint(5 << 3 | 2) + varint(draw(st.sampled_from([10, 2**31, 2**63]))) + b"ab", kind
    if kind == "wrong wire type":
        return varint(1 << 3 | draw(st.sampled_from([0, 1, 5]))) + b"\x01" * 8, kind
    if kind == "huge field number":
        return name + varint((2**29 - 1) << 3 | 2) + varint(3) + b"abc", kind
    tensor = field_bytes(1, b"input_ids") + field_bytes(2, b"INT64") + varint(3 << 3 | 2) + varint(20) + b"\x01"
    return name + field_bytes(5, tensor), kind


def test_live_grpc_hostile_structure_is_invalid_argument(server: tuple[int, int], demo_repository: Path) -> None:
    codes: Counter[str] = Counter()
    with grpc.insecure_channel(f"127.0.0.1:{server[1]}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        @settings(STRUCTURE_LIVE, max_examples=100)
        @given(case=hostile_protobuf())
        def one(case: tuple[bytes, str]) -> None:
            data, kind = case
            try:
                call(data, timeout=30)
                codes["OK"] += 1
            except grpc.RpcError as err:
                assert err.code() in GRPC_CLIENT_CODES and err.details(), (kind, err.code(), err.details())
                codes[err.code().name] += 1

        one()
    print(f"\nlive gRPC structure fuzz: {dict(codes)}")
    assert codes["INVALID_ARGUMENT"] > 0, codes
    assert_still_serving(server, demo_repository)
