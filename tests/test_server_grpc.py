"""The real server over gRPC with tritonclient, from a separate process (its protos clash with KServe's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reference import assert_close, cv_inputs, expected, nlp_inputs

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "model,name,datatype,make_inputs",
    [
        ("resnet-mini", "image", "FP32", cv_inputs),
        ("textcls", "input_ids", "INT64", nlp_inputs),
    ],
)
def test_grpc_outputs_equal_the_model_run_directly(
    server, demo_repository: Path, tmp_path: Path, model, name, datatype, make_inputs
) -> None:
    arrays = make_inputs(32, seed=7)
    np.savez(tmp_path / "in.npz", *arrays)
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "grpc_client_check.py"),
            f"127.0.0.1:{server[1]}",
            model,
            name,
            datatype,
            str(tmp_path / "in.npz"),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = np.load(tmp_path / "out.npz")
    for i, array in enumerate(arrays):
        got = {key.split(":", 1)[1]: outputs[key] for key in outputs.files if key.startswith(f"{i}:")}
        assert_close(got, expected(demo_repository, model, array))
