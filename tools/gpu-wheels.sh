#!/usr/bin/env bash
# Fetch, here, the wheels tools/gpu-check.sh needs on the lent GPU machine (Python 3.12, no registry there):
# the runtime's dependency closure at the versions this venv holds, less what that machine's image already has
# (the package list in the device library's KINDS.md, kept below). They land in .whl/ (ignored by git through its
# own .gitignore), which the device run carries. grpcio and protobuf travel too although the image has them:
# kserve's generated protobuf code needs the versions it was generated for.
# Usage: tools/gpu-wheels.sh [python]    (the venv's python by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
mkdir -p .whl
echo '*' >.whl/.gitignore
# What the device image already holds (KINDS.md, nvidia-h200, read 2026-11-17).
ON_DEVICE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle filelock frozenlist fsspec h11 httpcore httpx idna iniconfig jinja2
markupsafe multidict numpy packaging pandas pillow pip pluggy prometheus-client propcache psutil pyarrow
pygments pytest pytest-timeout python-dateutil pyyaml requests rich six tabulate torch triton typing-extensions
urllib3 uvloop yarl zipp hypothesis sortedcontainers setuptools wheel nvidia-ml-py mypy-extensions typing-inspect
pytz tzdata markdown-it-py mdurl shellingham typer"
"$PY" - "$ON_DEVICE" <<'PYEOF' >.whl/wanted.txt
import re, sys
from importlib import metadata

have = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1].split()}
roots = ["kserve", "fastapi", "uvicorn", "httptools", "orjson", "pysimdjson", "pydantic", "pytest-asyncio"]
seen, todo = {}, list(roots)
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in seen or name in have:
        continue
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    seen[name] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "sys_platform == \"win32\"" in marker or "platform_system == \"Windows\"" in marker:
            continue
        todo.append(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0])
for name, version in sorted(seen.items()):
    print(f"{name}=={version}")
PYEOF
echo "wheels to fetch: $(wc -l <.whl/wanted.txt)"
PLAT=()
for n in 2_28 2_27 2_17 2014 1; do
  case $n in 2014) PLAT+=(--platform manylinux2014_x86_64) ;; 1) PLAT+=(--platform manylinux1_x86_64) ;; *) PLAT+=(--platform "manylinux_${n}_x86_64") ;; esac
done
for n in 2_24 2_31 2_34 2_35 2_39; do PLAT+=(--platform "manylinux_${n}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d .whl -r .whl/wanted.txt
du -sh .whl
