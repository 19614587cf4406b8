"""Log set-up shared by the router and the indexer: text for people, one JSON object per line for machines.

Two context variables carry what a log line is about: the request id (one per HTTP request to the
router, passed on to the indexer in gRPC metadata) and the session id. A session id is a capability,
so only its first `SESSION_PREFIX` characters are ever kept here; tokens are never put in a log.

    configure_logging("info", "json")
    with bound(request="3f2a9c1e"):
        bind_session(session_id)
        logger.info("...")  # {"time": ..., "request_id": "3f2a9c1e", "session_id": "AbCdEfGh", ...}

A record may carry more fields for machines as `extra={"fields": {...}}` (the router's access line
does): a JSON line holds them as keys of its own; a text line has them in its message already.
Below debug, the HTTP and MCP libraries keep their INFO lines to themselves (`QUIET_LIBRARIES`): one
`HTTP Request: POST ...` line per health probe and backend call drowns what the services say.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SESSION_PREFIX = 8
REQUEST_ID_HEADER = "x-request-id"
# A client-chosen request id is kept only when it cannot forge or break a log line.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# loggers that say INFO for every request they make or serve; warnings still come through
QUIET_LIBRARIES = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp", "mcp_types", "sse_starlette")

_request_id: ContextVar[str] = ContextVar("toolsearch_request_id", default="")
_session: ContextVar[str] = ContextVar("toolsearch_session", default="")


def clean_request_id(value: str | None) -> str:
    """`value` when it is a safe request id (letters, digits, `._:-`, at most 64), else empty."""
    return value if value and _REQUEST_ID.match(value) else ""


def bind_request(request_id: str) -> None:
    """Set the current request id (an unsafe value is dropped)."""
    _request_id.set(clean_request_id(request_id))


def bind_session(session_id: str) -> None:
    """Set the current session; only the id's first `SESSION_PREFIX` characters are kept."""
    _session.set(session_id[:SESSION_PREFIX])


def current_request_id() -> str:
    return _request_id.get()


def current_session() -> str:
    """The kept prefix of the current session id, or empty."""
    return _session.get()


@contextlib.contextmanager
def bound(request: str = "", session: str = "") -> Iterator[None]:
    """Bind a request id and a session for the duration of a block, then restore the previous ones."""
    request_token = _request_id.set(clean_request_id(request))
    session_token = _session.set(session[:SESSION_PREFIX])
    try:
        yield
    finally:
        _session.reset(session_token)
        _request_id.reset(request_token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the request and session if bound."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if request_id := _request_id.get():
            entry["request_id"] = request_id
        if session := _session.get():
            entry["session_id"] = session
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update((key, value) for key, value in fields.items() if key not in entry)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _utc(created: float) -> str:
    """ISO 8601 in UTC with milliseconds, e.g. 2026-01-31T12:00:00.123Z."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure_logging(level: str, log_format: str) -> None:
    """Send every log record to stderr as text or JSON lines, at `level` and above (replaces handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    # the handler's level too: a library that sets its own logger to DEBUG (bm25s does, on import)
    # must not reach the output below `level`
    handler.setLevel(level.upper())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.getLevelName(level.upper()) > logging.DEBUG
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
