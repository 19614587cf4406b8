"""Structured logs: one JSON object per line, with the bound request id and only a session id's prefix."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from toolsearch.logs import (
    JsonFormatter,
    bind_session,
    bound,
    clean_request_id,
    configure_logging,
    current_request_id,
    current_session,
)

SESSION_ID = "s3cr3t-session-id-that-is-a-capability"


def record(message: str = "hello %s", *args: object) -> logging.LogRecord:
    return logging.LogRecord("router.test", logging.WARNING, __file__, 1, message, args or ("world",), None)


def test_a_record_is_one_json_object_with_the_standard_fields() -> None:
    line = JsonFormatter().format(record())
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "warning" and entry["logger"] == "router.test"
    assert entry["message"] == "hello world"
    assert entry["time"].endswith("Z") and "T" in entry["time"]
    assert "request_id" not in entry and "session_id" not in entry


def test_the_bound_request_and_session_prefix_are_added_then_restored() -> None:
    with bound(request="req-1", session=SESSION_ID):
        entry = json.loads(JsonFormatter().format(record()))
    assert entry["request_id"] == "req-1"
    assert entry["session_id"] == SESSION_ID[:8]
    assert current_request_id() == "" and current_session() == ""


def test_binding_a_session_keeps_only_its_prefix() -> None:
    with bound(request="req-2"):
        bind_session(SESSION_ID)
        assert current_session() == SESSION_ID[:8]
        assert SESSION_ID not in JsonFormatter().format(record("%s", SESSION_ID[:8]))
    assert current_session() == ""


@pytest.mark.parametrize("value", ["", "a b", "x\ny", '{"forged": 1}', "é", "a" * 65, None])
def test_an_unsafe_request_id_is_dropped(value: str | None) -> None:
    assert clean_request_id(value) == ""


def test_a_safe_request_id_is_kept() -> None:
    assert clean_request_id("deploy-7.check:1_a") == "deploy-7.check:1_a"


def test_an_exception_is_one_field_of_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        failing = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(failing)
    assert line.count("\n") == 0
    assert "ValueError: boom" in json.loads(line)["exception"]


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_restored")
def test_configure_logging_switches_the_root_handler_format(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "json")
    logging.getLogger("indexer.test").debug("not shown")
    logging.getLogger("indexer.test").info("shown")
    configure_logging("info", "text")
    logging.getLogger("indexer.test").info("as text")
    first, second = stream.getvalue().splitlines()
    assert json.loads(first)["message"] == "shown"
    assert second.endswith("INFO indexer.test: as text")


@pytest.mark.usefixtures("root_restored")
def test_http_and_mcp_library_info_lines_are_dropped_below_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "text")
    logging.getLogger("httpx2").info('HTTP Request: POST http://b/mcp "HTTP/1.1 200 OK"')
    logging.getLogger("mcp.server.lowlevel.server").info("Processing request of type CallToolRequest")
    logging.getLogger("httpx2").warning("a warning still shows")
    configure_logging("debug", "text")
    logging.getLogger("httpx2").info("at debug, the library speaks")
    shown = stream.getvalue()
    assert "HTTP Request" not in shown and "Processing request" not in shown
    assert "a warning still shows" in shown and "at debug, the library speaks" in shown
    configure_logging("info", "text")  # leaves the libraries as the other tests expect them


def test_a_records_fields_become_keys_of_its_json_line_without_replacing_the_standard_ones() -> None:
    entry = record("mcp %s tools/call", "POST")
    entry.fields = {"tool": "find_tool", "ms": 1.5, "level": "forged"}
    line = json.loads(JsonFormatter().format(entry))
    assert line["tool"] == "find_tool" and line["ms"] == 1.5
    assert line["level"] == "warning"


@pytest.mark.usefixtures("root_restored")
def test_a_library_that_sets_its_own_logger_to_debug_stays_quiet_at_info(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "text")
    eager = logging.getLogger("eager.library")
    eager.setLevel(logging.DEBUG)  # as bm25s does when it is imported
    try:
        eager.debug("Building index from tokens")
        eager.info("said at info")
    finally:
        eager.setLevel(logging.NOTSET)
    assert "Building index" not in stream.getvalue() and "said at info" in stream.getvalue()


def _sdk_parse_error() -> None:
    """What the SDK's client logs when a backend answers truncated JSON: an error with a traceback."""
    try:
        json.loads('{"jsonrpc": "2.0", "result": {"tools": [')
    except ValueError:
        logging.getLogger("mcp.client.streamable_http").exception("Error parsing JSON response")
    logging.getLogger("mcp.client.streamable_http").error("Unexpected content type: text/html")


@pytest.mark.usefixtures("root_restored")
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_sdk_clients_errors_about_a_backends_answer_are_a_debug_line_without_traceback(
    monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", log_format)
    _sdk_parse_error()
    logging.getLogger("mcp.client.streamable_http").warning("a warning still shows")
    assert "Error parsing" not in stream.getvalue() and "a warning still shows" in stream.getvalue()
    configure_logging("debug", log_format)
    start = len(stream.getvalue())
    _sdk_parse_error()
    shown = stream.getvalue()[start:]
    assert "Traceback" not in shown and "exception" not in shown and len(shown.splitlines()) == 2
    assert "DEBUG" in shown.upper() and "Error parsing JSON response: JSONDecodeError: Expecting" in shown
    configure_logging("info", "text")  # leaves the libraries as the other tests expect them


@pytest.mark.usefixtures("root_restored")
def test_the_services_own_tracebacks_are_not_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "text")
    try:
        raise RuntimeError("a bug of ours")
    except RuntimeError:
        logging.getLogger("indexer.upkeep.health").exception("health probe of a failed unexpectedly")
    assert "Traceback" in stream.getvalue() and "RuntimeError: a bug of ours" in stream.getvalue()
