"""The configuration file: one YAML document for the router, the indexer, backends and catalog servers.

Every key is documented in docs/configuration.md. `load_config` is the only reader: it validates
the file, resolves relative paths against the file's folder, applies `TOOLSEARCH_*` environment
overrides, and expands catalog servers into backends. A wrong or missing field raises `ConfigError`
naming the field and the file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from toolsearch.catalog import CatalogError, group_by_server, load_catalog
from toolsearch.mcp_servers import ServersFileError, read_servers_file

DEFAULT_FIND_TOOL_DESCRIPTION = (
    "Find the tools that can do a task. Describe the task in plain words (tool_description), "
    "optionally add keywords, and get back the best matching tools with their full input schemas. "
    "Then run one of them with call_tool."
)

BackendId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
# What one backend answer may weigh: a tool result (router) or a tools/list page (indexer).
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class ConfigError(ValueError):
    """Raised when the configuration file is missing, not YAML, or has a wrong or missing field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, got {value!r}")
    return value


def _check_http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _check_host_pattern(value: str) -> str:
    # HOST, HOST:PORT, HOST:* or [IPv6]:PORT as a Host header carries it; "*" turns the check off
    if value == "*":
        return value
    bare_ipv6 = value.count(":") > 1 and not value.startswith("[")  # an IPv6 address needs brackets
    if not value or bare_ipv6 or any(c in value for c in "/ \t@?#"):
        raise ValueError(f"must be HOST, HOST:PORT or HOST:* (as in a Host header), got {value!r}")
    return value.lower()


def _check_origin_pattern(value: str) -> str:
    # scheme://HOST[:PORT] or scheme://HOST:* as browsers send it, "null", or "*" for any origin
    if value in ("*", "null"):
        return value
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
        raise ValueError(f"must be an origin like http://HOST:PORT (no path), got {value!r}")
    return value.lower()


def _check_pinned(value: str) -> str:
    backend, sep, tool = value.partition("/")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", backend) or not tool or "/" in tool:
        raise ValueError(f'must be "BACKEND/TOOL" or "BACKEND/*", got {value!r}')
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


# `${NAME}` in a stdio backend's env values: the bridge substitutes the variable when it starts
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the keys only a stdio backend (`command`) may set, with their defaults
_STDIO_DEFAULTS: dict[str, object] = {
    "args": [],
    "env": {},
    "cwd": None,
    "isolation": "shared",
    "max_processes": 8,
    "idle_timeout": 300.0,
}


def _check_env_values(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if "${" in ENV_REFERENCE.sub("", value):
            raise ValueError(f"{name}: write an environment variable as ${{NAME}} (letters, digits, _)")
    return env


class Backend(_Model):
    """A backend MCP server: an HTTP endpoint (`url`), or a stdio server the bridge runs (`command`).

    A stdio backend's `url` is not written in the file: `load_config` derives it from the `bridge`
    section (`bridge_url`), so everything but the bridge reaches it like any HTTP backend.
    """

    id: BackendId
    # a stdio server, configured as MCP clients configure one (before url: url's check reads it)
    command: str | None = None
    url: str = Field(default="", validate_default=True)
    # how `url` speaks MCP: Streamable HTTP, or the legacy HTTP+SSE transport (protocol 2024-11-05)
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    args: list[str] = []
    env: dict[str, str] = {}  # merged over a minimal inherited environment; values may hold ${NAME}
    cwd: Path | None = None
    # shared: one process serves every session; per_session: one process per bridge session
    isolation: Literal["shared", "per_session"] = "shared"
    max_processes: int = Field(default=8, ge=1, le=1000)  # per_session: processes alive at once
    idle_timeout: float = Field(default=300.0, gt=0)  # per_session: seconds before an idle one ends
    auth: BackendAuth = BackendAuth()
    timeout: float = Field(default=30.0, gt=0)  # seconds, for each call to this backend
    # bytes of one answer (a call result, a tools/list page); a larger one is refused while it is read
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024)

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env_values(v)))

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str, info: ValidationInfo) -> str:
        command = info.data.get("command")
        if not value and command is None:
            raise ValueError("needs url (an HTTP MCP endpoint) or command (a stdio server to run)")
        if value and command is not None:
            raise ValueError("url and command: give one (url for an HTTP server, command for a stdio server)")
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name the program to run")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Backend:
        # Judged by value, not by which keys were written: parse_config validates its own dumps again.
        if self.command is None:
            if given := [key for key, default in _STDIO_DEFAULTS.items() if getattr(self, key) != default]:
                raise ValueError(f"{', '.join(given)}: for stdio backends (command) only")
        elif self.transport != "streamable_http":
            raise ValueError("transport: for url backends only (the bridge serves stdio servers)")
        return self

    @property
    def stdio(self) -> bool:
        """Whether the bridge runs this backend as a child process."""
        return self.command is not None


