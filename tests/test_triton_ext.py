"""Triton's model-configuration and statistics extensions: JSON, gRPC wire compatibility, live RPCs.

tritonclient's gRPC protos cannot be loaded beside KServe's (both define `inference.*`), so everything
that needs tritonclient.grpc runs in a child Python process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from kserve import InferOutput, InferRequest, InferResponse, Model
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension

from batchpilot.runtime.protocol import batchpilot_triton_pb2 as pb
from batchpilot.runtime.protocol.triton_grpc import (
    model_config_response,
    model_statistics_response,
    triton_extension_handler,
)
from batchpilot.runtime.stats import ModelStats
from batchpilot.runtime.triton_config import model_config_json
from batchpilot.spec.model import ModelSpec, TensorSpec
from batchpilot.testing.perfa import PerfAnalyzerError, find_perf_analyzer, parse_csv_report, run_perf_analyzer

CV_SPEC = ModelSpec.model_validate(
    {
        "name": "cnn",
        "type": "cv",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, -1, -1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [10]}],
        "batching": {
            "maxBatchSize": 16,
            "maxQueueDelayMicroseconds": 2000,
            "preferredBatchSize": [4, 8, 16],
            "priorityLevels": 2,
            "defaultPriorityLevel": 2,
            "defaultQueuePolicy": {"timeoutAction": "DELAY", "defaultTimeoutMicroseconds": 50_000, "maxQueueSize": 64},
        },
    }
)
NLP_SPEC = ModelSpec.model_validate(
    {
        "name": "textcls",
        "type": "nlp",
        "format": "torch_export",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [2]}],
    }
)


async def _in_triton_process(code: str, payload: Any = None) -> Any:
    """Run `code` in a fresh Python (where tritonclient.grpc may be imported); it reads JSON `payload`
    as `payload` and prints its JSON result. Asynchronous so that a server on this loop keeps serving."""
    script = f"import json, sys\npayload = json.load(sys.stdin)\n{code}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(payload).encode()), timeout=120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


# ---- statistics accumulator ----


def test_stats_start_empty() -> None:
    assert ModelStats().to_json("m") == {
        "name": "m",
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {
            key: {"count": 0, "ns": 0}
            for key in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            )
        },
        "batch_stats": [],
    }


def test_stats_accumulate_per_request_and_per_execution() -> None:
    stats = ModelStats()
    before_ms = time.time_ns() // 1_000_000
    stats.record_execution(4, 10, 100, 20)
    stats.record_execution(1, 1, 30, 2)
    stats.record_execution(4, 12, 110, 22)
    stats.record_success(500, 3, 25, 5, 900)
    stats.record_success(700, 4, 26, 6, 1100)
    stats.record_failure(42)
    body = stats.to_json("cnn", "3")

    assert before_ms <= body["last_inference"] <= time.time_ns() // 1_000_000
    assert (body["name"], body["version"]) == ("cnn", "3")
    assert body["inference_count"] == 9  # items, not executions
    assert body["execution_count"] == 3
    inference = body["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 2000}
    assert inference["fail"] == {"count": 1, "ns": 42}
    assert inference["queue"] == {"count": 2, "ns": 1200}
    assert inference["compute_input"] == {"count": 2, "ns": 7}
    assert inference["compute_infer"] == {"count": 2, "ns": 51}
    assert inference["compute_output"] == {"count": 2, "ns": 11}
    assert inference["cache_hit"] == inference["cache_miss"] == {"count": 0, "ns": 0}
    assert body["batch_stats"] == [
        {
            "batch_size": 1,
            "compute_input": {"count": 1, "ns": 1},
            "compute_infer": {"count": 1, "ns": 30},
            "compute_output": {"count": 1, "ns": 2},
        },
        {
            "batch_size": 4,
            "compute_input": {"count": 2, "ns": 22},
            "compute_infer": {"count": 2, "ns": 210},
            "compute_output": {"count": 2, "ns": 42},
        },
    ]
    with pytest.raises(ValueError):
        stats.record_execution(0, 1, 1, 1)


# ---- model configuration JSON ----


def test_config_json_cv() -> None:
    config = model_config_json(CV_SPEC, max_batch_size=8, max_queue_delay_us=1500)
    assert config["name"] == "cnn"
    assert (config["platform"], config["backend"]) == ("pytorch_libtorch", "pytorch")
    assert config["max_batch_size"] == 8
    assert config["input"] == [
        {
            "name": "x",
            "data_type": "TYPE_FP32",
            "dims": [3, -1, -1],
            "is_shape_tensor": False,
            "format": "FORMAT_NONE",
            "allow_ragged_batch": False,
            "optional": False,
        }
    ]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10], "is_shape_tensor": False}]
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [4, 8],  # 16 exceeds the max_batch_size in force
        "max_queue_delay_microseconds": 1500,
        "preserve_ordering": False,
        "priority_levels": 2,
        "default_priority_level": 2,
        "default_queue_policy": {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": 50_000,
            "allow_timeout_override": True,
            "max_queue_size": 64,
        },
        "priority_queue_policy": {},
    }
    assert "sequence_batching" not in config
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert config["instance_group"] == [{"name": "cnn", "kind": "KIND_CPU", "count": 1, "gpus": []}]
    assert config["default_model_filename"] == "model.pt"


def test_config_json_nlp_on_gpu() -> None:
    config = model_config_json(NLP_SPEC, max_batch_size=32, max_queue_delay_us=0, gpus=[1])
    assert config["max_batch_size"] == 32
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("input_ids", "TYPE_INT64", [-1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("logits", "TYPE_FP32", [2])]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert config["dynamic_batching"]["preferred_batch_size"] == []
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    assert config["instance_group"][0]["gpus"] == [1]
    assert config["default_model_filename"] == "model.pt2"


# ---- wire compatibility with Triton's own protos ----


def _walk(messages: Iterator[Descriptor] | list[Descriptor]) -> Iterator[Descriptor]:
    for message in messages:
        yield message
        yield from _walk(message.nested_types)


def _field_shape(field: FieldDescriptor) -> tuple:
    """What must agree for two fields to be wire- and JSON-compatible (type names without package)."""
    ref = field.message_type or field.enum_type
    oneof = field.containing_oneof
    return (
        field.number,
        field.type,
        field.is_repeated,
        ref.full_name.removeprefix(ref.file.package + ".") if ref else None,
        oneof.name if oneof else None,
    )


async def test_descriptors_match_tritons() -> None:
    # Triton's file descriptors travel back as FileDescriptorProtos and go into a private pool here,
    # which (unlike the default pool) does not clash with KServe's `inference.*`.
    files = await _in_triton_process(
        "import base64\n"
        "from google.protobuf import descriptor_pb2\n"
        "from tritonclient.grpc import model_config_pb2, service_pb2\n"
        "out = []\n"
        "for module in (model_config_pb2, service_pb2):\n"
        "    proto = descriptor_pb2.FileDescriptorProto()\n"
        "    module.DESCRIPTOR.CopyToProto(proto)\n"
        "    out.append(base64.b64encode(proto.SerializeToString()).decode())\n"
        "print(json.dumps(out))\n"
    )
    triton = descriptor_pool.DescriptorPool()
    for encoded in files:  # dependency order: model_config.proto first
        triton.Add(descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(encoded)))

    ours = pb.DESCRIPTOR
    checked = 0
    for message in _walk(list(ours.message_types_by_name.values())):
        theirs = triton.FindMessageTypeByName("inference." + message.full_name.removeprefix("batchpilot.triton."))
        for field in message.fields:
            assert field.name in theirs.fields_by_name, f"{message.full_name}.{field.name}"
            assert _field_shape(field) == _field_shape(theirs.fields_by_name[field.name]), (
                f"{message.full_name}.{field.name}"
            )
            checked += 1
    enums = list(ours.enum_types_by_name.values()) + [
        e for m in _walk(list(ours.message_types_by_name.values())) for e in m.enum_types
    ]
    for enum in enums:
        theirs_enum = triton.FindEnumTypeByName("inference." + enum.full_name.removeprefix("batchpilot.triton."))
        ours_values = {v.name: v.number for v in enum.values}
        assert ours_values.items() <= {v.name: v.number for v in theirs_enum.values}.items(), enum.full_name
    assert checked > 50 and len(enums) == 4


def _stats_entry() -> dict:
    stats = ModelStats()
    stats.record_execution(8, 100, 2_000, 300)
    stats.record_execution(2, 50, 900, 80)
    stats.record_success(1_000, 10, 200, 30, 2_500)
    stats.record_failure(77)
    return stats.to_json("cnn")


async def test_wire_compatible_with_tritonclient() -> None:
    messages = {
        "cv": model_config_response(model_config_json(CV_SPEC, 8, 1500)),
        "nlp": model_config_response(model_config_json(NLP_SPEC, 32, 0)),
        "stats": model_statistics_response([_stats_entry()]),
    }
    parsed = await _in_triton_process(
        "import base64\n"
        "from google.protobuf import json_format\n"
        "from tritonclient.grpc import service_pb2\n"
        "kinds = {'cv': service_pb2.ModelConfigResponse, 'nlp': service_pb2.ModelConfigResponse,\n"
        "         'stats': service_pb2.ModelStatisticsResponse}\n"
        "out = {}\n"
        "for key, data in payload.items():\n"
        "    message = kinds[key].FromString(base64.b64decode(data))\n"
        "    out[key] = json_format.MessageToDict(message, preserving_proto_field_name=True)\n"
        "    if key != 'stats':\n"
        "        out[key]['scheduling_choice'] = message.config.WhichOneof('scheduling_choice')\n"
        "print(json.dumps(out))\n",
        {key: base64.b64encode(m.SerializeToString()).decode() for key, m in messages.items()},
    )
    cv, nlp, stats = parsed["cv"], parsed["nlp"], parsed["stats"]
    # Concrete values as tritonclient reads them (64-bit integers print as strings in proto JSON) ...
    assert cv["config"]["max_batch_size"] == 8
    assert cv["config"]["input"][0]["data_type"] == "TYPE_FP32"
    assert cv["config"]["input"][0]["dims"] == ["3", "-1", "-1"]
    assert cv["config"]["dynamic_batching"]["max_queue_delay_microseconds"] == "1500"
    assert cv["config"]["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
    assert cv["config"]["instance_group"][0]["kind"] == "KIND_CPU"
    assert cv["scheduling_choice"] == "dynamic_batching"
    assert nlp["config"]["input"][0] == {"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]}
    assert nlp["config"]["max_batch_size"] == 32
    model_stats = stats["model_stats"][0]
    assert (model_stats["name"], model_stats["version"]) == ("cnn", "1")
    assert (model_stats["inference_count"], model_stats["execution_count"]) == ("10", "2")
    assert model_stats["inference_stats"]["queue"] == {"count": "1", "ns": "1000"}
    assert model_stats["inference_stats"]["fail"] == {"count": "1", "ns": "77"}
    assert [b["batch_size"] for b in model_stats["batch_stats"]] == ["2", "8"]
    # ... and every field we send is one tritonclient knows (unknown fields would be missing here).
    for key, message in messages.items():
        expected = json_format.MessageToDict(message, preserving_proto_field_name=True)
        assert {k: v for k, v in parsed[key].items() if k != "scheduling_choice"} == expected


# ---- live gRPC: KServe's servicer and ours on one grpc.aio server ----


class _Echo(Model):
    """Doubles an FP32 [-1, 4] tensor and records Triton statistics like a batcher would."""

    def __init__(self, stats: ModelStats) -> None:
        super().__init__("cnn")
        self.stats = stats
        self.ready = True

    def get_input_types(self) -> list[dict]:
        return [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]

    def get_output_types(self) -> list[dict]:
        return [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}]

    async def predict(self, payload: InferRequest, headers: Any = None, response_headers: Any = None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        self.stats.record_execution(x.shape[0], 1_000, 2_000, 3_000)
        self.stats.record_success(4_000, 1_000, 2_000, 3_000, 11_000)
        out = InferOutput(name="logits", shape=list(x.shape), datatype="FP32")
        out.set_data_from_numpy(x * 2)
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id)


class _TritonExtensionsDataPlane(DataPlane):
    # perf_analyzer asks ModelStatistics only of a server that lists "statistics".
    def metadata(self) -> dict:
        metadata = super().metadata()
        return {**metadata, "extensions": [*metadata["extensions"], "model_configuration", "statistics"]}


@pytest_asyncio.fixture
async def grpc_server() -> AsyncIterator[tuple[str, ModelStats]]:
    stats = ModelStats()
    repository = ModelRepository()
    repository.update(_Echo(stats))
    server = grpc.aio.server()
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(_TritonExtensionsDataPlane(repository), ModelRepositoryExtension(repository)), server
    )
    spec = CV_SPEC.model_copy(update={"inputs": [TensorSpec(name="x", datatype="FP32", shape=[4])]})

    def config_for(name: str) -> dict:
        if name != "cnn":
            raise KeyError(name)
        return model_config_json(spec, 8, 1500)

    def stats_for(name: str) -> list[dict]:
        if name not in ("cnn", ""):
            raise KeyError(name)
        return [stats.to_json("cnn")]

    server.add_generic_rpc_handlers((triton_extension_handler(config_for, stats_for),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", stats
    finally:
        await server.stop(grace=None)


async def test_live_model_config_and_statistics(grpc_server: tuple[str, ModelStats]) -> None:
    url, stats = grpc_server
    stats.record_execution(3, 10, 20, 30)
    stats.record_success(5, 10, 20, 30, 70)
    result = await _in_triton_process(
        "import tritonclient.grpc as g\n"
        "from tritonclient.utils import InferenceServerException\n"
        "client = g.InferenceServerClient(payload)\n"
        "def status(call):\n"
        "    try:\n"
        "        call()\n"
        "    except InferenceServerException as e:\n"
        "        return e.status()\n"
        "    return 'OK'\n"
        "print(json.dumps({\n"
        "    'live': client.is_server_live(),\n"
        "    'config': client.get_model_config('cnn', as_json=True),\n"
        "    'stats': client.get_inference_statistics('cnn', as_json=True),\n"
        "    'all_stats': client.get_inference_statistics('', as_json=True),\n"
        "    'stats_v1': client.get_inference_statistics('cnn', '1', as_json=True),\n"
        "    'unknown_config': status(lambda: client.get_model_config('nope')),\n"
        "    'unknown_stats': status(lambda: client.get_inference_statistics('nope')),\n"
        "    'config_v1': client.get_model_config('cnn', '1', as_json=True),\n"
        "    'unknown_version': status(lambda: client.get_inference_statistics('cnn', '7')),\n"
        "    'unknown_config_version': status(lambda: client.get_model_config('cnn', '7')),\n"
        "    'bad_version': status(lambda: client.get_model_config('cnn', 'latest')),\n"
        "    'no_name': status(lambda: client.get_model_config('')),\n"
        "}))\n",
        url,
    )
    assert result["live"] is True  # KServe's own RPCs still answer beside ours
    config = result["config"]["config"]
    assert config["name"] == "cnn" and config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == ["4"]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "1500"
    model_stats = result["stats"]["model_stats"]
    assert [(s["name"], s["inference_count"], s["execution_count"]) for s in model_stats] == [("cnn", "3", "1")]
    assert model_stats[0]["inference_stats"]["success"] == {"count": "1", "ns": "70"}
    assert result["all_stats"] == result["stats_v1"] == result["stats"]
    assert result["config_v1"] == result["config"]
    not_found = ("unknown_config", "unknown_stats", "unknown_version", "unknown_config_version")
    assert {result[key] for key in not_found} == {"StatusCode.NOT_FOUND"}
    assert result["bad_version"] == result["no_name"] == "StatusCode.INVALID_ARGUMENT"


# ---- perf_analyzer ----


def test_parse_csv_report() -> None:
    report = (
        "Concurrency,Inferences/Second,Client Send,Server Queue,p50 latency,p90 latency,p95 latency,p99 latency\n"
        "2,1836.86,3,40,1056,1318,1431,1937\n"  # out of load order, as perf_analyzer may write rows
        "1,1089.69,3,12,892,1089,1149,1381\n"
        "\n"
        "Concurrency,Inferences/Second,Composing model\n"
        "1,5.0,other\n"
    )
    assert parse_csv_report(report) == [
        {
            "concurrency": 1,
            "infer_per_s": 1089.69,
            "client_send": 3,
            "server_queue": 12,
            "p50_us": 892,
            "p90_us": 1089,
            "p95_us": 1149,
            "p99_us": 1381,
        },
        {
            "concurrency": 2,
            "infer_per_s": 1836.86,
            "client_send": 3,
            "server_queue": 40,
            "p50_us": 1056,
            "p90_us": 1318,
            "p95_us": 1431,
            "p99_us": 1937,
        },
    ]


_FAKE_PERF_ANALYZER = """#!{python}
import sys
args = sys.argv[1:]
open(args[args.index("-f") + 1], "w").write("Concurrency,Inferences/Second,p99 latency\\n1,10.5,900\\n")
print(" ".join(args))
print({message!r}, file=sys.stderr)  # where perf_analyzer writes both
sys.exit({code})
"""


@pytest.mark.parametrize(
    ("message", "code", "failure"),
    [
        ("", 0, None),
        ("Thread [0] had error: boom", 99, "exited 99"),
        ("Failed to obtain stable measurement within 10 measurement windows", 0, "stabilize"),
    ],
)
def test_run_perf_analyzer_outcomes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str, code: int, failure: str | None
) -> None:
    fake = tmp_path / "perf_analyzer"
    fake.write_text(_FAKE_PERF_ANALYZER.format(python=sys.executable, message=message, code=code))
    fake.chmod(0o755)
    monkeypatch.setenv("PERF_ANALYZER", str(fake))
    assert find_perf_analyzer() == fake
    if failure is None:
        rows = run_perf_analyzer("m", "h:1", "grpc", (1, 4, 1), ["--async"], timeout=30)
        assert rows == [{"concurrency": 1, "infer_per_s": 10.5, "p99_us": 900}]
    else:
        with pytest.raises(PerfAnalyzerError, match=failure) as raised:
            run_perf_analyzer("m", "h:1", "grpc", "1:4:1", ["--async"], timeout=30)
        # The error shows what was run and what the tool said.
        assert "-m m -u h:1 -i grpc --concurrency-range 1:4:1" in str(raised.value)
        assert message in str(raised.value)


@pytest.mark.skipif(find_perf_analyzer() is None, reason="perf_analyzer not installed (tools/install-perf-analyzer.sh)")
async def test_perf_analyzer_reads_config_and_statistics(grpc_server: tuple[str, ModelStats]) -> None:
    url, stats = grpc_server
    # A thread, so that this loop keeps serving the requests perf_analyzer makes. `-s 100` accepts any
    # latency spread between windows: on a busy 2-core machine stability is not what is tested here.
    rows = await asyncio.to_thread(
        run_perf_analyzer, "cnn", url, "grpc", (1, 2), ["-p", "300", "-s", "100", "--verbose-csv"], 120.0
    )
    assert [row["concurrency"] for row in rows] == [1, 2]
    assert all(row["infer_per_s"] > 0 and row["p99_us"] >= row["p50_us"] > 0 for row in rows)
    # Server-side columns appear only when perf_analyzer read our ModelStatistics; it reports
    # per-request averages in microseconds of what _Echo recorded (2,000 ns of compute_infer).
    assert all(row["server_compute_infer"] == 2 for row in rows)
    assert stats.to_json("cnn")["execution_count"] > 0
