"""Hostile input: fuzzed REST bodies and gRPC messages only ever fail as the client's fault.

In-process, the decoding + validation path (everything a request passes before it may be queued) must
raise nothing but `RequestError`s below 500, and allocate nothing in proportion to the shape a request
*claims*. Live, a real server must answer fuzzed traffic without a 5xx / INTERNAL / UNKNOWN and stay
ready. `bench/fuzz.py` runs the same properties with a much larger budget.
"""

from __future__ import annotations

import http.client
import json
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from prometheus_client import CollectorRegistry

from batchpilot.runtime.demo_models import MAX_LENGTH, image_spec, text_spec
from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.hub import HostedModel, ModelHub
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol import grpc_codec, grpc_frontend, v1_codec, v2_codec
from batchpilot.runtime.tensors import NUMPY_DTYPES, select_outputs
from batchpilot.spec.model import ModelSpec
from reference import expected, nlp_inputs

SPECS: dict[str, ModelSpec] = {s.name: s for s in (image_spec(), text_spec())}
HUB = ModelHub(RuntimeMetrics(CollectorRegistry()))
for _spec in SPECS.values():
    HUB.add(HostedModel(_spec.name, _spec, batcher=None))  # lookup only: nothing is queued in-process
#: Decoding a request of a few kB may use a few MB of scratch (Python lists, numpy copies), never more:
#: an allocation driven by a claimed shape (10^12 elements) would blow far past this.
ALLOCATION_LIMIT = 16 * 1024 * 1024
#: Status codes a fuzzed gRPC call may end with: the client's fault, or "try later". Never INTERNAL/UNKNOWN.
GRPC_CLIENT_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
IN_PROCESS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
LIVE = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))

# -- strategies ---------------------------------------------------------------------------------------
INT64 = st.integers(-(2**63), 2**63 - 1)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
#: Dimensions: plausible ones, zero/negative, and the huge claims a request must never be able to make us allocate.
dim = st.integers(-3, 300) | st.sampled_from([10**12, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)])
names = st.sampled_from(["image", "input_ids", "x"]) | st.text(max_size=6)
datatypes = st.sampled_from([*NUMPY_DTYPES, "BYTES", "fp32", ""])
numbers = st.lists(
    st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.booleans(), max_size=48
)
output_names = st.sampled_from(["logits", "token_scores", "nope"])
header_text = st.text(st.characters(min_codepoint=33, max_codepoint=255), max_size=6)  # what HTTP headers can carry
params_doc = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(-2, 3) | json_any,
        "timeout": st.integers(-5, 10**7) | json_any,
        "binary_data_output": json_any,
    },
)


@st.composite
def near_valid_items(draw: st.DrawFn) -> dict[str, Any]:
    """An input that a demo model would take, then (usually) broken in one or two places."""
    if draw(st.booleans()):
        n = draw(st.integers(1, 3))
        item = {"name": "image", "datatype": "FP32", "shape": [n, 3, 64, 64], "data": [0.25] * (n * 3 * 64 * 64)}
    else:
        ids = draw(st.lists(st.integers(-5, 9000), min_size=1, max_size=MAX_LENGTH + 4))
        item = {"name": "input_ids", "datatype": "INT64", "shape": [1, len(ids)], "data": ids}
    for key in draw(st.lists(st.sampled_from(["name", "datatype", "shape", "data", "drop"]), max_size=2)):
        if key == "drop":
            item.pop(draw(st.sampled_from(sorted(item))), None)
        else:
            item[key] = draw(
                {"name": names, "datatype": datatypes, "shape": st.lists(dim, max_size=6), "data": numbers | json_any}[
                    key
                ]
            )
    return item


wild_items = st.fixed_dictionaries(
    {"name": names | json_any, "datatype": datatypes | json_any, "shape": st.lists(dim, max_size=6) | json_any},
    optional={
        "data": numbers | st.lists(numbers, max_size=3) | json_any,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-5, 300) | json_any})
        | json_any,
    },
)
v2_documents = (
    st.fixed_dictionaries(
        {"inputs": st.lists(near_valid_items() | wild_items, max_size=3) | json_any},
        optional={
            "outputs": st.lists(
                st.fixed_dictionaries(
                    {"name": output_names | json_any},
                    optional={"parameters": st.fixed_dictionaries({}, optional={"binary_data": json_any}) | json_any},
                ),
                max_size=3,
            )
            | json_any,
            "parameters": params_doc | json_any,
            "id": json_any,
        },
    )
    | json_any
)


