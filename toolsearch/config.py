"""The configuration file: one YAML document for the router, the indexer, backends and catalog servers.

Every key is documented in docs/configuration.md. `load_config` is the only reader: it validates
the file, resolves relative paths against the file's folder, applies `TOOLSEARCH_*` environment
overrides, and expands catalog servers into backends. A wrong or missing field raises `ConfigError`
naming the field and the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolsearch.catalog import CatalogError, group_by_server, load_catalog

DEFAULT_FIND_TOOL_DESCRIPTION = (
    "Find the tools that can do a task. Describe the task in plain words (tool_description), "
    "optionally add keywords, and get back the best matching tools with their full input schemas. "
    "Then run one of them with call_tool."
)

BackendId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class ConfigError(ValueError):
    """Raised when the configuration file is missing, not YAML, or has a wrong or missing field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, got {value!r}")
    return value


def _check_indexer_address(value: str) -> str:
    # dns:///HOST:PORT (or dns://AUTHORITY/HOST:PORT) asks gRPC to resolve every A record and balance
    if value.startswith("dns:"):
        rest = value.removeprefix("dns:")
        if not rest.startswith("//") or "/" not in rest[2:]:
            raise ValueError(f"must be HOST:PORT or dns:///HOST:PORT, got {value!r}")
        _check_listen(rest[2:].partition("/")[2])
        return value
    return _check_listen(value)


class BackendAuth(_Model):
    """How the indexer and router authenticate to one backend."""

    type: Literal["none", "header", "passthrough"] = "none"
    header: str = "Authorization"
    value_env: str | None = None  # for type=header: the environment variable holding the value

    @model_validator(mode="after")
    def _header_needs_env(self) -> BackendAuth:
        if self.type == "header" and not self.value_env:
            raise ValueError("auth type 'header' needs 'value_env', the variable that holds the value")
        return self


class Backend(_Model):
    """A backend MCP server reached over Streamable HTTP."""

    id: BackendId
    url: str
    auth: BackendAuth = BackendAuth()
    timeout: float = Field(default=30.0, gt=0)  # seconds, for each call to this backend

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value


class CatalogServer(_Model):
    """A catalog server `toolsearch up` starts, serving every server of a catalog file."""

    catalog: Path
    listen: str = "127.0.0.1:9100"
    register_backends: bool = True  # add each server of the catalog as a backend
    require_jwt: list[str] = []  # servers that require a bearer JWT; their backends use passthrough auth
    backend_timeout: float = Field(default=30.0, gt=0)  # the registered backends' call timeout

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))


class Naming(_Model):
    """How tool names are made unique across backends."""

    # on_collision: prefix only the names that more than one backend uses; always: prefix every name
    prefix: Literal["on_collision", "always"] = "on_collision"
    separator: str = Field(default="_", pattern=r"^[A-Za-z0-9_.-]{0,3}$")


class Search(_Model):
    """find_tool's ranking and answer settings."""

    default_limit: int = Field(default=8, ge=1, le=50)
    max_limit: int = Field(default=50, ge=1, le=200)
    # None keeps the tuned defaults of indexer.search.SearchSettings (docs/retrieval.md)
    dense_weight: float | None = Field(default=None, ge=0)
    lexical_weight: float | None = Field(default=None, ge=0)
    min_score: float | None = None
    max_query_chars: int = Field(default=4096, ge=16)
    find_tool_description: str = DEFAULT_FIND_TOOL_DESCRIPTION

    @model_validator(mode="after")
    def _limits(self) -> Search:
        if self.default_limit > self.max_limit:
            raise ValueError("default_limit must not exceed max_limit")
        return self


class CircuitBreaker(_Model):
    enabled: bool = False
    cooldown: float = Field(default=30.0, gt=0)  # seconds a dead backend goes unprobed


class Health(_Model):
    """Backend health probing."""

    enabled: bool = True
    interval: float = Field(default=10.0, gt=0)
    timeout: float = Field(default=5.0, gt=0)
    unhealthy_after: int = Field(default=3, ge=1)
    degraded_latency: float = Field(default=2.0, gt=0)
    max_concurrent_probes: int = Field(default=16, ge=1)  # probes in flight at once, over all backends
    circuit_breaker: CircuitBreaker = CircuitBreaker()


class IndexerTls(_Model):
    """Mutual TLS on the indexer's gRPC port: its certificate, and the CA its clients' must chain to."""

    cert: Path  # PEM: the indexer's certificate (chain)
    key: Path  # PEM: its private key
    client_ca: Path  # PEM: only clients presenting a certificate this CA signed get a connection


