#!/usr/bin/env bash
# Installs NVIDIA perf_analyzer into .tools/bin/ (repo-local, gitignored).
# Only the tritonclient 2.41.0 manylinux1 wheel still carries the binary; newer wheels are Python-only.
# At run time it needs Debian's libb64-0d and libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel;
# batchpilot.testing.perfa puts it on LD_LIBRARY_PATH). It runs on the CPU.
# Usage: tools/install-perf-analyzer.sh [PYTHON]   (PYTHON defaults to .venv/bin/python)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$repo/.venv/bin/python}"
version=2.41.0
bin_dir="$repo/.tools/bin"
target="$bin_dir/perf_analyzer"
stamp="$bin_dir/.perf_analyzer-$version"

# perf_analyzer links against Debian's libb64; install it when missing (needs root, as in CI).
if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null; }
  else
    echo "perf_analyzer needs Debian's libb64-0d: sudo apt-get install libb64-0d" >&2
  fi
fi

if [[ -x "$target" && -f "$stamp" ]]; then
  echo "perf_analyzer $version already at $target"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
  --dest "$tmp" "tritonclient==$version"
wheel=("$tmp"/tritonclient-"$version"-*.whl)
mkdir -p "$bin_dir"
# A wheel is a zip; pull out the one member we need without unpacking the rest.
"$python" - "${wheel[0]}" "$target.partial" "tritonclient-$version.data/data/bin/perf_analyzer" <<'PY'
import shutil, sys, zipfile
wheel, dest, member = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
PY
chmod +x "$target.partial"
mv "$target.partial" "$target"   # atomic: a half-written binary is never left at the final path
touch "$stamp"
echo "installed perf_analyzer $version at $target"