@dataclass(frozen=True)
class V2Body:
    body: bytes
    header_length: str | None  # Inference-Header-Content-Length, when the binary extension is used

    @property
    def may_time_out(self) -> bool:
        """A request that asks for a queue timeout may rightly end 504 (it asked for it)."""
        try:
            doc = orjson.loads(self.body[: int(self.header_length)] if self.header_length else self.body)
            return isinstance(doc["parameters"]["timeout"], int)
        except Exception:
            return False


@st.composite
def v2_bodies(draw: st.DrawFn) -> V2Body:
    """JSON bodies, and JSON headers + binary blobs with right, wrong and nonsensical header lengths."""
    doc = draw(v2_documents)
    header = orjson.dumps(doc)
    mode = draw(st.sampled_from(["json", "binary", "garbage"]))
    if mode == "json":
        return V2Body(header, None)
    if mode == "garbage":
        return V2Body(draw(st.binary(max_size=300)), draw(st.none() | header_text | st.integers(-10, 400).map(str)))
    blob = draw(st.binary(max_size=300))
    length = draw(st.just(str(len(header))) | st.integers(-10, len(header) + 400).map(str) | header_text)
    return V2Body(header + blob, length)


v1_instance = (
    near_valid_items().map(lambda item: item.get("data")) | json_any | st.fixed_dictionaries({"image": json_any})
)
v1_bodies = (st.fixed_dictionaries({"instances": st.lists(v1_instance, max_size=4) | json_any}) | json_any).map(
    orjson.dumps
) | st.binary(max_size=200)

