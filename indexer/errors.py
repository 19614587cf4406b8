"""The indexer's errors, translated to gRPC status codes in one place (`indexer/api/status_codes.py`).

IndexerError
├── SessionNotFound        NOT_FOUND (toolsearch-error: session-not-found)
├── ToolNotFound           NOT_FOUND (toolsearch-error: tool-not-found)
├── InvalidRequest         INVALID_ARGUMENT
│   └── NoCallerToken      (a passthrough backend listed for a caller without a bearer token)
├── TooManySessions        RESOURCE_EXHAUSTED (too-many-sessions: the principal's cap), with a retry hint
│   └── SessionsFull       RESOURCE_EXHAUSTED (sessions-full: the cap on every session)
├── NotReady               UNAVAILABLE
└── BackendError           (never leaves the indexer: a failing backend is left out of a catalog)
    ├── BackendUnavailable
    │   └── ExchangeFailed FAILED_PRECONDITION (exchange-failed: the token endpoint gave no token)
    └── BackendRejected
        ├── BackendSecretUnset (a header-auth backend's secret unset: counted as its 401 would be)
        └── ExchangeRefused    PERMISSION_DENIED (exchange-refused: it refused the caller's token)
StateUnavailable           UNAVAILABLE (indexer.state: the shared state, Redis, cannot be reached)
EmbedderError              (indexer.embedder: the model cannot be loaded or run)

A call without the link's shared secret never reaches the servicer: the transport's boundary,
`indexer/api/access.py`, refuses it with UNAUTHENTICATED, the only status code chosen outside
`indexer/api/status_codes.py`.
"""

from __future__ import annotations

from collections.abc import Sequence


class IndexerError(Exception):
    """Raised when the indexer cannot answer a request; the base of every indexer error."""


class SessionNotFound(IndexerError):
    """Raised when a session id is unknown, ended, or bound to another principal."""

    def __init__(self, session_id: str) -> None:
        # only a prefix: the id is a bearer capability and must not land whole in logs
        super().__init__(f"session not found: {session_id[:8]}...")


class ToolNotFound(IndexerError):
    """Raised when a tool name is not in the session's current index version.

    `suggestions` are close names the version does hold, as (name, backend id, server title);
    `reason` says why a name that exists cannot be called now (its backend is down).
    """

    def __init__(self, name: str, suggestions: Sequence[tuple[str, str, str]] = (), reason: str = "") -> None:
        super().__init__(f"tool not found: {name}")
        self.name = name
        self.suggestions = tuple(suggestions)
        self.reason = reason


class CallDenied(ToolNotFound):
    """A call of a tool the authorization policy denies its caller: it answers exactly as an unknown
    tool does (suggestions from what the caller may use). `policies` name what decided (the forbids;
    none when no policy permits it), for the router's log and metrics, never for the client."""

    def __init__(
        self, name: str, suggestions: Sequence[tuple[str, str, str]] = (), policies: Sequence[str] = ()
    ) -> None:
        super().__init__(name, suggestions)
        self.policies = tuple(policies)


class ItemDenied(IndexerError):
    """A prompt get or resource read the authorization policy denies its caller; `policies` as for
    `CallDenied`. The router answers it as it answers an item no backend has."""

    def __init__(self, kind: str, name: str, policies: Sequence[str] = ()) -> None:
        super().__init__(f"{kind} not found: {name}")
        self.policies = tuple(policies)


class InvalidRequest(IndexerError):
    """Raised when a request breaks a limit or has a malformed field; the message says which."""


class NoCallerToken(InvalidRequest):
    """Raised when a passthrough backend is listed for a caller who sent no bearer token."""


class TooManySessions(IndexerError):
    """Raised when a principal already holds as many sessions as the configuration allows.

    `retry_after` is how many seconds until room frees up by itself (its least recently used
    session expires); closing a session frees it at once.
    """

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionsFull(TooManySessions):
    """Raised when the indexer holds as many sessions, over every principal, as it may."""


class NotReady(IndexerError):
    """Raised when a request arrives before the indexer has loaded its model and catalogs."""


class BackendError(IndexerError):
    """Raised when a backend cannot be listed; the session or probe leaves it out."""

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(f"backend {backend_id}: {reason}")
        self.backend_id = backend_id
        self.reason = reason


class BackendUnavailable(BackendError):
    """Raised when a backend refuses the connection, times out, or answers with an error."""


class BackendRejected(BackendError):
    """Raised when a backend answers 401 or 403 to the credentials it was given."""

    def __init__(self, backend_id: str, status: int, reason: str = "") -> None:
        super().__init__(backend_id, reason or f"rejected the credentials (HTTP {status})")
        self.status = status


class BackendSecretUnset(BackendRejected):
    """Raised before a header-auth backend is asked, when the indexer has no value for its secret.

    Sent without its header, the request would only meet the backend's 401; this says which
    environment variable to set, and the backend is judged as that 401 would have it judged
    (unauthenticated).
    """

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(backend_id, 401, reason)


class ExchangeFailed(BackendUnavailable):
    """Raised when a token endpoint gives no token for a reason that is not the caller's.

    It did not answer in time, its certificate does not verify, it answered something other than a
    token, or it refused our own client (`invalid_client`, a client secret unset): like a backend
    that is down, this never ends a session nor leaves a backend out of one.
    """


class ExchangeRefused(BackendRejected):
    """Raised when a token endpoint refuses to exchange the caller's token.

    `status` 401 when it refused the token itself (`invalid_grant`, `invalid_request`,
    `invalid_token`), as a backend's 401 would: the stored credentials' rules apply (a relisting
    ends an authenticated session); 403 when it refused this caller the backend (`invalid_target`,
    `invalid_scope`, `access_denied`), as a backend's 403 would.
    """
