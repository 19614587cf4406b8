"""The router section: where it listens, who may call it, how it reaches the indexer, what it bounds.

docs/configuration.md documents every key; docs/auth.md the auth section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from toolsearch.sections.indexer_settings import IndexerClientTls
from toolsearch.sections.settings import (
    Section,
    check_fixed_port,
    check_host_pattern,
    check_http_url,
    check_indexer_address,
    check_listen,
    check_origin_pattern,
    check_pinned,
    port_of,
)

JwtAlgorithm = Literal[
    "HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"
]


class RouterAuth(Section):
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
        classmethod(lambda cls, v: [check_http_url(url) for url in v])
    )
    _resource = field_validator("resource")(
        classmethod(lambda cls, v: None if v is None else check_http_url(v))
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


class Router(Section):
    listen: str = "127.0.0.1:8000"
    # a listener of its own for probes and scrapes: /healthz, /readyz and /metrics, outside the Host
    # and Origin check and the connection limit (docs/router.md, "Health and metrics"); None: none
    health_listen: str | None = None
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
    # DNS rebinding guard (router/frontdoor/origins.py): empty keeps the defaults the listen address implies
    allowed_hosts: list[str] = []
    allowed_origins: list[str] = []
    # the front door's bounds (router/frontdoor/connections.py)
    max_connections: int = Field(default=1000, ge=1)  # open client connections; more are answered 503
    header_timeout: float = Field(default=10.0, gt=0)  # seconds until a request's head has arrived
    body_timeout: float = Field(default=30.0, gt=0)  # seconds for a request's whole body
    # seconds an idle connection stays open: longer than clients keep theirs (docs/reliability.md)
    keep_alive_timeout: float = Field(default=120.0, gt=0)
    max_connections_per_backend: int = Field(default=100, ge=1)  # each backend's own pool
    # tools advertised in tools/list beside the meta-tools: "backend/tool" or "backend/*" (docs/router.md)
    pinned: list[str] = []

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))
    _health_listen = field_validator("health_listen")(
        classmethod(lambda cls, v: None if v is None else check_fixed_port(v))
    )
    _pinned = field_validator("pinned")(classmethod(lambda cls, v: [check_pinned(p) for p in v]))
    _hosts = field_validator("allowed_hosts")(classmethod(lambda cls, v: [check_host_pattern(h) for h in v]))
    _origins = field_validator("allowed_origins")(
        classmethod(lambda cls, v: [check_origin_pattern(o) for o in v])
    )

    @model_validator(mode="after")
    def _ports_apart(self) -> Router:
        if self.health_listen is not None and port_of(self.health_listen) == port_of(self.listen):
            raise ValueError("health_listen needs a port of its own, not listen's")
        return self

    @field_validator("indexer")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one indexer address")
        return [check_indexer_address(v) for v in value]
