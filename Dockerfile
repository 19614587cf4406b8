# syntax=docker/dockerfile:1
# Three images from one file, chosen by the ROLE build argument (docs/scaling.md, "Images"):
#   docker build -t toolsearch .                                  # indexer (ONNX Runtime, no torch); runs every role
#   docker build --build-arg ROLE=router -t toolsearch-router .   # router, catalog server, health: the base install
#   docker build --build-arg ROLE=bridge -t toolsearch-bridge .   # the bridge and its stdio servers (STDIO_SERVERS)
#   docker build --build-arg INDEXER_EXTRAS=indexer,torch -t toolsearch .   # also indexer.embedder: torch
#   docker run --rm toolsearch --help
# The command picks the role (indexer, router, catalog-server, health, ...). docker-compose.yml runs
# the whole stack from the three images; docs/scaling.md describes that stack. One image serves
# several roles on different ports, so the healthcheck is set where the role is known, in compose:
#   python -m commands.health_check grpc 127.0.0.1:50051            # the indexer
#   python -m commands.health_check http http://127.0.0.1:8000/readyz   # a router
ARG ROLE=indexer
# The base image, pinned to a Python release and a Debian release, so that a build a year from now
# is the build of today; a release moves it on purpose. Pin a digest too where builds must be
# bit-for-bit: --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- the base install, in a virtualenv: the shared base, the router, the catalog server, the commands
FROM ${PYTHON_IMAGE} AS builder-router
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY toolsearch/ toolsearch/
COPY router/ router/
COPY indexer/ indexer/
COPY bridge/ bridge/
COPY commands/ commands/
RUN pip install . && pip check

# --- the bridge's: the base install and the stdio MCP servers it runs (pip packages)
FROM builder-router AS builder-bridge
ARG STDIO_SERVERS="mcp-server-time==2026.10.19"
RUN pip install ${STDIO_SERVERS} && pip check

# --- the indexer's extras on top: ONNX Runtime, the tokenizer, FAISS, BM25, Redis
FROM builder-router AS builder-indexer
ARG INDEXER_EXTRAS=indexer
# torch's Linux wheels on PyPI bundle CUDA libraries (several GB) that a CPU embedder never loads;
# PyTorch's CPU index serves the same release built for CPU only. Installed first, it satisfies the
# torch pin of pyproject.toml (kept equal to this), so the extras take the rest from PyPI. Only an
# image with the torch or model extra installs torch at all.
ARG TORCH_VERSION=2.13.0
RUN case ",${INDEXER_EXTRAS}," in \
      *,torch,*|*,model,*|*,dev,*) \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" ;; \
    esac
RUN pip install ".[${INDEXER_EXTRAS}]" && pip check

FROM builder-${ROLE} AS venv

# --- final: the virtualenv, the example catalog and the containers' configuration; no build tools
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1
# the model comes from a mounted folder; /var/cache/toolsearch is where the embedding cache volume goes,
# owned by the service user so a fresh named volume inherits that owner
RUN useradd --system --uid 10001 --user-group --create-home --shell /usr/sbin/nologin toolsearch \
    && mkdir -p /app/models /var/cache/toolsearch \
    && chown toolsearch:toolsearch /var/cache/toolsearch
COPY --from=venv /opt/venv /opt/venv
WORKDIR /app
COPY examples/ /app/examples/
COPY docker/toolsearch.yaml /app/docker/toolsearch.yaml
USER toolsearch
# router (MCP, health), indexer (gRPC, health), catalog server
EXPOSE 8000 8001 50051 9464 9100
ENTRYPOINT ["toolsearch"]
CMD ["--help"]