CONTENTS: dict[str, st.SearchStrategy] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": INT64,
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=8),
}
PARAMS: dict[str, st.SearchStrategy] = {  # KServe's InferParameter has only these three
    "int64_param": st.integers(-5, 10**7) | INT64,
    "bool_param": st.booleans(),
    "string_param": st.text(max_size=5),
}


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """Well-formed ModelInferRequest messages with wrong, missing, contradictory or huge contents."""
    request = pb.ModelInferRequest(model_name=draw(st.sampled_from([*SPECS, "nope", ""])), id=draw(st.text(max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(names), datatype=draw(datatypes), shape=draw(st.lists(dim, max_size=6)))
        field = draw(st.sampled_from([None, *CONTENTS]))
        if field:
            getattr(tensor.contents, field).extend(draw(st.lists(CONTENTS[field], max_size=40)))
    if draw(st.booleans()):
        # Sometimes exactly the bytes the first input's shape needs, so decoding gets past the size check.
        first = request.inputs[0] if request.inputs else None
        exact = first is not None and first.datatype in NUMPY_DTYPES and all(0 < d < 4096 for d in first.shape)
        size = int(np.prod(first.shape)) * NUMPY_DTYPES[first.datatype].itemsize if exact else 0
        # Real payloads stay small (<= 1 MiB), so that the allocation bound below measures decoding, not
        # the copy of a payload the fuzzer itself made huge (and CI's memory stays bounded).
        exact = exact and size <= 1 << 20
        blobs = [bytes(size)] if exact and draw(st.booleans()) else draw(st.lists(st.binary(max_size=64), max_size=3))
        request.raw_input_contents.extend(blobs)
    for key in draw(st.lists(st.sampled_from(["priority", "timeout", "other"]), unique=True, max_size=3)):
        kind = draw(st.sampled_from(sorted(PARAMS)))
        setattr(request.parameters[key], kind, draw(PARAMS[kind]))
    for name in draw(st.lists(output_names | st.text(max_size=4), max_size=2)):
        request.outputs.add(name=name)
    return request


def grpc_bytes() -> st.SearchStrategy[bytes]:
    """Serialized requests, the same with a byte flipped or cut short, and plain noise."""
    serialized = infer_requests().map(lambda r: r.SerializeToString())

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(serialized))
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
            data = data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data
        return bytes(data)

    return serialized | mutated() | st.binary(max_size=200)


# -- the property: only client errors, bounded allocation -----------------------------------------------
def allocation_of(decode: Callable[[], object]) -> tuple[RequestError | None, int]:
    """Run `decode`; return the RequestError it raised (if any) and the most memory it held at once."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    error = None
    try:
        decode()
    except RequestError as exc:
        error = exc
    return error, tracemalloc.get_traced_memory()[1] - before


def only_client_errors(decode: Callable[[], object]) -> None:
    """`decode` may succeed or raise a RequestError below 500 (anything else propagates: a test failure),
    within the allocation limit."""
    error, peak = allocation_of(decode)
    assert error is None or error.status < 500, f"{type(error).__name__} {error.status}: {error.message}"
    assert peak < ALLOCATION_LIMIT, f"decoding allocated {peak / 2**20:.0f} MiB"


def _limits(spec: ModelSpec) -> SimpleNamespace:
    """The one thing validation reads from a batcher."""
    return SimpleNamespace(max_request_items=spec.advertised_max_batch_size)


def decode_v2(model: str, body: V2Body) -> None:
    spec = SPECS[model]
    request = v2_codec.decode(body.body, body.header_length)
    select_outputs(spec, request.outputs)
    HUB.build_inputs(spec, _limits(spec), request.inputs)


def decode_v1(model: str, body: bytes) -> None:
    spec = SPECS[model]
    for group in v1_codec.decode(spec, body):
        HUB.build_inputs(spec, _limits(spec), group)


def decode_grpc(request: pb.ModelInferRequest) -> None:
    """What ModelInfer does before queueing: params, decoding, validation against the named model."""
    grpc_codec._param(request.parameters, "priority")
    grpc_codec._param(request.parameters, "timeout")
    decoded = grpc_codec.decode_inputs(request)
    spec = HUB.get(request.model_name).spec
    HUB.build_inputs(spec, _limits(spec), decoded)


@pytest.fixture(scope="module", autouse=True)
def traced() -> Any:
    tracemalloc.start()
    yield
    tracemalloc.stop()


HUGE_TOKENS = V2Body(
    orjson.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 10**12], "data": [1]}]}), None
)
_huge_header = orjson.dumps(
    {
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [1, 10**12], "parameters": {"binary_data_size": 8}}
        ]
    }
)
HUGE_BINARY = V2Body(_huge_header + bytes(8), str(len(_huge_header)))


@IN_PROCESS
@given(model=st.sampled_from(sorted(SPECS)), body=v2_bodies())
@example(model="textcls", body=HUGE_TOKENS)
@example(model="textcls", body=HUGE_BINARY)
def test_v2_rest_decoding_raises_only_client_errors(model: str, body: V2Body) -> None:
    only_client_errors(lambda: decode_v2(model, body))


@IN_PROCESS
@given(model=st.sampled_from(sorted(SPECS)), body=v1_bodies)
def test_v1_rest_decoding_raises_only_client_errors(model: str, body: bytes) -> None:
    only_client_errors(lambda: decode_v1(model, body))


@IN_PROCESS
@given(request=infer_requests())
def test_grpc_decoding_raises_only_client_errors(request: pb.ModelInferRequest) -> None:
    only_client_errors(lambda: decode_grpc(request))


def test_huge_claimed_shape_is_refused_before_any_allocation() -> None:
    """A claimed 10^12 elements is a 413 with (next to) nothing allocated; and the measure sees numpy."""
    for body in (HUGE_TOKENS, HUGE_BINARY):
        error, peak = allocation_of(lambda body=body: decode_v2("textcls", body))
        assert error is not None and error.status == 413, error
        assert peak < 1024 * 1024, peak
    _, peak = allocation_of(lambda: np.ones(ALLOCATION_LIMIT, dtype=np.uint8))
    assert peak >= ALLOCATION_LIMIT


# -- live ---------------------------------------------------------------------------------------------
def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def assert_still_serving(server: tuple[int, int], demo_repository: Path) -> None:
    """Ready, and a good request gets the same answer as the model run directly."""
    port = server[0]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    ids = nlp_inputs(1, seed=21)[0]
    doc = {
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": list(ids.shape), "data": ids.reshape(-1).tolist()}
        ]
    }
    status, body = post(port, "/v2/models/textcls/infer", json.dumps(doc).encode(), {})
    assert status == 200, body[:300]
    logits = np.array(json.loads(body)["outputs"][0]["data"], dtype=np.float32).reshape(1, -1)
    np.testing.assert_allclose(logits, expected(demo_repository, "textcls", ids)["logits"], rtol=1e-4, atol=1e-4)


@st.composite
def live_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], bool]:
    """(path, body, headers, may time out) for a v2 infer or v1 predict on a hosted or unknown model."""
    model = draw(st.sampled_from([*SPECS, "nope"]))
    if draw(st.integers(0, 3)) == 0:
        return f"/v1/models/{model}:predict", draw(v1_bodies), {}, False
    body = draw(v2_bodies())
    headers = {} if body.header_length is None else {v2_codec.BINARY_HEADER: body.header_length}
    return f"/v2/models/{model}/infer", body.body, headers, body.may_time_out


def check_live_rest(port: int, case: tuple[str, bytes, dict[str, str], bool]) -> int:
    """POST one fuzzed request: never a 5xx (but a 504 for a request that asked for a timeout)."""
    path, body, headers, may_time_out = case
    status, reply = post(port, path, body, headers)
    assert status < 500 or (status == 504 and may_time_out), f"{path} -> {status} {reply[:300]!r}"
    return status


def test_live_rest_fuzz_never_5xx(server, demo_repository: Path) -> None:
    statuses: dict[int, int] = {}

    @LIVE
    @given(case=live_requests())
    def one(case: tuple[str, bytes, dict[str, str], bool]) -> None:
        status = check_live_rest(server[0], case)
        statuses[status] = statuses.get(status, 0) + 1

    one()
    print(f"\nlive REST fuzz: {statuses}")
    assert sum(statuses.values()) >= 200 and statuses.get(400, 0) > 0, statuses
    assert_still_serving(server, demo_repository)


KSERVE_METHODS = ["ModelInfer", "ModelMetadata", "ModelReady", "ServerReady", "ServerMetadata", "ServerLive"]


async def test_add_servicer_answers_undecodable_bytes_invalid_argument() -> None:
    """grpc_frontend.add_servicer on a bare grpc.aio server: garbage is INVALID_ARGUMENT (plain
    registration says UNKNOWN), and decodable requests still reach the servicer."""
    server = grpc.aio.server()
    grpc_frontend.add_servicer(grpc_frontend.BatchPilotServicer(HUB, None, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in KSERVE_METHODS:
                call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
                for garbage in (b"\xff", b"\x12\x80", b"\x0a\x05ab"):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call(garbage, timeout=10)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused.value)
            ready = await channel.unary_unary("/inference.GRPCInferenceService/ServerReady")(b"", timeout=10)
            assert pb.ServerReadyResponse.FromString(ready).ready is False  # the hub has no batchers
    finally:
        await server.stop(None)


GRPC_METHODS = [
    "ModelInfer",
    "ModelMetadata",
    "ModelReady",
    "ServerReady",
    "ServerMetadata",
    "ServerLive",
    "ModelConfig",
    "ModelStatistics",
]


def grpc_calls(channel: grpc.Channel) -> dict[str, grpc.UnaryUnaryMultiCallable]:
    """Every RPC of the service, taking and returning raw bytes (no serializer: garbage goes out as is)."""
    return {m: channel.unary_unary(f"/inference.GRPCInferenceService/{m}") for m in GRPC_METHODS}


def check_live_grpc(calls: dict[str, grpc.UnaryUnaryMultiCallable], method: str, data: bytes) -> grpc.StatusCode:
    try:
        calls[method](data, timeout=30)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        assert err.code() in GRPC_CLIENT_CODES, f"{method}({data[:40]!r}) -> {err.code()}: {err.details()}"
        return err.code()


def test_live_grpc_fuzz_never_internal_or_unknown(server, demo_repository: Path) -> None:
    """Raw bytes, and well-formed but wrong messages, to every RPC."""
    codes: dict[grpc.StatusCode, int] = {}
    with grpc.insecure_channel(f"127.0.0.1:{server[1]}") as channel:
        calls = grpc_calls(channel)

        @LIVE
        @given(method=st.sampled_from(GRPC_METHODS), data=grpc_bytes())
        def one(method: str, data: bytes) -> None:
            code = check_live_grpc(calls, method, data)
            codes[code] = codes.get(code, 0) + 1

        one()
    assert sum(codes.values()) >= 200 and codes.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 0, codes
    assert_still_serving(server, demo_repository)
