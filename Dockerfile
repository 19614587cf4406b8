# syntax=docker/dockerfile:1
# One image for every role: the command picks it (indexer, router, catalog-server, health, ...).
#   docker build -t toolsearch .
#   docker run --rm toolsearch --help
# docker-compose.yml runs the whole stack from it; docs/scaling.md describes that stack.

# --- builder: the project and its dependencies in a virtualenv, copied whole into the final stage
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch's Linux wheels on PyPI bundle CUDA libraries (several GB) that a CPU embedder never loads;
# PyTorch's CPU index serves the same release built for CPU only. Installed first, it satisfies the
# torch pin of pyproject.toml (kept equal to this), so `pip install .` takes the rest from PyPI.
ARG TORCH_VERSION=2.13.0
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY toolsearch/ toolsearch/
COPY router/ router/
COPY indexer/ indexer/
COPY commands/ commands/
RUN pip install . && pip check

# --- final: the virtualenv, the example catalog and the containers' configuration; no build tools
FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1
# the model comes from a mounted folder; /var/cache/toolsearch is where the embedding cache volume goes,
# owned by the service user so a fresh named volume inherits that owner
RUN useradd --system --uid 10001 --user-group --create-home --shell /usr/sbin/nologin toolsearch \
    && mkdir -p /app/models /var/cache/toolsearch \
    && chown toolsearch:toolsearch /var/cache/toolsearch
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY examples/ /app/examples/
COPY docker/toolsearch.yaml /app/docker/toolsearch.yaml
USER toolsearch
# router, indexer (gRPC), indexer metrics, catalog server
EXPOSE 8000 50051 9464 9100
ENTRYPOINT ["toolsearch"]
CMD ["--help"]