class IndexerClientTls(_Model):
    """Mutual TLS from the router to the indexer: the CA to trust, and the router's own certificate."""

    ca: Path  # PEM: the CA the indexer's certificate must chain to
    cert: Path  # PEM: the router's client certificate (chain)
    key: Path  # PEM: its private key
    server_name: str | None = None  # the name to check in the indexer's certificate (default: the host)


_TlsModel = TypeVar("_TlsModel", IndexerTls, IndexerClientTls)


class Indexer(_Model):
    listen: str = "127.0.0.1:50051"
    model: Path = Path("models/all-MiniLM-L6-v2")
    model_threads: int | None = Field(default=None, ge=1)  # torch threads; None: every CPU it may use
    cache_dir: Path = Path(".toolsearch/cache")
    state: str = "memory"
    # redis state only: seconds a session lives after its last use, and the lease's time to live
    session_ttl: float = Field(default=86_400.0, ge=1)
    lease_ttl: float = Field(default=10.0, ge=0.5, le=300)
    metrics_listen: str | None = None  # HOST:PORT of the Prometheus endpoint; None serves none
    discovery_timeout: float = Field(default=10.0, gt=0)
    max_sessions_per_principal: int = Field(default=100, ge=0)  # 0: no limit
    shutdown_grace: float = Field(default=10.0, ge=0)  # seconds in-flight calls get after SIGTERM
    shared_secret_env: str | None = None  # the variable holding the secret callers must present
    tls: IndexerTls | None = None  # mutual TLS on the gRPC port
    naming: Naming = Naming()
    search: Search = Search()
    health: Health = Health()

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))
    _metrics_listen = field_validator("metrics_listen")(
        classmethod(lambda cls, v: None if v is None else _check_listen(v))
    )

    @field_validator("state")
    @classmethod
    def _state(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be 'memory' or a redis:// URL")
        return value


JwtAlgorithm = Literal[
    "HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"
]


class RouterAuth(_Model):
    """Who callers are: nobody is authenticated (`anonymous`), or bearer JWTs verified locally (`jwt`)."""

    mode: Literal["anonymous", "jwt"] = "anonymous"
    issuer: str | None = None  # the `iss` every token must carry
    audience: str | None = None  # a value the token's `aud` must contain
    # empty: HS256 when hs256_secret_env is set, RS256 and ES256 when jwks_file is
    algorithms: list[JwtAlgorithm] = []
    hs256_secret_env: str | None = None  # the environment variable holding the HS256 secret
    jwks_file: Path | None = None  # a JSON Web Key Set of public keys (RS*, PS*, ES*)
    leeway: float = Field(default=30.0, ge=0, le=300)  # seconds of clock skew tolerated on exp, nbf, iat

    @model_validator(mode="after")
    def _consistent(self) -> RouterAuth:
        jwt_only = {
            "issuer": self.issuer,
            "audience": self.audience,
            "algorithms": self.algorithms,
            "hs256_secret_env": self.hs256_secret_env,
            "jwks_file": self.jwks_file,
        }
        if self.mode == "anonymous":
            # Without this, keys written for jwt but no `mode: jwt` would leave the router open.
            if given := [key for key, value in jwt_only.items() if value]:
                raise ValueError(f"{', '.join(given)}: for mode jwt only (set mode: jwt to authenticate)")
            return self
        if not self.issuer or not self.audience:
            raise ValueError("mode jwt needs issuer and audience: tokens are checked against both")
        if not self.hs256_secret_env and self.jwks_file is None:
            raise ValueError("mode jwt needs hs256_secret_env (HS256) or jwks_file (RS256, ES256, ...)")
        algorithms = self.effective_algorithms()
        if ("HS256" in algorithms) != bool(self.hs256_secret_env):
            raise ValueError("HS256 and hs256_secret_env go together: list HS256 to use the secret")
        if any(a != "HS256" for a in algorithms) != (self.jwks_file is not None):
            raise ValueError("RS*, PS* and ES* algorithms and jwks_file go together")
        return self

    def effective_algorithms(self) -> list[str]:
        """The algorithms tokens may be signed with: as listed, or implied by the keys given."""
        if self.algorithms:
            return list(dict.fromkeys(self.algorithms))
        implied = ["HS256"] if self.hs256_secret_env else []
        return implied + (["RS256", "ES256"] if self.jwks_file is not None else [])


class Router(_Model):
    listen: str = "127.0.0.1:8000"
    indexer: list[str] = ["127.0.0.1:50051"]  # indexer addresses, tried in turn
    indexer_timeout: float = Field(default=5.0, gt=0)
    # OpenSession may list passthrough backends and build an index version: more than a lookup
    open_session_timeout: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    max_arguments_bytes: int = Field(default=262_144, ge=64)  # call_tool parameters, as compact JSON
    shutdown_grace: float = Field(default=10.0, ge=0)  # seconds in-flight requests get after SIGTERM
    indexer_secret_env: str | None = None  # the variable holding the indexer's shared secret
    indexer_tls: IndexerClientTls | None = None  # mutual TLS to the indexer
    auth: RouterAuth = RouterAuth()

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))

    @field_validator("indexer")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one indexer address")
        return [_check_indexer_address(v) for v in value]


