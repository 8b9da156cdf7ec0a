# syntax=docker/dockerfile:1.7
# BatchPilot serving runtime: `batchpilot serve`, run by KServe from the chart's (Cluster)ServingRuntime.
# Build from the repository root (BuildKit):
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/batchpilot/runtime:0.1.0 .
# CUDA: the base image carries the NVIDIA container-runtime settings; the PyPI torch wheel pinned in pyproject.toml
# bundles its CUDA libraries, and the node's driver is mounted by the NVIDIA container toolkit. The same image runs
# on CPU-only nodes. For releases pin the base by digest as well (tag@sha256:...).
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HOME=/tmp \
    PATH=/opt/venv/bin:$PATH

# Ubuntu 24.04's Python (3.12; the package needs >=3.10) in a venv, and the unprivileged user the chart runs as.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && groupadd --gid 10001 batchpilot \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin batchpilot

# The base dependencies and the `runtime` extra exactly as pyproject.toml lists them (torch==2.13.0, kserve==0.21.0,
# ...; no kopf), in their own layer.
RUN --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=docker/requirements.py,target=/src/requirements.py \
    python /src/requirements.py /src/pyproject.toml runtime > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The package itself (src/batchpilot); the sources stay out of the image.
RUN --mount=type=bind,target=/src,rw pip install --no-deps /src

USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["batchpilot"]
CMD ["serve", "--model-repository", "/mnt/models", "--http-port", "8080", "--grpc-port", "8081"]
