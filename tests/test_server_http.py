"""The real server on loopback, called with tritonclient's HTTP client under concurrency."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from reference import assert_close, cv_inputs, expected, nlp_inputs

CASES = {"resnet-mini": ("image", "FP32", cv_inputs), "textcls": ("input_ids", "INT64", nlp_inputs)}


def _infer(port: int, model: str, array: np.ndarray, binary: bool) -> dict[str, np.ndarray]:
    name, datatype, _ = CASES[model]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    result = client.infer(model, [tensor])
    outputs = {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
    client.close()
    return outputs


def test_outputs_equal_the_model_run_directly_under_concurrency(server, demo_repository: Path) -> None:
    port = server[0]
    for model, (_, _, make_inputs) in CASES.items():
        arrays = make_inputs(48)
        with ThreadPoolExecutor(16) as pool:
            results = list(
                pool.map(lambda ia, model=model: _infer(port, model, ia[1], ia[0] % 2 == 0), enumerate(arrays))
            )
        for array, got in zip(arrays, results, strict=False):
            assert_close(got, expected(demo_repository, model, array))
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats").read())
        model_stats = stats["model_stats"][0]
        # Batching really happened: fewer model executions than inferences.
        assert model_stats["execution_count"] < model_stats["inference_count"]


def test_metadata_config_and_server_extensions(server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server[0]}")
    assert {"model_configuration", "statistics"} <= set(client.get_server_metadata()["extensions"])
    config = client.get_model_config("textcls")
    assert config["max_batch_size"] >= 16 and config["input"][0]["dims"] == [-1]
    assert "dynamic_batching" in config
    meta = client.get_model_metadata("resnet-mini")
    assert meta["inputs"][0]["shape"] == [-1, 3, 64, 64]
    assert client.is_model_ready("resnet-mini") and client.is_server_ready()


def test_v1_predict_matches_v2(server, demo_repository: Path) -> None:
    ids = [[5, 6, 7, 8], [9, 10]]
    body = json.dumps({"instances": ids}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server[0]}/v1/models/textcls:predict", data=body, method="POST")
    predictions = json.loads(urllib.request.urlopen(req).read())["predictions"]
    for seq, prediction in zip(ids, predictions, strict=False):
        want = expected(demo_repository, "textcls", np.array([seq], dtype=np.int64))
        np.testing.assert_allclose(prediction["logits"], want["logits"][0], rtol=1e-4, atol=1e-4)
        assert len(prediction["token_scores"]) == len(seq)


def test_batching_endpoint_reports_parameters_in_force(server) -> None:
    state = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{server[0]}/v2/models/resnet-mini/batching").read())
    assert state["autotune"]["enabled"] is True and state["autotune"]["latency_slo_p99_ms"] == 50.0
    assert 1 <= state["max_batch_size"] <= 64
    assert {"p99_ms", "throughput_rps"} <= set(state["recent"])