class Config(_Model):
    """The whole file."""

    router: Router = Router()
    indexer: Indexer = Indexer()
    backends: list[Backend] = []
    catalog_servers: list[CatalogServer] = []

    @model_validator(mode="after")
    def _unique_backends(self) -> Config:
        seen: set[str] = set()
        for backend in self.backends:
            if backend.id in seen:
                raise ValueError(f"backend id {backend.id!r} is used twice")
            seen.add(backend.id)
        return self


def _format_error(exc: ValidationError, path: Path) -> str:
    lines = [f"{path}: invalid configuration"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (see docs/configuration.md for the keys)"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def _apply_env(raw: dict[str, object], env: Mapping[str, str]) -> None:
    """Environment overrides for what differs between machines: listen addresses and the indexer's."""
    overrides = {
        "TOOLSEARCH_ROUTER_LISTEN": ("router", "listen"),
        "TOOLSEARCH_INDEXER_LISTEN": ("indexer", "listen"),
        "TOOLSEARCH_INDEXER_STATE": ("indexer", "state"),
        "TOOLSEARCH_INDEXER_CACHE_DIR": ("indexer", "cache_dir"),
        "TOOLSEARCH_INDEXER_MODEL": ("indexer", "model"),
        "TOOLSEARCH_INDEXER_MODEL_THREADS": ("indexer", "model_threads"),
        "TOOLSEARCH_INDEXER_METRICS_LISTEN": ("indexer", "metrics_listen"),
    }
    for name, (section, key) in overrides.items():
        if name in env:
            sub = raw.setdefault(section, {})
            if isinstance(sub, dict):
                sub[key] = env[name]
    if "TOOLSEARCH_INDEXER_ADDRESSES" in env:
        sub = raw.setdefault("router", {})
        if isinstance(sub, dict):
            sub["indexer"] = [a.strip() for a in env["TOOLSEARCH_INDEXER_ADDRESSES"].split(",") if a.strip()]


def _resolve(base: Path, path: Path) -> Path:
    return path if path.is_absolute() else (base / path).resolve()


def _resolve_tls(base: Path, tls: _TlsModel | None) -> _TlsModel | None:
    """A TLS section with its PEM file paths resolved against the configuration file's folder."""
    if tls is None:
        return None
    paths = {name: _resolve(base, value) for name, value in tls if isinstance(value, Path)}
    return tls.model_copy(update=paths)


def parse_config(raw: object, path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Validate a parsed YAML document; paths resolve against `path`'s folder."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (router, indexer, backends)")
    _apply_env(raw, env or {})
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, path)) from None
    base = path.parent
    indexer = config.indexer.model_copy(
        update={
            "model": _resolve(base, config.indexer.model),
            "cache_dir": _resolve(base, config.indexer.cache_dir),
            "tls": _resolve_tls(base, config.indexer.tls),
        }
    )
    servers = [s.model_copy(update={"catalog": _resolve(base, s.catalog)}) for s in config.catalog_servers]
    router = config.router.model_copy(update={"indexer_tls": _resolve_tls(base, config.router.indexer_tls)})
    if router.auth.jwks_file is not None:
        keys = _resolve(base, router.auth.jwks_file)
        router = router.model_copy(update={"auth": router.auth.model_copy(update={"jwks_file": keys})})
    backends = list(config.backends)
    for index, server in enumerate(servers):
        if not server.register_backends:
            continue
        try:
            slugs = group_by_server(load_catalog(server.catalog))
        except CatalogError as exc:
            raise ConfigError(f"{path}: catalog_servers.{index}.catalog: {exc}") from None
        auth = BackendAuth(type="passthrough")
        for slug in slugs:
            backends.append(
                Backend(
                    id=slug[:64],
                    url=f"http://{server.listen}/servers/{slug}/mcp",
                    auth=auth if slug in server.require_jwt else BackendAuth(),
                    timeout=server.backend_timeout,
                )
            )
    try:
        return Config.model_validate(
            {
                "router": router.model_dump(),
                "indexer": indexer.model_dump(),
                "backends": [b.model_dump() for b in backends],
                "catalog_servers": [s.model_dump() for s in servers],
            }
        )
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, path)) from None


def load_config(path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and resolve a configuration file. Entry points pass `os.environ` as `env`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    return parse_config(raw, path, env)
