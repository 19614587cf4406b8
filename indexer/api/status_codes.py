"""Indexer errors become gRPC status codes here, and nowhere else: the servicer's one translator.

An error of the indexer's tree (indexer/errors.py) or the state's `StateUnavailable` becomes its
status code, with the error's kind in the trailers (`toolsearch/trailers.py`) so that the router
can tell "session not found" from "tool not found" without reading the message; a refused session
open carries when to try again, an unknown tool the names that come close. Anything else is logged
here with its traceback and reaches the router as INTERNAL without details.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from indexer.api.messages import suggestions
from indexer.errors import (
    CallDenied,
    ExchangeFailed,
    ExchangeRefused,
    IndexerError,
    InvalidRequest,
    ItemDenied,
    NotReady,
    SessionNotFound,
    SessionsFull,
    ToolNotFound,
    TooManySessions,
)
from indexer.state import StateUnavailable
from toolsearch.trailers import (
    DENIED_BY_KEY,
    ERROR_KEY,
    NO_PERMIT,
    RETRY_AFTER_KEY,
    SUGGESTIONS_KEY,
    ErrorKind,
)

logger = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

_STATUS: dict[type, tuple[grpc.StatusCode, ErrorKind]] = {
    SessionNotFound: (grpc.StatusCode.NOT_FOUND, ErrorKind.SESSION_NOT_FOUND),
    ToolNotFound: (grpc.StatusCode.NOT_FOUND, ErrorKind.TOOL_NOT_FOUND),
    ItemDenied: (grpc.StatusCode.NOT_FOUND, ErrorKind.ITEM_NOT_FOUND),
    InvalidRequest: (grpc.StatusCode.INVALID_ARGUMENT, ErrorKind.INVALID_REQUEST),
    SessionsFull: (grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorKind.SESSIONS_FULL),
    TooManySessions: (grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorKind.TOO_MANY_SESSIONS),
    NotReady: (grpc.StatusCode.UNAVAILABLE, ErrorKind.NOT_READY),
    StateUnavailable: (grpc.StatusCode.UNAVAILABLE, ErrorKind.STATE_UNAVAILABLE),
    # not UNAVAILABLE: another replica would only meet the same endpoint, after the same wait
    ExchangeFailed: (grpc.StatusCode.FAILED_PRECONDITION, ErrorKind.EXCHANGE_FAILED),
    ExchangeRefused: (grpc.StatusCode.PERMISSION_DENIED, ErrorKind.EXCHANGE_REFUSED),
}


def _status_for(exc: IndexerError | StateUnavailable) -> tuple[grpc.StatusCode, ErrorKind]:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL, ErrorKind.INTERNAL


def with_status_codes(
    method: Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]],
) -> Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]:
    """Turn indexer errors into status codes, and anything unexpected into INTERNAL without details."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: _Req, context: grpc.aio.ServicerContext) -> _Resp:
        try:
            return await method(self, request, context)
        except (IndexerError, StateUnavailable) as exc:
            code, kind = _status_for(exc)
            trailers = [(ERROR_KEY, kind.value)]
            if isinstance(exc, TooManySessions):
                trailers.append((RETRY_AFTER_KEY, str(exc.retry_after)))  # seconds
            if isinstance(exc, ToolNotFound):
                trailers.append((SUGGESTIONS_KEY, suggestions(exc).SerializeToString()))  # type: ignore[arg-type]
            if isinstance(exc, CallDenied | ItemDenied):
                trailers.append((DENIED_BY_KEY, ",".join(exc.policies) or NO_PERMIT))
            context.set_trailing_metadata(tuple(trailers))
            await context.abort(code, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception:
            logger.exception("%s failed", method.__name__)
            context.set_trailing_metadata(((ERROR_KEY, ErrorKind.INTERNAL.value),))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the indexer (logged)")
        raise AssertionError("unreachable: abort raises")

    return wrapper
