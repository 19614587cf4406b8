"""Protecting the indexer's gRPC port: a shared secret, mutual TLS, both, or neither.

The indexer's gRPC port carries sessions, and the bearer tokens they list passthrough backends
with, so anything beyond one trusted host should protect it:

- **a shared secret** (`indexer.shared_secret_env`, `router.indexer_secret_env`): every call carries
  `authorization: Bearer <secret>`; the indexer refuses calls without it (indexer/api/access.py). The
  standard health service stays open, so probes need no secret.
- **mutual TLS** (`indexer.tls`, `router.indexer_tls`): the indexer presents its certificate and
  accepts only connections whose client certificate its `client_ca` signed. It applies to the whole
  port, health service included.

Both sides read their material once, at start; a missing variable, a short secret or an unreadable
PEM file raises `TransportConfigError` and the process does not start. Secrets never reach a repr
or a log line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from toolsearch.sections.indexer_settings import Indexer
from toolsearch.sections.router_settings import Router

# the fewest bytes of any shared secret (the link's, a JWT's HS256 key): RFC 7518 §3.2 holds an HS256
# key to the length of its hash, so guessing it is out of reach
MIN_SECRET_BYTES = 32
AUTHORIZATION = "authorization"


class TransportConfigError(ValueError):
    """Raised at start when the link's secret or certificates cannot be read or are unusable."""


def _secret(variable: str, key: str, environ: Mapping[str, str]) -> str:
    value = environ.get(variable, "")
    if not value:
        raise TransportConfigError(f"{key}: the environment variable {variable} is not set")
    if len(value.encode()) < MIN_SECRET_BYTES:
        raise TransportConfigError(
            f"{key}: the secret in {variable} must be at least {MIN_SECRET_BYTES} bytes long"
        )
    return value


def _pem(path: Path, key: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TransportConfigError(f"{key}: cannot read {path} ({exc.strerror})") from None
    if b"-----BEGIN " not in data:
        raise TransportConfigError(f"{key}: {path} is not a PEM file")
    return data


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """How a client reaches the indexer: TLS credentials (None: plaintext) and per-call metadata."""

    credentials: grpc.ChannelCredentials | None = None
    metadata: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # holds the secret
    options: tuple[tuple[str, Any], ...] = ()


def channel_security(router: Router, environ: Mapping[str, str]) -> ChannelSecurity:
    """The router's credentials for the indexer, from `router.indexer_secret_env` and `indexer_tls`."""
    metadata: tuple[tuple[str, str], ...] = ()
    if router.indexer_secret_env:
        secret = _secret(router.indexer_secret_env, "router.indexer_secret_env", environ)
        metadata = ((AUTHORIZATION, f"Bearer {secret}"),)
    tls = router.indexer_tls
    if tls is None:
        return ChannelSecurity(None, metadata)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem(tls.ca, "router.indexer_tls.ca"),
        private_key=_pem(tls.key, "router.indexer_tls.key"),
        certificate_chain=_pem(tls.cert, "router.indexer_tls.cert"),
    )
    options = (("grpc.ssl_target_name_override", tls.server_name),) if tls.server_name else ()
    return ChannelSecurity(credentials, metadata, options)


def aio_channel(
    address: str,
    security: ChannelSecurity,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
) -> grpc.aio.Channel:
    """An asyncio channel to `address`, over TLS when `security` has credentials."""
    merged = [*options, *security.options]
    chained = list(interceptors) or None
    if security.credentials is None:
        return grpc.aio.insecure_channel(address, options=merged, interceptors=chained)
    return grpc.aio.secure_channel(address, security.credentials, options=merged, interceptors=chained)


def sync_channel(address: str, security: ChannelSecurity | None = None) -> grpc.Channel:
    """A blocking channel to `address` (status, health checks); pass `security.metadata` per call."""
    if security is None or security.credentials is None:
        return grpc.insecure_channel(address, options=list(security.options) if security else None)
    return grpc.secure_channel(address, security.credentials, options=list(security.options))


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """What the indexer's port demands: TLS credentials (None: plaintext) and a shared secret."""

    credentials: grpc.ServerCredentials | None = None
    secret: str | None = field(default=None, repr=False)


def server_security(indexer: Indexer, environ: Mapping[str, str]) -> ServerSecurity:
    """The indexer's port protection, from `indexer.shared_secret_env` and `indexer.tls`."""
    secret = None
    if indexer.shared_secret_env:
        secret = _secret(indexer.shared_secret_env, "indexer.shared_secret_env", environ)
    tls = indexer.tls
    if tls is None:
        return ServerSecurity(None, secret)
    credentials = grpc.ssl_server_credentials(
        [(_pem(tls.key, "indexer.tls.key"), _pem(tls.cert, "indexer.tls.cert"))],
        root_certificates=_pem(tls.client_ca, "indexer.tls.client_ca"),
        require_client_auth=True,
    )
    return ServerSecurity(credentials, secret)
