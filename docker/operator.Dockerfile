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

# Dependencies exactly as pyproject.toml lists them, in their own layer. The operator never runs a model: the
# PyTorch CPU index supplies torch==2.13.0+cpu (about a tenth of the CUDA wheel's size), which pip prefers to the
# plain 2.13.0 it satisfies equally.
RUN --mount=type=bind,source=pyproject.toml,target=/src/pyproject.toml \
    --mount=type=bind,source=docker/requirements.py,target=/src/requirements.py \
    python /src/requirements.py /src/pyproject.toml > /tmp/requirements.txt \
 && pip install --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The package itself; the sources stay out of the image.
RUN --mount=type=bind,target=/src,rw pip install --no-deps /src

USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["batchpilot"]
CMD ["operator", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "--standalone"]
