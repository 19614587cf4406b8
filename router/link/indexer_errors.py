"""gRPC failures of indexer calls read into router errors: here and nowhere else.

A status code says most of it; the trailers say the rest (toolsearch/trailers.py): which kind of
NOT_FOUND or RESOURCE_EXHAUSTED it is, how long to wait before retrying, and the close names the
indexer suggests for a tool the session does not hold.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf.message import DecodeError

from router.errors import (
    ExchangeFailed,
    ExchangeRefused,
    IndexerFailed,
    IndexerUnavailable,
    InvalidRequest,
    ItemDenied,
    RouterError,
    SessionNotFound,
    SessionsFull,
    ToolNotFound,
    TooManySessions,
)
from router.link.failover import error_kind
from toolsearch.trailers import DENIED_BY_KEY, RETRY_AFTER_KEY, SUGGESTIONS_KEY, ErrorKind
from toolsearch.v1 import indexer_pb2 as pb

logger = logging.getLogger(__name__)

# how an unreachable, too slow or cancelled call ends: the indexer is away, not the request wrong
UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
UNAVAILABLE_MESSAGE = "indexer unavailable, retry shortly"


def _retry_after(exc: grpc.aio.AioRpcError) -> int:
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY and str(value).isdigit():
            return max(1, int(value))
    return 1


def _tool_not_found(exc: grpc.aio.AioRpcError, tool_name: str) -> ToolNotFound:
    """A tool-not-found with the close names and the reason the indexer sent beside it, if any."""
    detail = pb.ToolSuggestions()
    for key, value in exc.trailing_metadata() or ():
        if key == SUGGESTIONS_KEY and isinstance(value, bytes):
            try:
                detail.ParseFromString(value)
            except DecodeError:
                logger.warning("the indexer sent suggestions that do not parse; ignored")
    suggestions = tuple((s.name, s.backend_id, s.server_title) for s in detail.suggestions)
    return ToolNotFound(tool_name, suggestions, detail.reason, _denied_by(exc))


def _not_found(exc: grpc.aio.AioRpcError, asked: str) -> RouterError:
    """What a NOT_FOUND is: a tool (unknown, or denied), a denied prompt or resource, or the session."""
    kind = error_kind(exc)
    if kind == ErrorKind.TOOL_NOT_FOUND:
        return _tool_not_found(exc, asked)
    if kind == ErrorKind.ITEM_NOT_FOUND:
        return ItemDenied(asked, _denied_by(exc))
    return SessionNotFound()


def _denied_by(exc: grpc.aio.AioRpcError) -> tuple[str, ...]:
    """The policies that denied a call, when the policy did (empty for a name that means nothing)."""
    for key, value in exc.trailing_metadata() or ():
        if key == DENIED_BY_KEY and isinstance(value, str):
            return tuple(value.split(","))
    return ()


def _exchange_error(kind: str, details: str, backend_id: str) -> RouterError | None:
    """A failed token exchange as the router's error, the indexer's reason kept (no token in it)."""
    reason = details.removeprefix(f"backend {backend_id}: ")
    if kind == ErrorKind.EXCHANGE_REFUSED:
        return ExchangeRefused(backend_id, reason)
    if kind == ErrorKind.EXCHANGE_FAILED:
        return ExchangeFailed(backend_id, reason)
    return None


def translate(exc: grpc.aio.AioRpcError, asked: str = "") -> RouterError:
    """The router error for a failed indexer call; `asked` names what the call asked for: the tool
    of a ResolveTool, the backend an ExchangeToken asked a token for."""
    code = exc.code()
    details = exc.details() or code.name
    if (exchange := _exchange_error(error_kind(exc), details, asked)) is not None:
        return exchange
    if code in UNAVAILABLE_CODES:
        return IndexerUnavailable(UNAVAILABLE_MESSAGE)
    if code == grpc.StatusCode.NOT_FOUND:
        return _not_found(exc, asked)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if error_kind(exc) == ErrorKind.SESSIONS_FULL:
            return SessionsFull(details, _retry_after(exc))
        return TooManySessions(details, _retry_after(exc))
    return IndexerFailed(f"indexer error ({code.name})")
