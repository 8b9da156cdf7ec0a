# syntax=docker/dockerfile:1.7
# BatchPilot operator: `batchpilot operator`, run by the chart's Deployment.
# Build from the repository root (BuildKit):
#   docker build -f docker/operator.Dockerfile -t ghcr.io/batchpilot/operator:0.1.0 .
# For releases pin the base by digest as well (tag@sha256:...).
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv \
 && groupadd --gid 10001 batchpilot \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin batchpilot

# The base dependencies and the `operator` extra exactly as pyproject.toml lists them (no torch, no kserve: the
# operator never runs a model), in their own layer.
RUN --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=docker/requirements.py,target=/src/requirements.py \
    python /src/requirements.py /src/pyproject.toml operator > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The package itself; the sources stay out of the image.
RUN --mount=type=bind,target=/src,rw pip install --no-deps /src

USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["batchpilot"]
CMD ["operator", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "--standalone"]
