"""How the router and the indexer present themselves to a backend: the auth header, the MCP session
headers, and the name and version they give at initialize.

Both services call the same backends with the same configured credentials (`backends[].auth`): the
router a client's tools, resources and prompts, the indexer its listings, probes and the DELETE that
ends a backend session. The header they send is computed here once, so the two cannot disagree about
a backend, and the caller's own token goes out in one place only: to a `passthrough` backend. A
`token_exchange` backend gets the token the indexer exchanged the caller's for
(indexer/backends/backend_tokens.py), handed in as `exchanged`, never the caller's.

A header-auth backend whose secret is missing is an error naming the backend and the environment
variable to set (`MissingSecret`), in either service: sent without its header, the call
would only come back as the backend's 401, which says nothing of the cause. Each service translates
the two errors here into its own (router/errors.py, indexer/errors.py).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

# Streamable HTTP's headers: the backend session a request belongs to, and the version it negotiated.
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
ROUTER_CLIENT_NAME = "toolsearch-router"  # the router's name in its initialize's clientInfo


def _package_version() -> str:
    """The installed toolsearch's version; a stand-in when it runs from a checkout not installed."""
    try:
        return importlib.metadata.version("toolsearch")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


VERSION = _package_version()


def client_info(name: str) -> dict[str, str]:
    """The `clientInfo` a service gives at initialize: its name and toolsearch's version."""
    return {"name": name, "version": VERSION}


class AuthSettings(Protocol):
    """What both the configuration's `backends[].auth` and `OutgoingAuth` say of a backend's auth."""

    @property
    def type(self) -> str: ...  # none | header | passthrough | token_exchange

    @property
    def header(self) -> str: ...  # the header to send

    @property
    def value_env(self) -> str | None: ...  # for header: the environment variable holding the value


@dataclass(frozen=True, slots=True)
class OutgoingAuth:
    """How to authenticate to one backend, as the indexer hands it to the router."""

    type: str = "none"
    header: str = "Authorization"
    value_env: str | None = None


class OutgoingAuthError(Exception):
    """Raised when the credentials a backend needs are not at hand; the message says which."""

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(f"backend {backend_id} {reason}")
        self.backend_id = backend_id
        self.reason = reason


class MissingSecret(OutgoingAuthError):
    """Raised for a header-auth backend whose environment variable holds no value.

    `variable` is the one to set, where the service that raised it runs.
    """

    def __init__(self, backend_id: str, variable: str) -> None:
        super().__init__(
            backend_id, f"has no value for its credential: set the environment variable {variable}"
        )
        self.variable = variable


class MissingCallerToken(OutgoingAuthError):
    """Raised for a passthrough or token_exchange backend when the caller presented no bearer token."""

    def __init__(self, backend_id: str) -> None:
        super().__init__(backend_id, "requires the caller's bearer token")


# the auth types whose credentials depend on the caller: such backends are listed per session
CALLER_AUTH = frozenset({"passthrough", "token_exchange"})


def per_caller(auth: AuthSettings) -> bool:
    """Whether a backend's credentials, and so its tools, depend on the caller."""
    return auth.type in CALLER_AUTH


def auth_headers(
    backend_id: str,
    auth: AuthSettings,
    secrets: Mapping[str, str],
    bearer_token: str | None,
    exchanged: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate a request to a backend; never logged.

    `header` sends the value of `auth.value_env` from `secrets` (the service's environment);
    `passthrough` sends the caller's own bearer token; `token_exchange` sends `exchanged`, the token
    minted for the backend in exchange for the caller's, and never `bearer_token`. Raises
    `MissingSecret` or `MissingCallerToken`.
    """
    if auth.type == "token_exchange":
        if not exchanged:
            raise MissingCallerToken(backend_id)
        return {auth.header: f"Bearer {exchanged}"}
    if auth.type == "header":
        variable = auth.value_env or ""
        value = secrets.get(variable)
        if not value:
            raise MissingSecret(backend_id, variable)
        return {auth.header: value}
    if auth.type == "passthrough":
        if not bearer_token:
            raise MissingCallerToken(backend_id)
        return {auth.header: f"Bearer {bearer_token}"}
    return {}
