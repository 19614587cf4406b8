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

The SDK's client logs a traceback when a backend answers something it cannot read (truncated JSON,
an HTML page: `Error parsing JSON response`), then hands the same error to the caller, which says in
its own words what the backend did (a failed call, a backend's change of health). So the SDK
client's errors and records that carry an exception (`SDK_CLIENT_LOGGERS`) become one debug line,
the exception's type and message in it, never a traceback: a backend's bad answer is told once, in
the service's words, not at every probe in the library's.
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
# the SDK's client side: its errors are a backend's answers, which the services report themselves
SDK_CLIENT_LOGGERS = ("mcp.client",)

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


class BackendTracebacks(logging.Filter):
    """Turns an SDK client's error or record with an exception into one debug line, no traceback."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level  # the handler's: a record made debug here must still clear it

    def filter(self, record: logging.LogRecord) -> bool:
        exc_info = record.exc_info
        if not record.name.startswith(SDK_CLIENT_LOGGERS) or not (
            exc_info or record.levelno >= logging.ERROR
        ):
            return True
        error = exc_info[1] if exc_info else None
        record.msg = record.getMessage() + (f": {type(error).__name__}: {error}" if error else "")
        record.args = None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.level <= logging.DEBUG


def configure_logging(level: str, log_format: str) -> None:
    """Send every log record to stderr as text or JSON lines, at `level` and above (replaces handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    # the handler's level too: a library that sets its own logger to DEBUG (bm25s does, on import)
    # must not reach the output below `level`
    handler.setLevel(level.upper())
    handler.addFilter(BackendTracebacks(handler.level))
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.getLevelName(level.upper()) > logging.DEBUG
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
