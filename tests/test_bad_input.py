"""Malformed requests fail alone with a 4xx that names the problem, while good traffic keeps flowing."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from reference import MAX_BODY, assert_close, cv_inputs, expected, nlp_inputs

IMG = [1, 3, 64, 64]


def v2(model: str, inputs: list[dict], **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def image(shape=IMG, datatype="FP32", data=None, name="image") -> dict:
    count = int(np.prod(shape)) if all(d > 0 for d in shape) else 1
    return {"name": name, "datatype": datatype, "shape": shape, "data": data if data is not None else [0.5] * count}


def tokens(ids, shape=None, **params) -> dict:
    doc = {"name": "input_ids", "datatype": "INT64", "shape": shape or [1, len(ids)], "data": ids}
    return doc


def ragged_image() -> list:
    """A 1x3x64x64 image as nested lists with one value moved from row 5 to row 7: 12288 values, as the shape
    asks, in rows of 63 and 65. As JSON it is past 8 KiB, which the codec reads with simdjson."""
    rows = [row for channel in np.full(IMG, 0.5).tolist()[0] for row in channel]
    rows[7].append(rows[5].pop())
    return [[rows[c * 64 : (c + 1) * 64] for c in range(3)]]


BINARY_HEADER = json.dumps(
    {"inputs": [{"name": "image", "datatype": "FP32", "shape": IMG, "parameters": {"binary_data_size": 49152}}]}
).encode()

# (label, path, body, extra headers, expected status, words the message must contain)
BAD = [
    ("not json", "/v2/models/resnet-mini/infer", b"{nope", {}, 400, "not valid JSON"),
    ("json array", "/v2/models/resnet-mini/infer", b"[1, 2]", {}, 400, "JSON object"),
    ("no inputs", "/v2/models/resnet-mini/infer", b"{}", {}, 400, "'inputs'"),
    ("empty inputs", "/v2/models/resnet-mini/infer", v2("", []), {}, 400, "'inputs'"),
    ("unknown model", "/v2/models/nope/infer", v2("", [image()]), {}, 404, "not hosted"),
    ("unknown input", "/v2/models/resnet-mini/infer", v2("", [image(name="pixels")]), {}, 400, "unknown input"),
    ("wrong datatype", "/v2/models/resnet-mini/infer", v2("", [image(datatype="FP64")]), {}, 400, "datatype"),
    (
        "unsupported datatype",
        "/v2/models/resnet-mini/infer",
        v2("", [image(datatype="BYTES")]),
        {},
        400,
        "unsupported datatype",
    ),
    ("wrong rank", "/v2/models/resnet-mini/infer", v2("", [image(shape=[3, 64, 64])]), {}, 400, "shape"),
    ("wrong dims", "/v2/models/resnet-mini/infer", v2("", [image(shape=[1, 3, 32, 32])]), {}, 400, "does not match"),
    ("negative dim", "/v2/models/resnet-mini/infer", v2("", [image(shape=[1, 3, -64, 64])]), {}, 400, "shape"),
    ("too few values", "/v2/models/resnet-mini/infer", v2("", [image(data=[1.0] * 10)]), {}, 400, "values sent"),
    ("too many values", "/v2/models/resnet-mini/infer", v2("", [image(data=[1.0] * 50000)]), {}, 400, "values sent"),
    ("strings as data", "/v2/models/textcls/infer", v2("", [tokens([1, 2, "x"])]), {}, 400, "does not fit INT64"),
    ("floats as tokens", "/v2/models/textcls/infer", v2("", [tokens([1.5, 2.0])]), {}, 400, "does not fit INT64"),
    ("int overflow", "/v2/models/textcls/infer", v2("", [tokens([2**70, 1])]), {}, 400, "INT64"),
    (
        "ragged data",
        "/v2/models/textcls/infer",
        v2("", [tokens([[1, 2], [3]], shape=[2, 2])]),
        {},
        400,
        "input 'input_ids'",
    ),
    (
        "ragged data past 8 KiB",
        "/v2/models/resnet-mini/infer",
        v2("", [image(data=ragged_image())]),
        {},
        400,
        "'data' is ragged",
    ),
    ("sequence too long", "/v2/models/textcls/infer", v2("", [tokens([1] * 300)]), {}, 400, "max_length"),
    (
        "batch too large",
        "/v2/models/resnet-mini/infer",
        v2("", [image(shape=[65, 3, 64, 64])]),
        {},
        400,
        "max_batch_size",
    ),
    (
        "huge claimed shape",
        "/v2/models/textcls/infer",
        v2("", [tokens([1], shape=[1, 10**12])]),
        {},
        413,
        "exceed the limit",
    ),
    (
        "huge claimed image",
        "/v2/models/resnet-mini/infer",
        v2("", [{"name": "image", "datatype": "FP32", "shape": [10**6, 3, 64, 64], "data": [1.0]}]),
        {},
        400,
        "max_batch_size",
    ),
    (
        "unknown output",
        "/v2/models/resnet-mini/infer",
        v2("", [image()], outputs=[{"name": "probs"}]),
        {},
        400,
        "unknown output",
    ),
    (
        "bad priority",
        "/v2/models/resnet-mini/infer",
        v2("", [image()], parameters={"priority": 7}),
        {},
        400,
        "priority",
    ),
    (
        "bad timeout type",
        "/v2/models/resnet-mini/infer",
        v2("", [image()], parameters={"timeout": "soon"}),
        {},
        400,
        "timeout",
    ),
    ("duplicate inputs", "/v2/models/resnet-mini/infer", v2("", [image(), image()]), {}, 400, "duplicate"),
    (
        "binary size beyond body",
        "/v2/models/resnet-mini/infer",
        BINARY_HEADER + b"\0" * 100,
        {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
        400,
        "binary_data_size",
    ),
    (
        "bad binary header length",
        "/v2/models/resnet-mini/infer",
        b"{}",
        {"Inference-Header-Content-Length": "abc"},
        400,
        "integer",
    ),
    (
        "leftover binary bytes",
        "/v2/models/resnet-mini/infer",
        BINARY_HEADER + b"\0" * 49160,
        {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
        400,
        "belong to no input",
    ),
    (
        "v1 ragged instances",
        "/v1/models/resnet-mini:predict",
        json.dumps({"instances": [[[1.0, 2.0], [3.0]]]}).encode(),
        {},
        400,
        "input 'image'",
    ),
    ("v1 no instances", "/v1/models/textcls:predict", b'{"inputs": []}', {}, 400, "instances"),
    ("body too large", "/v2/models/resnet-mini/infer", b"x" * (MAX_BODY + 1), {}, 413, "exceeds the limit"),
    (
        "token id outside vocabulary",
        "/v2/models/textcls/infer",
        v2("", [tokens([5, 99999, 7])]),
        {},
        422,
        "failed on this input",
    ),
]


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_each_bad_request_fails_alone_while_good_traffic_flows(server, demo_repository: Path) -> None:
    port = server[0]
    good_inputs = nlp_inputs(16, seed=11)
    want = [expected(demo_repository, "textcls", a) for a in good_inputs]
    failures: list[str] = []
    served = [0]
    stop = threading.Event()

    def good_traffic() -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        i = 0
        while not stop.is_set():
            array = good_inputs[i % len(good_inputs)]
            tensor = httpclient.InferInput("input_ids", list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            try:
                result = client.infer("textcls", [tensor])
                assert_close({n: result.as_numpy(n) for n in ("logits", "token_scores")}, want[i % len(good_inputs)])
                served[0] += 1
            except Exception as exc:
                failures.append(repr(exc))
            i += 1

    workers = [threading.Thread(target=good_traffic) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for label, path, body, headers, status, words in BAD:
            got, doc = post(port, path, body, headers)
            assert got == status, f"{label}: HTTP {got} {doc}"
            assert words in doc.get("error", ""), f"{label}: message {doc!r} does not say {words!r}"
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert len(BAD) >= 15
    assert not failures, failures[:3]
    assert served[0] > 0
    assert httpclient.InferenceServerClient(f"127.0.0.1:{port}").is_server_ready()


def test_a_failing_request_does_not_fail_its_batch_mates(server, demo_repository: Path) -> None:
    """Requests batched together with one the model raises on still get their right answers."""
    port = server[0]
    good = nlp_inputs(12, seed=5)
    results: dict[int, tuple[int, dict]] = {}

    def send(i: int) -> None:
        ids = [5, 99999, 7] if i == 6 else good[i].reshape(-1).tolist()
        results[i] = post(port, "/v2/models/textcls/infer", v2("", [tokens(ids)]), {})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[6][0] == 422
    for i in range(12):
        if i == 6:
            continue
        status, doc = results[i]
        assert status == 200, doc
        logits = np.array(doc["outputs"][0]["data"], dtype=np.float32).reshape(1, -1)
        np.testing.assert_allclose(
            logits, expected(demo_repository, "textcls", good[i])["logits"], rtol=1e-4, atol=1e-4
        )


def test_a_large_ragged_body_fails_alone_in_its_batch_window(server, demo_repository: Path) -> None:
    """A ragged image past 8 KiB (read by the codec's simdjson path, which once took it as 12288 good values)
    is refused with a 400 naming the problem, while good JSON images sent at the same instant are answered."""
    port = server[0]
    good = cv_inputs(6, seed=7)
    bodies = [v2("", [image(shape=list(a.shape), data=a.tolist())]) for a in good]
    bodies.insert(3, v2("", [image(data=ragged_image())]))
    assert all(len(b) >= 8192 for b in bodies)
    results: dict[int, tuple[int, dict]] = {}
    start = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        start.wait()
        results[i] = post(port, "/v2/models/resnet-mini/infer", bodies[i], {})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, doc = results.pop(3)
    assert status == 400, doc
    assert "input 'image'" in doc["error"] and "ragged" in doc["error"], doc
    for i, array in zip(sorted(results), good, strict=True):
        status, doc = results[i]
        assert status == 200, doc
        logits = np.array(doc["outputs"][0]["data"], dtype=np.float32).reshape(array.shape[0], -1)
        np.testing.assert_allclose(
            logits, expected(demo_repository, "resnet-mini", array)["logits"], rtol=1e-4, atol=1e-4
        )