class CatalogServer(_Model):
    """A catalog server `toolsearch up` starts, serving every server of a catalog file."""

    catalog: Path
    listen: str = "127.0.0.1:9100"
    register_backends: bool = True  # add each server of the catalog as a backend
    require_jwt: list[str] = []  # servers that require a bearer JWT; their backends use passthrough auth
    backend_timeout: float = Field(default=30.0, gt=0)  # the registered backends' call timeout
    backend_max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024)

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))


class Bridge(_Model):
    """The bridge: stdio backends run as its children, each served on loopback as Streamable HTTP."""

    listen: str = "127.0.0.1:9200"  # HOST:PORT the bridge serves /<backend id>/mcp on
    url: str | None = None  # where indexers and routers reach it; None: http://LISTEN
    start_timeout: float = Field(default=30.0, gt=0)  # seconds to start and answer initialize
    max_sessions: int = Field(default=1000, ge=1)  # open MCP sessions per backend; more get 503
    session_idle_timeout: float = Field(default=600.0, gt=0)  # seconds before an unused session ends
    max_restart_delay: float = Field(default=30.0, gt=0)  # the longest pause between restarts
    shutdown_grace: float = Field(default=10.0, ge=0)  # seconds requests get after SIGTERM

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))
    _url = field_validator("url")(
        classmethod(lambda cls, v: None if v is None else _check_http_url(v).rstrip("/"))
    )

    def base_url(self) -> str:
        """The URL every stdio backend's endpoint starts with (a wildcard listen host: loopback)."""
        if self.url is not None:
            return self.url
        host, _, port = self.listen.rpartition(":")
        if host in ("0.0.0.0", "::", "[::]", ""):
            host = "127.0.0.1"
        return f"http://{host}:{port}"


