"""The indexer section: where it listens, what embeds, how it ranks, probes and keeps its state.

docs/configuration.md documents every key; docs/retrieval.md the search settings' defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from toolsearch.sections.settings import Section, check_http_url, check_listen
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


class CircuitBreakerSettings(Section):
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
    circuit_breaker: CircuitBreakerSettings = CircuitBreakerSettings()


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


EMBEDDER_NAMES = ("onnx", "torch")  # the models in process; a mapping names an inference server


class MatchBands(Section):
    """Where a match turns from weak to possible and from possible to strong (cosine similarities)."""

    strong: float = Field(ge=-1, le=1)
    possible: float = Field(ge=-1, le=1)

    @model_validator(mode="after")
    def _order(self) -> MatchBands:
        if self.possible > self.strong:
            raise ValueError("possible must not exceed strong")
        return self


class EmbeddingServer(Section):
    """An inference server speaking the OpenAI-compatible embeddings API (TEI, Infinity, vLLM, Ollama).

    docs/configuration.md, "The embedder", says what each key does and docs/scaling.md how to run one.
    """

    # the API's base URL as OpenAI's clients take it: texts are posted to <url>/embeddings
    url: str
    model: str = Field(min_length=1, max_length=256)  # the model asked for in every request
    api_key_env: str | None = None  # the variable holding the API key (sent as a bearer token)
    batch_size: int = Field(default=32, ge=1, le=2048)  # texts per request
    timeout: float = Field(default=30.0, gt=0, le=600)  # seconds for one request of tool texts
    # seconds a find_tool waits for its query's vectors before it answers from the lexical arm
    query_timeout: float = Field(default=2.0, gt=0, le=60)
    retry_interval: float = Field(default=5.0, gt=0, le=300)  # seconds between checks while it is down
    # tokens the served model reads of one text; None: the model folder's, when indexer.model has one,
    # else 256
    max_tokens: int | None = Field(default=None, ge=8, le=32_768)
    # the served model's match bands (`toolsearch bands --calibrate`); None: the project's own when it
    # serves one of them, else all-MiniLM-L6-v2's
    bands: MatchBands | None = None

    _url = field_validator("url")(classmethod(lambda cls, v: check_http_url(v).rstrip("/")))


class QueryBatching(Section):
    """How concurrent find_tool queries share model calls (docs/performance.md, "Queries batched")."""

    enabled: bool = True  # queries arriving together share one model call; false: one query a call
    max_texts: int = Field(default=64, ge=1, le=1024)  # query texts in one model call at most
    # a call's padded size at most (texts x the longest, in characters), beyond its first query
    max_chars: int = Field(default=1024, ge=1, le=1_000_000)


class Indexer(Section):
    listen: str = "127.0.0.1:50051"
    model: Path = Path("models") / TUNED_MODEL_NAME
    # what embeds texts: the model's ONNX export in ONNX Runtime, sentence-transformers on torch, or
    # an inference server speaking the OpenAI-compatible embeddings API
    embedder: Literal["onnx", "torch"] | EmbeddingServer = "onnx"
    model_threads: int | None = Field(default=None, ge=1)  # model threads; None: every CPU it may use
    query_batching: QueryBatching = QueryBatching()
    cache_dir: Path = Path(".toolsearch/cache")
    # memory, redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,...]/SERVICE[/DB] (docs/kubernetes.md)
    state: str = "memory"
    state_password_env: str | None = None  # the variable holding the Redis servers' password
    state_sentinel_password_env: str | None = None  # the variable holding the sentinels' own, if any
    # Redis replicas that must hold a new session before `initialize` is answered (WAIT); 0: none
    state_acks: int = Field(default=0, ge=0, le=16)
    session_ttl: float = Field(default=86_400.0, ge=1)  # seconds a session lives after its last use
    lease_ttl: float = Field(default=10.0, ge=0.5, le=300)  # redis state: the lease's time to live
    # HOST:PORT of the plain HTTP port for probes and scrapes: /healthz, /readyz, /metrics, outside
    # the gRPC port's TLS and shared secret (indexer/api/probes.py); None serves none
    health_listen: str | None = None
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

    @field_validator("embedder", mode="before")
    @classmethod
    def _embedder(cls, value: object) -> object:
        """A name or a server's mapping, each with one error of its own (not both sides of the union)."""
        if isinstance(value, dict):
            try:
                return EmbeddingServer.model_validate(value)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: "
                    + (
                        "unknown key"
                        if e["type"] == "extra_forbidden"
                        else e["msg"].removeprefix("Value error, ")
                    )
                    for e in exc.errors()
                )
                raise ValueError(f"an inference server's settings are wrong: {problems}") from None
        if isinstance(value, str) and value not in EMBEDDER_NAMES:
            raise ValueError(
                f"must be {' or '.join(EMBEDDER_NAMES)}, or a mapping naming an inference server "
                f"(url, model), got {value!r}"
            )
        return value

    _health_listen = field_validator("health_listen")(
        classmethod(lambda cls, v: None if v is None else check_listen(v))
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "metrics_listen" in data:
            raise ValueError(
                "metrics_listen is now health_listen (the port serves /healthz and /readyz beside "
                "/metrics): rename the key"
            )
        return data

    _state = field_validator("state")(classmethod(lambda cls, v: check_state_url(v)))
