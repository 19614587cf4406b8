"""The backends section and what serves backends: catalog servers and the bridge of stdio servers.

docs/configuration.md documents every key; docs/gateway.md the stdio keys and the bridge.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from toolsearch.sections.settings import (
    DEFAULT_BACKEND_TIMEOUT,
    DEFAULT_MAX_RESPONSE_BYTES,
    BackendId,
    Section,
    check_http_url,
    check_listen,
)


class BackendAuth(Section):
    """How the indexer and router authenticate to one backend (docs/auth.md has the choices)."""

    type: Literal["none", "header", "passthrough", "token_exchange"] = "none"
    header: str = "Authorization"
    value_env: str | None = None  # for type=header: the environment variable holding the value
    # token_exchange (RFC 8693): where the caller's token is exchanged, and for what
    token_url: str | None = None
    audience: str | None = None
    scopes: list[str] = []
    client_id_env: str | None = None  # the variables holding the client's credentials at token_url
    client_secret_env: str | None = None
    ca_file: Path | None = None  # PEM certificates token_url's TLS is verified with; None: the system's
    timeout: float = Field(default=10.0, gt=0, le=120)  # seconds one exchange may take, in all
    # seconds an exchanged token is taken to live when its answer has no expires_in
    assumed_lifetime: float = Field(default=60.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _keys_of_the_type(self) -> BackendAuth:
        if self.type == "header" and not self.value_env:
            raise ValueError("auth type 'header' needs 'value_env', the variable that holds the value")
        if self.type != "header" and self.value_env:
            raise ValueError(f"value_env: for type header only (this backend's type is {self.type})")
        exchange_only = {
            "token_url": self.token_url,
            "audience": self.audience,
            "scopes": self.scopes,
            "client_id_env": self.client_id_env,
            "client_secret_env": self.client_secret_env,
            "ca_file": self.ca_file,
        }
        if self.type != "token_exchange":
            if given := [key for key, value in exchange_only.items() if value]:
                raise ValueError(f"{', '.join(given)}: for type token_exchange only")
            return self
        missing = [
            k for k in ("token_url", "audience", "client_id_env", "client_secret_env") if not exchange_only[k]
        ]
        if missing:
            raise ValueError(
                f"auth type 'token_exchange' needs {', '.join(missing)} (token_url, audience, "
                "client_id_env and client_secret_env: where to exchange, for what, and as which client)"
            )
        check_token_url(self.token_url or "")
        return self


_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def check_token_url(value: str) -> str:
    """A token endpoint's URL: https, or http on loopback only (it carries the client's secret)."""
    scheme, sep, rest = value.partition("://")
    host = rest.split("/", 1)[0].rpartition("@")[2]
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if scheme == "https" and sep and host:
        return value
    if scheme == "http" and sep and host in _LOOPBACK:
        return value
    raise ValueError(
        f"token_url must be an https:// URL (http:// only on 127.0.0.1, localhost or [::1]: the "
        f"exchange carries the client's secret and the caller's token), got {value!r}"
    )


# `${NAME}` in a stdio backend's env values: the bridge substitutes the variable when it starts
HANDSHAKE: Final = "2025-11-25"  # a stdio backend's protocol unless it says otherwise
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the keys only a stdio backend (`command`) may set, with their defaults
_STDIO_DEFAULTS: dict[str, object] = {
    "args": [],
    "env": {},
    "cwd": None,
    "isolation": "shared",
    "max_processes": 8,
    "idle_timeout": 300.0,
    "protocol": HANDSHAKE,
}


def _check_env_values(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if "${" in ENV_REFERENCE.sub("", value):
            raise ValueError(f"{name}: write an environment variable as ${{NAME}} (letters, digits, _)")
    return env


class Backend(Section):
    """A backend MCP server: an HTTP endpoint (`url`), or a stdio server the bridge runs (`command`).

    A stdio backend's `url` is not written in the file: `load_config` derives it from the `bridge`
    section (`bridge_url`), so everything but the bridge reaches it like any HTTP backend. A legacy
    SSE backend (`transport: sse`) is served by the bridge too, which keeps one event stream per
    session: `load_config` moves its endpoint to `sse_url` and points `url` at the bridge.
    """

    id: BackendId
    # a stdio server, configured as MCP clients configure one (before url: url's check reads it)
    command: str | None = None
    url: str = Field(default="", validate_default=True)
    # how `url` speaks MCP: Streamable HTTP, or the legacy HTTP+SSE transport (protocol 2024-11-05)
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    # a legacy SSE endpoint the bridge holds sessions with, `url` being the bridge's (set on loading)
    sse_url: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}  # merged over a minimal inherited environment; values may hold ${NAME}
    cwd: Path | None = None
    # shared: one process serves every session; per_session: one process per bridge session
    isolation: Literal["shared", "per_session"] = "shared"
    max_processes: int = Field(default=8, ge=1, le=1000)  # per_session: processes alive at once
    idle_timeout: float = Field(default=300.0, gt=0)  # per_session: seconds before an idle one ends
    # the protocol the bridge speaks to the stdio server: the initialize handshake (2025-11-25 and
    # earlier, what every stdio server speaks), or 2026-07-28 for a server written for it, whose
    # requests and results (input-required ones, their request state) then pass through as they are
    protocol: Literal["2025-11-25", "2026-07-28"] = HANDSHAKE
    auth: BackendAuth = BackendAuth()
    timeout: float = Field(default=DEFAULT_BACKEND_TIMEOUT, gt=0)  # seconds, for each call to this backend
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
        elif self.protocol != HANDSHAKE and self.isolation != "shared":
            raise ValueError(
                f"protocol {self.protocol} has no sessions for per_session isolation to key on: "
                "use isolation: shared, or protocol 2025-11-25"
            )
        if self.sse_url is not None:
            check_http_url(self.sse_url)
            if self.command is not None or self.transport != "streamable_http":
                raise ValueError("sse_url: set on loading a transport: sse backend; write url and transport")
        return self

    @property
    def stdio(self) -> bool:
        """Whether the bridge runs this backend as a child process."""
        return self.command is not None

    @property
    def bridged(self) -> bool:
        """Whether the bridge serves this backend: a stdio server, or a legacy SSE server's sessions."""
        return self.command is not None or self.transport == "sse" or self.sse_url is not None