def bridge_url(bridge: Bridge, backend_id: str) -> str:
    """Where the bridge serves one stdio backend: its `url` as the rest of the stack sees it."""
    return f"{bridge.base_url()}/{backend_id}/mcp"


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
    compact: bool = False  # find_tool's default for `compact`: trimmed definitions, input schemas whole

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
    # what embeds texts: the model's ONNX export in ONNX Runtime, or sentence-transformers on torch
    embedder: Literal["onnx", "torch"] = "onnx"
    model_threads: int | None = Field(default=None, ge=1)  # model threads; None: every CPU it may use
    cache_dir: Path = Path(".toolsearch/cache")
    state: str = "memory"
    session_ttl: float = Field(default=86_400.0, ge=1)  # seconds a session lives after its last use
    lease_ttl: float = Field(default=10.0, ge=0.5, le=300)  # redis state: the lease's time to live
    metrics_listen: str | None = None  # HOST:PORT of the Prometheus endpoint; None serves none
    discovery_timeout: float = Field(default=10.0, gt=0)
    max_sessions_per_principal: int = Field(default=100, ge=0)  # 0: no limit
    max_sessions: int = Field(default=20_000, ge=1)  # live sessions over every principal, anonymous included
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
    # RFC 9728 metadata: where clients get tokens (empty: the issuer, when it is an http(s) URL),
    # the scopes to ask for, and this server's resource identifier (None: the URL a request came to)
    authorization_servers: list[str] = []
    scopes: list[str] = []
    resource: str | None = None

    _urls = field_validator("authorization_servers")(
        classmethod(lambda cls, v: [_check_http_url(url) for url in v])
    )
    _resource = field_validator("resource")(
        classmethod(lambda cls, v: None if v is None else _check_http_url(v))
    )

    @model_validator(mode="after")
    def _consistent(self) -> RouterAuth:
        jwt_only = {
            "issuer": self.issuer,
            "audience": self.audience,
            "algorithms": self.algorithms,
            "hs256_secret_env": self.hs256_secret_env,
            "jwks_file": self.jwks_file,
            "authorization_servers": self.authorization_servers,
            "scopes": self.scopes,
            "resource": self.resource,
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

    def effective_authorization_servers(self) -> list[str]:
        """Where clients get tokens: as listed, or the issuer when it is an http(s) URL."""
        if self.authorization_servers:
            return list(self.authorization_servers)
        issuer = self.issuer or ""
        return [issuer] if issuer.startswith(("http://", "https://")) else []


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
    # DNS rebinding guard (router/origins.py): empty keeps the defaults the listen address implies
    allowed_hosts: list[str] = []
    allowed_origins: list[str] = []
    # the front door's bounds (router/connections.py)
    max_connections: int = Field(default=1000, ge=1)  # open client connections; more are answered 503
    header_timeout: float = Field(default=10.0, gt=0)  # seconds until a request's head has arrived
    body_timeout: float = Field(default=30.0, gt=0)  # seconds for a request's whole body
    keep_alive_timeout: float = Field(default=5.0, gt=0)  # seconds an idle connection stays open
    max_connections_per_backend: int = Field(default=100, ge=1)  # each backend's own pool
    # tools advertised in tools/list beside the meta-tools: "backend/tool" or "backend/*" (docs/router.md)
    pinned: list[str] = []

    _listen = field_validator("listen")(classmethod(lambda cls, v: _check_listen(v)))
    _pinned = field_validator("pinned")(classmethod(lambda cls, v: [_check_pinned(p) for p in v]))
    _hosts = field_validator("allowed_hosts")(classmethod(lambda cls, v: [_check_host_pattern(h) for h in v]))
    _origins = field_validator("allowed_origins")(
        classmethod(lambda cls, v: [_check_origin_pattern(o) for o in v])
    )

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
    bridge: Bridge = Bridge()
    backends: list[Backend] = []
    # mcpServers JSON files (Claude Desktop, Cursor, VS Code) whose servers become backends too
    backends_from: list[Path] = []
    catalog_servers: list[CatalogServer] = []

    @field_validator("backends_from", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

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
        "TOOLSEARCH_INDEXER_EMBEDDER": ("indexer", "embedder"),
        "TOOLSEARCH_INDEXER_METRICS_LISTEN": ("indexer", "metrics_listen"),
        "TOOLSEARCH_BRIDGE_LISTEN": ("bridge", "listen"),
        "TOOLSEARCH_BRIDGE_URL": ("bridge", "url"),
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
    _add_imported_backends(raw, path)
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
                    max_response_bytes=server.backend_max_response_bytes,
                )
            )
    try:
        resolved = Config.model_validate(
            {
                "router": router.model_dump(),
                "indexer": indexer.model_dump(),
                "bridge": config.bridge.model_dump(),
                "backends": [b.model_dump() for b in backends],
                "backends_from": [_resolve(base, file.expanduser()) for file in config.backends_from],
                "catalog_servers": [s.model_dump() for s in servers],
            }
        )
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, path)) from None
    return _with_stdio_urls(resolved, base)


def _add_imported_backends(raw: dict[str, object], path: Path) -> None:
    """Append the servers of `backends_from` files to `raw`'s backends; a bad entry names its file."""
    files = raw.get("backends_from") or []
    files = [files] if isinstance(files, str) else files
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return  # validation reports the key's type
    backends = raw.get("backends") or []
    if not isinstance(backends, list):
        return
    taken = {b.get("id") for b in backends if isinstance(b, dict)}
    for file in files:
        source = _resolve(path.parent, Path(file).expanduser())
        try:
            servers = read_servers_file(source)
        except ServersFileError as exc:
            raise ConfigError(str(exc)) from None
        for server in servers:
            try:
                Backend.model_validate(server.backend)
            except ValidationError as exc:
                error = exc.errors()[0]
                key = ".".join(str(part) for part in error["loc"])
                message = error["msg"].removeprefix("Value error, ")
                raise ConfigError(f"{source}: {server.where}{'.' + key if key else ''}: {message}") from None
            if server.backend["id"] in taken:
                raise ConfigError(
                    f"{source}: {server.where}: backend id {server.backend['id']!r} is already in use"
                )
            taken.add(server.backend["id"])
            backends.append(server.backend)
    raw["backends"] = backends


def _with_stdio_urls(config: Config, base: Path) -> Config:
    """`config` with each stdio backend's cwd resolved and its url pointing at the bridge."""
    if not any(backend.stdio for backend in config.backends):
        return config
    backends = [
        backend.model_copy(
            update={
                "url": bridge_url(config.bridge, backend.id),
                "cwd": None if backend.cwd is None else _resolve(base, backend.cwd),
            }
        )
        if backend.stdio
        else backend
        for backend in config.backends
    ]
    return config.model_copy(update={"backends": backends})


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
