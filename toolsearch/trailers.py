"""What an indexer error carries to the router beside its gRPC status: the keys, and the kinds.

The indexer's servicer (indexer/api/service.py) turns each of its errors into a status code and
these trailers; the router's indexer link (router/link/) reads them back into router errors and
decides from the kind whether a failed call may go to another replica. Both sides name the keys and
kinds from here, so neither can drift from the other.

Plain metadata, not gRPC's rich status details (`google.rpc.ErrorInfo`, `RetryInfo`): routers and
indexers are upgraded apart, and a router of one release must read the errors of the next. A change
of the wire would need both kinds of trailer for a release; these keys have stayed as they are.
"""

from __future__ import annotations

from enum import StrEnum

ERROR_KEY = "toolsearch-error"  # the error's kind (`ErrorKind`)
RETRY_AFTER_KEY = "toolsearch-retry-after"  # whole seconds until a session cap has room again
SUGGESTIONS_KEY = "toolsearch-suggestions-bin"  # a tool-not-found's close names (pb.ToolSuggestions)
# the policies that denied a call (comma-separated labels; "-" when no policy permits it): for the
# router's access log and metrics, never shown to the client
DENIED_BY_KEY = "toolsearch-denied-by"
NO_PERMIT = "-"


class ErrorKind(StrEnum):
    """The indexer's own name for what went wrong, finer than the status code."""

    SESSION_NOT_FOUND = "session-not-found"
    TOOL_NOT_FOUND = "tool-not-found"
    ITEM_NOT_FOUND = "item-not-found"  # a prompt or resource the policy denies the caller
    INVALID_REQUEST = "invalid-request"
    SESSIONS_FULL = "sessions-full"  # the cap on every session
    TOO_MANY_SESSIONS = "too-many-sessions"  # the principal's own cap
    NOT_READY = "not-ready"  # refused before any work was started: another replica may take it
    STATE_UNAVAILABLE = "state-unavailable"
    EXCHANGE_FAILED = "exchange-failed"  # a token endpoint gave no token for a backend
    EXCHANGE_REFUSED = "exchange-refused"  # a token endpoint refused the caller's token
    INTERNAL = "internal"
