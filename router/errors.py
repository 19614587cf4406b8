"""The router's errors: raised where a failure is first seen, translated once for the client.

gRPC failures become these in `router/link/indexer_errors.py`, backend failures in
`router/upstream/calls/backends.py`.
They reach clients through one module, `router/error_answers.py`: as HTTP responses (before the SDK's
handlers run), tool results with `isError`, or JSON-RPC errors.

    RouterError
    ├── Unauthenticated             HTTP 401 with WWW-Authenticate
    ├── IndexerUnavailable          HTTP 503 / JSON-RPC internal error
    ├── IndexerFailed               HTTP 502 / JSON-RPC internal error
    ├── SessionNotFound             HTTP 404
    ├── TooManySessions             HTTP 429 with Retry-After
    ├── SessionsFull                HTTP 503 with Retry-After
    ├── ToolNotFound                tool result, isError
    ├── InvalidRequest              tool result, isError
    └── BackendError                tool result, isError
        ├── BackendUnavailable
        ├── BackendTimeout
        ├── BackendRejected
        ├── BackendTooLarge
        ├── BackendSessionGone      (opened again once, transparently, before it reaches anyone)
        ├── BackendAnswered         (its JSON-RPC error: resources/read and prompts/get pass its code on)
        │   └── CapabilityMissing   JSON-RPC error -32021 (HTTP 400 for 2026-07-28), also from call_tool
        ├── MissingCredentials
        ├── ExchangeFailed          (the backend's token endpoint gave no token: the indexer's message)
        └── ExchangeRefused         (the token endpoint refused the caller's token)
    AuthConfigError                 the router does not start (not a request error)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY


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


SESSION_GONE = "session not found: re-initialize"  # what every client of a gone session reads


class SessionNotFound(RouterError):
    """Raised when a session id is unknown, ended, or bound to another principal."""

    def __init__(self, message: str = SESSION_GONE) -> None:
        super().__init__(message)


class TooManySessions(RouterError):
    """Raised when the caller's principal already holds as many sessions as the indexer allows.

    `retry_after`: seconds until one of them expires, unless used (closing one frees room at once).
    """

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionsFull(RouterError):
    """Raised when the indexer holds as many sessions, over every caller, as it allows."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ToolNotFound(RouterError):
    """Raised when a tool name is not in the session's current index version.

    `suggestions` are the session's closest names, as (name, backend id, server title); `reason`
    says why a name that exists cannot be called now (its backend is down).
    """

    def __init__(
        self,
        name: str,
        suggestions: tuple[tuple[str, str, str], ...] = (),
        reason: str = "",
        denied_by: tuple[str, ...] = (),
    ) -> None:
        super().__init__(f"tool not found: {name}")
        self.name = name
        self.suggestions = suggestions
        self.reason = reason
        # the authorization policies that denied the call ("-": none permits it), for the access log
        # and metrics: the client's answer is that of an unknown tool, word for word
        self.denied_by = denied_by


class ItemDenied(RouterError):
    """The authorization policy denies the caller a prompt or a resource: answered as an unknown one
    is; `denied_by` as for `ToolNotFound`."""

    def __init__(self, name: str, denied_by: tuple[str, ...] = ()) -> None:
        super().__init__(f"not found: {name}")
        self.name = name
        self.denied_by = denied_by


class InvalidRequest(RouterError):
    """Raised when a request's arguments are wrong or break a limit; the message says how to fix it."""


class InvalidRequestState(InvalidRequest):
    """Raised when a 2026-07-28 client's retry names no round the router made in its session, or does
    not answer it: a tampered, foreign or ended `requestState`, or `inputResponses` that do not fit.
    The client sent them, not the model, so the answer is the spec's invalid-params error."""


class RouterStopping(RouterError):
    """Raised when the router stops before a request it ran in a task of its own had its answer."""


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


class BackendTooLarge(BackendError):
    """Raised when a backend's answer to a call is larger than the backend's `max_response_bytes`."""

    def __init__(self, backend_id: str, limit: int) -> None:
        super().__init__(
            backend_id,
            f"answered with more than {limit} bytes ({limit / 2**20:.3g} MiB), the most it may send "
            "back: ask for less (narrower parameters), or raise backends[].max_response_bytes for "
            f"{backend_id} in the configuration",
        )
        self.limit = limit


class BackendSessionGone(BackendError):
    """Raised when a backend answers 404 inside a backend session: it restarted and forgot it."""


class CallCancelled(BackendError):
    """Raised when the client cancelled a call while it ran (its `notifications/cancelled`)."""

    def __init__(self, backend_id: str, reason: str | None) -> None:
        because = f": {reason}" if reason else ""
        super().__init__(backend_id, f"did not finish the call: the client cancelled it{because}")


class BackendAnswered(BackendError):
    """Raised when a backend answers a request with a JSON-RPC error; `code` and `data` are its own."""

    def __init__(self, backend_id: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(backend_id, f"answered with an error: {message}")
        self.code = code
        self.message = message
        self.data = data


class CapabilityMissing(BackendAnswered):
    """Raised when a request needs a capability its client did not declare: the backend said so
    (`-32021`), or asked the client for what only that capability answers (sampling, elicitation,
    roots). `required` is the capabilities wanted, as MCP names them (`{"sampling": {}}`)."""

    def __init__(self, backend_id: str, message: str, required: Mapping[str, Any]) -> None:
        super().__init__(
            backend_id, MISSING_REQUIRED_CLIENT_CAPABILITY, message, {"requiredCapabilities": dict(required)}
        )
        self.required = dict(required)


class MissingCredentials(BackendError):
    """Raised when a call needs credentials the router does not have: no caller token, no secret."""


class ExchangeFailed(BackendError):
    """Raised when a token_exchange backend's token endpoint gave no token for the caller's.

    `reason` is the indexer's, which exchanged it: the endpoint, and what went wrong there.
    """

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(backend_id, reason)
        self.args = (f"backend {backend_id}: {reason}",)


class ExchangeRefused(ExchangeFailed):
    """Raised when a token_exchange backend's token endpoint refused to exchange the caller's token."""


class AuthConfigError(ValueError):
    """Raised at start when the auth settings or key material cannot verify tokens."""