class CatalogServer(Section):
    """A catalog server `toolsearch up` starts, serving every server of a catalog file."""

    catalog: Path
    listen: str = "127.0.0.1:9100"
    register_backends: bool = True  # add each server of the catalog as a backend
    require_jwt: list[str] = []  # servers that require a bearer JWT; their backends use passthrough auth
    # the registered backends' call timeout
    backend_timeout: float = Field(default=DEFAULT_BACKEND_TIMEOUT, gt=0)
    backend_max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024)

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))


class Bridge(Section):
    """The bridge: stdio backends run as its children, each served on loopback as Streamable HTTP."""

    listen: str = "127.0.0.1:9200"  # HOST:PORT the bridge serves /<backend id>/mcp on
    url: str | None = None  # where indexers and routers reach it; None: http://LISTEN
    start_timeout: float = Field(default=30.0, gt=0)  # seconds to start and answer initialize
    max_sessions: int = Field(default=1000, ge=1)  # open MCP sessions per backend; more get 503
    session_idle_timeout: float = Field(default=600.0, gt=0)  # seconds before an unused session ends
    max_restart_delay: float = Field(default=30.0, gt=0)  # the longest pause between restarts
    shutdown_grace: float = Field(default=10.0, ge=0)  # seconds requests get after SIGTERM

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))
    _url = field_validator("url")(
        classmethod(lambda cls, v: None if v is None else check_http_url(v).rstrip("/"))
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
