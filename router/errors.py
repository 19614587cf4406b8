"""The router's errors: raised where a failure is first seen, translated once for the client.

gRPC failures become these in `router/indexer_client.py`, backend failures in `router/backends.py`.
They reach clients through exactly two translators: `router/meta_tools.py` turns them into tool
results or JSON-RPC errors, `router/session_layer.py` into HTTP responses.

    RouterError
    ├── Unauthenticated             HTTP 401 with WWW-Authenticate
    ├── IndexerUnavailable          HTTP 503 / JSON-RPC internal error
    ├── IndexerFailed               HTTP 502 / JSON-RPC internal error
    ├── SessionNotFound             HTTP 404
    ├── TooManySessions             HTTP 429
    ├── ToolNotFound                tool result, isError
    ├── InvalidRequest              tool result, isError
    └── BackendError                tool result, isError
        ├── BackendUnavailable
        ├── BackendTimeout
        ├── BackendRejected
        └── MissingCredentials
    AuthConfigError                 the router does not start (not a request error)
"""

from __future__ import annotations


class RouterError(Exception):
    """Raised when the router cannot serve a request; the base of every router error."""


class Unauthenticated(RouterError):
    """Raised when an authenticator refuses the caller's credentials."""

    def __init__(self, message: str, www_authenticate: str = "Bearer") -> None:
        super().__init__(message)
        self.www_authenticate = www_authenticate


class IndexerUnavailable(RouterError):
    """Raised when no indexer answers in time: unreachable, starting, stopping, or too slow."""


class IndexerFailed(RouterError):
    """Raised when the indexer answers with an error the contract does not describe."""


class SessionNotFound(RouterError):
    """Raised when a session id is unknown, ended, or bound to another principal."""


class TooManySessions(RouterError):
    """Raised when the caller's principal already holds as many sessions as the indexer allows."""


class ToolNotFound(RouterError):
    """Raised when a tool name is not in the session's current index version."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tool not found: {name}")
        self.name = name


class InvalidRequest(RouterError):
    """Raised when a request's arguments are wrong or break a limit; the message says how to fix it."""


class BackendError(RouterError):
    """Raised when a backend cannot run a tool call; the message names the backend."""

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(f"backend {backend_id} {reason}")
        self.backend_id = backend_id
        self.reason = reason


class BackendUnavailable(BackendError):
    """Raised when a backend refuses the connection, drops it, or answers with a server error."""


class BackendTimeout(BackendError):
    """Raised when a backend does not answer a tool call within its timeout."""

    def __init__(self, backend_id: str, timeout: float) -> None:
        super().__init__(backend_id, f"did not answer within {timeout:g}s")
        self.timeout = timeout


class BackendRejected(BackendError):
    """Raised when a backend answers 401 or 403 to the credentials the call carried."""

    def __init__(self, backend_id: str, status: int) -> None:
        super().__init__(backend_id, f"rejected the credentials (HTTP {status})")
        self.status = status


class MissingCredentials(BackendError):
    """Raised when a call needs credentials the router does not have: no caller token, no secret."""


class AuthConfigError(ValueError):
    """Raised at start when the auth settings or key material cannot verify tokens."""
