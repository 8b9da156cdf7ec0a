#!/usr/bin/env bash
# The GPU check of issue 13, for a lent machine with CUDA (the device tool's H200), in one run of under 8 minutes:
#   1. the environment: nvidia-smi, and the imports the runtime needs (carried wheels from tools/gpu-wheels.sh);
#   2. the GPU tests (tests/test_gpu_path.py: pinned staging, a copy and a compute stream per model, two batches
#      in flight, outputs back once per batch) and the batcher's tests on that machine;
#   3. bench/gpu_bench.py: a ResNet-50-size CNN and a BERT-base-size encoder (plain torch, random weights), the
#      model alone vs served (REST v2 binary, gRPC), served/raw at the same batch size.
# Everything it reports lands under $OUT (at most 8 files): env.txt, gpu-tests.txt, gpu-bench.md/.json/.log,
# gpu-server.log.
#
# Here, once: tools/gpu-wheels.sh (fills .whl/). Then, with the device tool:
#   run(command="tools/gpu-check.sh", carry=[".whl"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
start=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "carried wheels did not install" | tee "$OUT/env.txt"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PY" - <<'PYEOF'
import importlib, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
missing = []
for name in ["kserve", "fastapi", "uvicorn", "httptools", "orjson", "simdjson", "pydantic", "pytest_asyncio", "grpc"]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        missing.append(f"{name}: {type(exc).__name__}: {exc}")
print("missing:", missing or "none")
sys.exit(1 if missing or not torch.cuda.is_available() else 0)
PYEOF
} >"$OUT/env.txt" 2>&1
env_ok=$?
cat "$OUT/env.txt"
[ $env_ok -eq 0 ] || { echo "environment not ready (see env.txt)"; exit 1; }

echo "== GPU tests"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/test_gpu_path.py tests/test_per_request_cost.py tests/test_batcher.py tests/test_kinds.py 2>&1 \
  | tee "$OUT/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== served/raw benchmark ($(( $(date +%s) - start )) s so far)"
timeout 300 "$PY" bench/gpu_bench.py --seconds 10 --out "$OUT" 2>&1 | tee "$OUT/gpu-bench.log"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc bench rc=$bench_rc, $(( $(date +%s) - start )) s in all"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
