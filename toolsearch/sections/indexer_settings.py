"""The indexer section: where it listens, what embeds, how it ranks, probes and keeps its state.

docs/configuration.md documents every key; docs/retrieval.md the search settings' defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from toolsearch.sections.settings import Section, check_listen
from toolsearch.sections.state_url import check_state_url

# all-MiniLM-L6-v2 fine-tuned on the public training corpus (`toolsearch model train`), made beside it
# by `toolsearch model prepare` (docs/retrieval.md); the untrained model stays selectable by its folder
TUNED_MODEL_NAME = "all-MiniLM-L6-v2-tools"
BASE_MODEL_NAME = "all-MiniLM-L6-v2"  # the packaged model, as published

DEFAULT_FIND_TOOL_DESCRIPTION = (
    "Find the tools that can do a task. Describe the task in plain words (tool_description), "
    "optionally add keywords, and get back the best matching tools with their full input schemas. "
    "Then run one of them with call_tool."
)


class Naming(Section):
    """How tool names are made unique across backends."""

    # on_collision: prefix only the names that more than one backend uses; always: prefix every name
    prefix: Literal["on_collision", "always"] = "on_collision"
    separator: str = Field(default="_", pattern=r"^[A-Za-z0-9_.-]{0,3}$")


class Search(Section):
    """find_tool's ranking and answer settings."""

    default_limit: int = Field(default=8, ge=1, le=50)
    max_limit: int = Field(default=50, ge=1, le=200)
    # None keeps the tuned defaults of indexer.search.SearchSettings (docs/retrieval.md)
    dense_weight: float | None = Field(default=None, ge=0)
    lexical_weight: float | None = Field(default=None, ge=0)
    min_score: float | None = None
    max_query_chars: int = Field(default=4096, ge=16)
    find_tool_description: str = DEFAULT_FIND_TOOL_DESCRIPTION
    compact: bool = False  # find_tool's default for `compact`: trimmed definitions, input schemas whole
    # the second stage shipped for the served model (docs/retrieval.md, "The second stage"): it reads
    # the first stage's best candidates again, bands them and says when nothing fits; false: cosine bands
    second_stage: bool = True

    @model_validator(mode="after")
    def _limits(self) -> Search:
        if self.default_limit > self.max_limit:
            raise ValueError("default_limit must not exceed max_limit")
        return self


class CircuitBreaker(Section):
    enabled: bool = False
    cooldown: float = Field(default=30.0, gt=0)  # seconds a dead backend goes unprobed


class Health(Section):
    """Backend health probing."""

    enabled: bool = True
    interval: float = Field(default=10.0, gt=0)
    timeout: float = Field(default=5.0, gt=0)
    unhealthy_after: int = Field(default=3, ge=1)
    degraded_latency: float = Field(default=2.0, gt=0)
    max_concurrent_probes: int = Field(default=16, ge=1)  # probes in flight at once, over all backends
    circuit_breaker: CircuitBreaker = CircuitBreaker()


class IndexerTls(Section):
    """Mutual TLS on the indexer's gRPC port: its certificate, and the CA its clients' must chain to."""

    cert: Path  # PEM: the indexer's certificate (chain)
    key: Path  # PEM: its private key
    client_ca: Path  # PEM: only clients presenting a certificate this CA signed get a connection


class IndexerClientTls(Section):
    """Mutual TLS from the router to the indexer: the CA to trust, and the router's own certificate."""

    ca: Path  # PEM: the CA the indexer's certificate must chain to
    cert: Path  # PEM: the router's client certificate (chain)
    key: Path  # PEM: its private key
    server_name: str | None = None  # the name to check in the indexer's certificate (default: the host)


class Indexer(Section):
    listen: str = "127.0.0.1:50051"
    model: Path = Path("models") / TUNED_MODEL_NAME
    # what embeds texts: the model's ONNX export in ONNX Runtime, or sentence-transformers on torch
    embedder: Literal["onnx", "torch"] = "onnx"
    model_threads: int | None = Field(default=None, ge=1)  # model threads; None: every CPU it may use
    cache_dir: Path = Path(".toolsearch/cache")
    # memory, redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,...]/SERVICE[/DB] (docs/kubernetes.md)
    state: str = "memory"
    state_password_env: str | None = None  # the variable holding the Redis servers' password
    state_sentinel_password_env: str | None = None  # the variable holding the sentinels' own, if any
    # Redis replicas that must hold a new session before `initialize` is answered (WAIT); 0: none
    state_acks: int = Field(default=0, ge=0, le=16)
    session_ttl: float = Field(default=86_400.0, ge=1)  # seconds a session lives after its last use
    lease_ttl: float = Field(default=10.0, ge=0.5, le=300)  # redis state: the lease's time to live
    metrics_listen: str | None = None  # HOST:PORT of the Prometheus endpoint; None serves none
    discovery_timeout: float = Field(default=10.0, gt=0)
    max_sessions_per_principal: int = Field(default=100, ge=0)  # 0: no limit
    max_sessions: int = Field(default=20_000, ge=1)  # live sessions over every principal, anonymous included
    shutdown_grace: float = Field(default=10.0, ge=0)  # seconds in-flight calls get after SIGTERM
    # seconds a router's connection lives before the indexer asks it to reconnect (and resolve the
    # replicas' names again); 0 keeps connections for ever
    connection_max_age: float = Field(default=120.0, ge=0)
    shared_secret_env: str | None = None  # the variable holding the secret callers must present
    tls: IndexerTls | None = None  # mutual TLS on the gRPC port
    naming: Naming = Naming()
    search: Search = Search()
    health: Health = Health()

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))
    _metrics_listen = field_validator("metrics_listen")(
        classmethod(lambda cls, v: None if v is None else check_listen(v))
    )

    _state = field_validator("state")(classmethod(lambda cls, v: check_state_url(v)))
