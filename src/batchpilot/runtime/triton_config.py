"""Triton's model configuration (`GET /v2/models/{m}/config`, gRPC `ModelConfig`) for a ModelSpec.

perf_analyzer refuses a server without it and reads `max_batch_size` (items along dim 0; > 0 means
it prepends a batch dimension), `input[]`/`output[]` (dims per item, -1 variable), `platform`,
`dynamic_batching` vs `sequence_batching` and `model_transaction_policy.decoupled`. The JSON uses
Triton's snake_case field names, enum names as strings and plain JSON numbers for 64-bit integers,
as Triton's own HTTP endpoint does; the gRPC side parses this same dict into protobuf messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchpilot.spec.contracts import WEIGHT_FILES
from batchpilot.spec.model import ModelSpec, TensorSpec

_UINT32_MAX = 2**32 - 1


def _tensor_json(tensor: TensorSpec, is_input: bool) -> dict:
    entry: dict = {
        "name": tensor.name,
        # Triton's DataType enum is the v2 datatype name behind "TYPE_" for every type a spec allows.
        "data_type": f"TYPE_{tensor.datatype}",
        "dims": list(tensor.shape),
        "is_shape_tensor": False,
    }
    if is_input:
        entry.update(format="FORMAT_NONE", allow_ragged_batch=False, optional=False)
    return entry


def model_config_json(
    spec: ModelSpec, max_batch_size: int, max_queue_delay_us: int, *, gpus: Sequence[int] = ()
) -> dict:
    """The model configuration Triton would report for `spec` with the batching parameters in force.

    `max_batch_size` and `max_queue_delay_us` are passed in rather than read from the spec because the
    autotuner moves them at run time. `gpus` lists the CUDA devices the model runs on (empty: CPU).
    """
    batching = spec.batching
    policy = batching.default_queue_policy
    return {
        "name": spec.name,
        "platform": "pytorch_libtorch",
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [_tensor_json(t, is_input=True) for t in spec.inputs],
        "output": [_tensor_json(t, is_input=False) for t in spec.outputs],
        "dynamic_batching": {
            # The autotuner may have lowered max_batch_size below a configured preferred size.
            "preferred_batch_size": [s for s in batching.preferred_batch_size if s <= max_batch_size],
            "max_queue_delay_microseconds": max_queue_delay_us,
            "preserve_ordering": batching.preserve_ordering,
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority_level,
            "default_queue_policy": {
                "timeout_action": policy.timeout_action,
                "default_timeout_microseconds": policy.default_timeout_microseconds,
                "allow_timeout_override": policy.allow_timeout_override,
                # Triton's field is uint32; the spec leaves the size unbounded above.
                "max_queue_size": min(policy.max_queue_size, _UINT32_MAX),
            },
            "priority_queue_policy": {},
        },
        "instance_group": [
            {
                "name": spec.name,
                "kind": "KIND_GPU" if gpus else "KIND_CPU",
                # One executor runs the model's batches one after another.
                "count": 1,
                "gpus": list(gpus),
            }
        ],
        "default_model_filename": WEIGHT_FILES[spec.format],
        "model_transaction_policy": {"decoupled": False},
    }
